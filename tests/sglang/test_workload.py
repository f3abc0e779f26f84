"""The byte-checked workload on SGLang's three stacks: kvarena's allocator
(installed into SGLang's factories) and SGLang's own, side by side.  Every
live token's K and V in every layer, and every live state slot, read back
intact after every step; kvarena's relief relocates pages in every band."""

import pytest
import torch

from kvarena import sglang as ks
from kvarena.sglang import allocators, dropin, stacks, surface, views, workload

CASES = [(kind, ps, lazy) for kind in stacks.KINDS for ps in (1, 4) for lazy in (True, False)]


@pytest.mark.parametrize("kind, ps, lazy", CASES)
def test_kvarena_keeps_every_byte_and_relocates_in_every_band(kind, ps, lazy):
    ks.install()
    r = workload.run(kind, steps=80, page_size=ps, lazy=lazy, seed=1)
    assert r.ok, r.errors[:3]
    assert r.refused > 0 and r.shared_tokens > 0  # the buffer ran full, and prefixes were shared
    assert r.tokens_checked > 1000
    assert (r.slots_checked > 0) == (kind != "swa")
    assert (r.swa_pages_freed > 0) == (kind != "mamba")
    assert all(moved > 0 for moved in r.pages_moved.values()), r.pages_moved  # relief moved pages in every band


@pytest.mark.parametrize("kind, ps", [(kind, ps) for kind in stacks.KINDS for ps in (1, 4)])
def test_sglang_runs_the_same_workload(kind, ps):
    """The workload is SGLang's contract: SGLang's own allocator passes it too."""
    with stacks.cpu_kernels():
        r = workload.run(kind, steps=60, page_size=ps, lazy=True, seed=1)
    assert r.ok, r.errors[:3]
    assert r.pages_moved == {}  # SGLang's allocator: no kvarena counters


EXTRA_CASES = [(kind, ps, lazy) for kind in ("mamba", "mamba_swa") for ps in (1, 4) for lazy in (True, False)]


@pytest.mark.parametrize("kind, ps, lazy", EXTRA_CASES)
def test_the_mamba_stacks_with_the_extra_buffer(kind, ps, lazy):
    """SGLang's mamba extra buffer (its "auto" strategy's choice for
    Qwen3-Next): each request also holds its tracking slots; every byte and
    every slot still reads back, relief relocating in every band (issue 40)."""
    ks.install()
    w = workload.Workload(kind, stacks.Geometry(), ps, lazy, seed=1, extra_buffer=True)
    for _ in range(60):
        w.step()
    assert w.report.ok, w.report.errors[:3]
    assert w.report.refused > 0 and w.report.tokens_checked > 1000
    held = [r for r in w.live.values() if r.slot is not None]
    assert held and w.tracking == 1 and all(len(r.track) == 1 for r in held)  # the tracking slots are held
    assert all(moved > 0 for moved in w.alloc.pages_moved.values()), w.alloc.pages_moved


@pytest.mark.parametrize("kind", ("mamba", "mamba_swa"))
def test_sglang_runs_the_workload_with_the_extra_buffer(kind):
    with stacks.cpu_kernels():
        r = workload.run(kind, steps=60, page_size=4, lazy=True, seed=1, extra_buffer=True)
    assert r.ok, r.errors[:3]


def test_the_byte_check_catches_a_lost_move(monkeypatch):
    """Planted: the mover updates kvarena's tables but copies no byte."""
    monkeypatch.setattr(dropin._Dropin, "_move_pages", lambda self, name, dst, src: None)
    ks.install()
    r = workload.run("mamba_swa", steps=80, page_size=1, lazy=False, seed=1)
    assert not r.ok and "corrupted" in r.errors[0]


def test_the_byte_check_catches_a_wrong_translation(monkeypatch):
    """Planted: SWA translations drop the offset within the page (every token
    of a page lands on its first slot)."""
    real = views.BandView.translate_kv_loc

    def off(self, loc, *, out=None):
        res = real(self, loc, out=out)
        return res // self.page_size * self.page_size if self._name == "swa" else res

    monkeypatch.setattr(views.BandView, "translate_kv_loc", off)
    ks.install()
    r = workload.run("swa", steps=10, page_size=4, seed=1)
    assert not r.ok


RETRACT_CASES = [(kind, ps, overlap) for kind in stacks.KINDS for ps in (1, 4, 16) for overlap in (True, False)]


@pytest.mark.parametrize("kind, ps, overlap", RETRACT_CASES)
def test_retraction_to_host_brings_every_byte_back(kind, ps, overlap):
    """Retraction to host (issue 43): requests copied to the host by
    ``get_cpu_copy`` (with overlap, while their forward is in flight),
    freed, resumed on fresh pages by ``load_cpu_copy``; every byte compared."""
    ks.install()
    r = workload.run(kind, steps=60, page_size=ps, lazy=ps != 4, seed=2, overlap=overlap, retract=True)
    assert r.ok, r.errors[:3]
    assert r.retracted >= 10 and r.restored == r.retracted and r.restored_tokens > 4 * r.retracted
    assert all(moved > 0 for moved in r.pages_moved.values()), r.pages_moved


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_a_host_copy_that_does_not_wait_for_the_forward_is_caught(kind, monkeypatch):
    """Planted: ``get_cpu_copy`` copies before the forward in flight wrote
    the request's last token (and state)."""
    monkeypatch.setattr(dropin._Dropin, "_settle_for_host_copy", lambda self: None)
    ks.install()
    r = workload.run(kind, steps=40, page_size=4, seed=2, overlap=True, retract=True)
    assert any("resumed request" in e for e in r.errors), r.errors[:3]


