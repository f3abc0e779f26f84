"""kvarena's stand-ins for the sgl_kernel CPU ops and the Triton kernels
SGLang's CPU engine cannot run (``kvarena.sglang.cpu_ops``), each against a
reference that shares no code with it: a plain loop over requests, and
torch's own ``conv1d`` one sequence at a time."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from kvarena.sglang import cpu_ops

SEEDS = range(6)


def _rng(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_assign_req_to_token_pool_writes_each_requests_slice(seed):
    g = _rng(seed)
    rows, width, n = 6, 40, int(torch.randint(1, 6, (1,), generator=g))
    table = torch.randint(0, 99, (rows, width), generator=g, dtype=torch.int32)
    pool = torch.randperm(rows, generator=g)[:n]
    start = torch.randint(0, 20, (n,), generator=g)
    end = start + torch.randint(0, 20, (n,), generator=g)
    ids = torch.randint(1, 1000, (int((end - start).sum()),), generator=g)
    want, o = table.clone(), 0
    for r, s, e in zip(pool.tolist(), start.tolist(), end.tolist()):
        want[r, s:e] = ids[o : o + e - s].to(torch.int32)
        o += e - s
    cpu_ops.assign_req_to_token_pool_cpu(pool, table, start, end, ids, width)
    assert torch.equal(table, want)


def _conv_reference(x, weight, bias, init, activation):
    """One sequence: torch's conv1d over [init | x]; and the new state."""
    keep = weight.shape[1] - 1
    full = torch.cat([init, x], dim=1)
    if x.shape[1] == 0:  # an empty sequence keeps the state it started from
        return x.clone(), init.clone()
    y = F.conv1d(full[None], weight[:, None, :], bias, groups=x.shape[0])[0]
    return (F.silu(y) if activation else y), full[:, full.shape[1] - keep :]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_causal_conv1d_fn_is_conv1d_per_sequence(seed, activation):
    g = _rng(seed)
    dim, width, slots = 5, int(torch.randint(2, 5, (1,), generator=g)), 8
    lens = torch.randint(0, 7, (4,), generator=g)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])
    x = torch.randn(dim, int(qsl[-1]), generator=g)
    weight, bias = torch.randn(dim, width, generator=g), torch.randn(dim, generator=g)
    states = torch.randn(slots, dim, width - 1, generator=g)
    cache = torch.randperm(slots, generator=g)[:4]
    cache[1] = -1  # a padded entry: no output, its state untouched
    has = torch.tensor([True, True, False, True])
    want_states, want = states.clone(), torch.zeros_like(x)
    for i in range(4):
        s, e, slot = int(qsl[i]), int(qsl[i + 1]), int(cache[i])
        if slot == -1:
            continue
        init = states[slot] if has[i] else torch.zeros(dim, width - 1)
        want[:, s:e], want_states[slot] = _conv_reference(x[:, s:e], weight, bias, init, activation)
    got = cpu_ops.causal_conv1d_fn(x, weight, bias, qsl, cache, has, states, activation, -1)
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(states, want_states, atol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tokens", [1, 3])
def test_causal_conv1d_update_rolls_each_window(seed, tokens):
    g = _rng(seed)
    dim, width, slots, batch = 6, 4, 7, 3
    states = torch.randn(slots, dim, width - 1, generator=g)
    x = torch.randn(batch, dim, tokens, generator=g)
    weight, bias = torch.randn(dim, width, generator=g), torch.randn(dim, generator=g)
    idx = torch.tensor([4, -1, 2])
    want_states, want = states.clone(), torch.zeros_like(x)
    for i, slot in enumerate(idx.tolist()):
        if slot != -1:
            want[i], want_states[slot] = _conv_reference(x[i], weight, bias, states[slot], "silu")
    got = cpu_ops.causal_conv1d_update(x if tokens > 1 else x[..., 0], states, weight, bias, "silu", None, idx)
    assert torch.allclose(got.reshape(want.shape), want, atol=1e-5) and torch.allclose(states, want_states)


def test_an_op_with_no_standin_names_itself():
    mod = cpu_ops.module()
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.fused_experts_cpu"):
        mod.fused_experts_cpu(torch.zeros(1))
    with pytest.raises(NotImplementedError, match=r"sgl_kernel\.mamba\.causal_conv1d_update_cpu"):
        cpu_ops.module("sgl_kernel.mamba").causal_conv1d_update_cpu(torch.zeros(1))
    with pytest.raises(NotImplementedError, match="circular-buffer"):
        cpu_ops.causal_conv1d_update(
            torch.zeros(1, 2), torch.zeros(1, 2, 3), torch.zeros(2, 4), cache_seqlens=torch.zeros(1)
        )


def test_the_boot_folder_puts_the_standins_in_a_fresh_interpreter():
    """What every engine process on CPU gets at start (``cpu_environment``):
    ``import sgl_kernel`` answers with the stand-ins, and SGLang's conv
    module's functions are the stand-ins by the time a model imports them."""
    from kvarena.sglang import engine

    code = (
        "import sgl_kernel, kvarena.sglang.cpu_ops as c\n"
        "from sgl_kernel.mamba import causal_conv1d_update_cpu\n"
        "from kvarena.anchor.loader import sglang_imports\n"
        "with sglang_imports():\n"
        "    from sglang.srt.layers.attention.mamba.causal_conv1d import causal_conv1d_fn\n"
        "assert sgl_kernel.assign_req_to_token_pool_cpu is c.assign_req_to_token_pool_cpu\n"
        "assert causal_conv1d_fn is c.causal_conv1d_fn\n"
        "import torch, pytest\n"
        "with pytest.raises(NotImplementedError, match='torch.ops.sgl_kernel.fused_gdn_gating_cpu'):\n"
        "    torch.ops.sgl_kernel.fused_gdn_gating_cpu(*[torch.zeros(1)] * 4)\n"
        "print('ok')\n"
    )
    from kvarena.anchor import loader

    loader.ensure_installed(True)
    out = subprocess.run([sys.executable, "-c", code], env=engine.cpu_environment(), capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-3000:]