def test_a_state_backup_at_the_virtual_slot_is_caught(monkeypatch):
    """Planted: the tri-pool's backup reads the state at the virtual slot id
    as a row, as SGLang's ``Req.offload_kv_cache`` has its pool do."""
    monkeypatch.setattr(allocators.UnifiedMambaSWATokenToKVPoolAllocator, "_state_rows", lambda self, s: s.reshape(-1))
    ks.install()
    r = workload.run("mamba_swa", steps=60, page_size=1, seed=2, retract=True)
    assert any("mamba state lost bytes" in e for e in r.errors), r.errors[:3]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("kind", stacks.KINDS)
@pytest.mark.parametrize("installed", [True, False])
def test_the_workload_on_cuda(kind, installed):
    """On a GPU: kvarena's allocator, and SGLang's with its own Triton kernels."""
    if installed:
        ks.install()
    r = workload.run(kind, steps=60, page_size=4, lazy=True, seed=1, device="cuda")
    assert r.ok, r.errors[:3]


def _check(capsys) -> tuple[int, str]:
    import argparse

    from kvarena.sglang import cli

    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    args = p.parse_args(
        ["check", "--steps", "4", "--overlap-steps", "0", "--extra-buffer-steps", "0", "--retract-steps", "12"]
        + ["--draft-steps", "8", "--hicache-steps", "0"]
        + ["--page-sizes", "4", "--no-install"]
    )
    rc = cli.run(args)
    return rc, capsys.readouterr().out


def test_sglang_check_has_retraction_and_draft_phases(capsys, monkeypatch):
    """``kvarena sglang check``'s retraction and draft phases pass on every
    stack, and the check fails with a backup that does not wait for the
    forward."""
    rc, out = _check(capsys)
    assert rc == 0 and "kvarena sglang check: ok" in out, out[-2000:]
    assert "retraction phase" in out and "draft phase" in out, out[-2000:]
    monkeypatch.setattr(dropin._Dropin, "_settle_for_host_copy", lambda self: None)
    rc, out = _check(capsys)
    assert rc == 1 and "FAIL retraction" in out, out[-2000:]


DRAFT_CASES = [(kind, ps, overlap) for kind in stacks.KINDS for ps in (1, 4, 16) for overlap in (True, False)]


@pytest.mark.parametrize("kind, ps, overlap", DRAFT_CASES)
def test_a_fused_draft_keeps_its_bytes_through_every_relocation(kind, ps, overlap):
    """Speculative decoding (issue 43): the stack built with a draft's K/V
    lanes fused into the full entries (SGLang's ``place_fused_draft``), the
    draft runner's pool bound by SGLang's ``bind_fused_draft`` over
    kvarena's allocator; the draft layer is written and read back with the
    target's after every step, relief relocating in every band."""
    ks.install()
    r = workload.run(kind, steps=60, page_size=ps, lazy=ps == 1, seed=3, overlap=overlap, draft=True)
    assert r.ok, r.errors[:3]
    assert r.tokens_checked > 1000 and r.pages_moved["full"] > 0, r.pages_moved  # the draft's host band moved


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_sglang_runs_the_draft_workload(kind):
    """The draft workload is SGLang's contract: its own allocator passes it too."""
    with stacks.cpu_kernels():
        r = workload.run(kind, steps=40, page_size=4, lazy=True, seed=3, draft=True)
    assert r.ok, r.errors[:3]


def test_the_draft_shares_the_targets_ids_and_tables():
    """One allocation serves both: the draft pool translates through the
    target's allocator, and ``draft_virtual_id_space`` is SGLang's (its draft
    worker sizes its pools to it)."""
    for kind in stacks.KINDS:
        placement = stacks.draft_placement(kind)
        sglang = stacks.build(kind, page_size=4, fused_draft=placement).token_to_kv_pool_allocator
        ks.install()
        w = workload.Workload(kind, stacks.Geometry(), 4, True, seed=0, draft=True)
        assert w.draft.host_allocator is w.alloc and w.alloc.draft_virtual_id_space == sglang.draft_virtual_id_space
        assert "draft_virtual_id_space" not in surface.UNSUPPORTED


def test_a_move_that_leaves_the_draft_lanes_behind_is_caught(monkeypatch):
    """Planted: relocation copies the target's parts of each entry and not
    the draft's (a per-layer move that knows only the target's layers)."""
    real = dropin._Dropin._move_pages

    def host_parts_only(self, name, dst, src):
        draft = getattr(self, "_planted_draft", None)
        rows = (dst.reshape(-1, 1) * self.page_size + torch.arange(self.page_size)).reshape(-1)
        kept = None if draft is None or name != "full" else [b[rows].clone() for b in draft]
        real(self, name, dst, src)
        if kept is not None:
            for b, k in zip(draft, kept):
                b[rows] = k

    monkeypatch.setattr(dropin._Dropin, "_move_pages", host_parts_only)
    ks.install()
    w = workload.Workload("swa", stacks.Geometry(), 4, False, seed=3, draft=True)
    w.alloc._planted_draft = [w.draft.get_key_buffer(0), w.draft.get_value_buffer(0)]
    for _ in range(60):
        w.step()
        if w.report.errors:
            break
    assert any("corrupted" in e for e in w.report.errors), w.report.errors[:3]
