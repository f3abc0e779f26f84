"""A serving workload over one of SGLang's unified-memory stacks, with every
byte checked.

Requests arrive with prompts that may share a live request's page-aligned
prefix (counted once, as the radix cache shares it), prefill in chunks,
decode together, free their sliding-window pages as the window passes (a
page is freed once no sharer still needs it), hold a mamba state slot where
the stack has one, and finish.  When an allocation comes back None the
oldest request finishes and the step is tried again, so the buffer stays
full and relief relocates pages in every band.

Each token's K and V are written into every layer of the KV pool's own
buffers at the location the allocator translates to, and each state slot's
conv and temporal state likewise; after every step every live token's data
(and every live slot's state) is read back through the same translations
and compared.  ``run`` returns what held.
"""

import random
from dataclasses import dataclass, field
from typing import Any

import torch

from .stacks import Geometry, build

I64 = torch.int64


@dataclass
class Request:
    rid: int
    target: int  # prompt length
    finish_at: int  # length at which it finishes
    tokens: list[int] = field(default_factory=list)  # virtual token ids, by position
    swa_from: int = 0  # positions below have no SWA entry left
    slot: int | None = None  # the mamba state slot (virtual)
    decoding: bool = False


@dataclass
class Report:
    kind: str
    page_size: int
    steps: int = 0
    admitted: int = 0
    finished: int = 0
    shared_tokens: int = 0
    refused: int = 0  # allocations that came back None (then the oldest request finished)
    swa_pages_freed: int = 0
    tokens_checked: int = 0
    slots_checked: int = 0
    pages_moved: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _value(ids: torch.Tensor, layer: int, part: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Distinct, exactly representable values per (id, layer, K or V): the id
    in base-1024 digits, then the layer and the part, then a ramp."""
    ids = ids.to(I64)
    cols = torch.arange(width, dtype=I64)
    v = torch.where(cols == 0, (ids % 1024).unsqueeze(1), 0)
    v = torch.where(cols == 1, (ids // 1024).unsqueeze(1), v)
    v = torch.where(cols == 2, torch.full_like(v, layer), v)
    v = torch.where(cols == 3, torch.full_like(v, part), v)
    v = torch.where(cols >= 4, (cols + 7 * layer + 3 * part + ids.unsqueeze(1)) % 512, v)
    return v.to(dtype)


class Workload:
    """One stack (built by SGLang's own factory) and the requests on it."""

    def __init__(
        self, kind: str, geometry: Geometry, page_size: int, lazy: bool, seed: int, device: str = "cpu"
    ) -> None:
        self.kind, self.g, self.ps, self.dev = kind, geometry, page_size, torch.device(device)
        self.bundle = build(kind, geometry, page_size=page_size, lazy=lazy, device=device)
        self.alloc = self.bundle.token_to_kv_pool_allocator
        self.kv = self.bundle.token_to_kv_pool
        self.slots: Any = getattr(getattr(self.bundle, "req_to_token_pool", None), "mamba_allocator", None)
        self.state: Any = self.bundle.req_to_token_pool.mamba_pool if self.slots is not None else None
        self.has_swa = kind != "mamba"
        self.rng = random.Random(seed)
        self.live: dict[int, Request] = {}
        self.refs: dict[int, int] = {}  # virtual page -> requests holding it
        self.next_rid = 0
        self.report = Report(kind, page_size)
        self.width = geometry.head_num * geometry.head_dim

    # -------------------------------------------------------- bytes

    def _layers(self) -> list[tuple[int, bool]]:
        out = [(layer, False) for layer in self.g.full_layers]
        if self.has_swa:
            out += [(layer, True) for layer in self.g.swa_layers]
        return out

    def _where(self, ids: torch.Tensor, swa: bool) -> torch.Tensor:
        if swa:
            return self.alloc.translate_loc_from_full_to_swa(ids)
        return self.alloc.translate_kv_loc(ids)

    def _t(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=I64, device=self.dev)

    def _write(self, ids: list[int]) -> None:
        if not ids:
            return
        t = self._t(ids)
        for layer, swa in self._layers():
            rows = self._where(t, swa)
            for part, buf in enumerate((self.kv.get_key_buffer(layer), self.kv.get_value_buffer(layer))):
                buf[rows] = _value(t, layer, part, self.width, buf.dtype).view(-1, *buf.shape[1:]).to(self.dev)

    def _state_values(self, slot: int, i: int, like: torch.Tensor) -> torch.Tensor:
        """Slot ``slot``'s values for its conv state ``i`` (``i = -1``: temporal)."""
        n = like.numel()
        base = slot * 3 if i < 0 else slot * 10 + i
        ramp = torch.arange(n, device=self.dev) % (89 if i < 0 else 97)
        return (base + ramp).view(like.shape).to(like.dtype)

    def _write_state(self, slot: int) -> None:
        phys = self.slots.translate(self._t([slot]))
        cache = self.state.mamba_cache
        for i, conv in enumerate(cache.conv):
            conv[:, phys] = self._state_values(slot, i, conv[:, phys])
        cache.temporal[:, phys] = self._state_values(slot, -1, cache.temporal[:, phys])

    def check(self) -> None:
        """Every live token's K/V in every layer, and every live slot's state."""
        full = [t for r in self.live.values() for t in r.tokens]
        swa = [t for r in self.live.values() for t in r.tokens[r.swa_from :]]
        for layer, in_swa in self._layers():
            ids = swa if in_swa else full
            if not ids:
                continue
            t = self._t(sorted(set(ids)))
            rows = self._where(t, in_swa)
            if bool((rows <= 0).any()):
                self.report.errors.append(
                    f"step {self.report.steps}: layer {layer}: a live token translates to the sink"
                )
            for part, buf in enumerate((self.kv.get_key_buffer(layer), self.kv.get_value_buffer(layer))):
                want = _value(t.cpu(), layer, part, self.width, buf.dtype).view(-1, *buf.shape[1:]).to(self.dev)
                bad = (buf[rows] != want).reshape(len(t), -1).any(dim=1)
                if bool(bad.any()):
                    first = int(t[bad][0])
                    kv = "KV"[part]
                    self.report.errors.append(f"step {self.report.steps}: layer {layer} {kv}: token {first} corrupted")
            self.report.tokens_checked += len(t)
        for r in self.live.values():
            if r.slot is None:
                continue
            phys = self.slots.translate(self._t([r.slot]))
            cache = self.state.mamba_cache
            for i, conv in enumerate(cache.conv):
                if not torch.equal(conv[:, phys], self._state_values(r.slot, i, conv[:, phys])):
                    self.report.errors.append(f"step {self.report.steps}: state slot {r.slot}: conv {i} corrupted")
            if not torch.equal(cache.temporal[:, phys], self._state_values(r.slot, -1, cache.temporal[:, phys])):
                self.report.errors.append(f"step {self.report.steps}: state slot {r.slot}: temporal corrupted")
            self.report.slots_checked += 1

    # ---------------------------------------------------- requests

    def _pages(self, tokens: list[int]) -> list[int]:
        return sorted({t // self.ps for t in tokens})

    def finish(self, r: Request) -> None:
        """Free what only ``r`` held: its SWA entries left, then full."""
        del self.live[r.rid]
        last = []
        for p in self._pages(r.tokens):
            self.refs[p] -= 1
            if self.refs[p] == 0:
                del self.refs[p]
                last.append(p)
        if last:
            owned = [t for t in r.tokens if t // self.ps in set(last)]
            self.alloc.free(self._t(owned))
        if r.slot is not None:
            self.slots.free(self._t([r.slot]))
        self.report.finished += 1

    def _make_room(self) -> bool:
        """An allocation came back None: finish the oldest request."""
        self.report.refused += 1
        if not self.live:
            return False
        self.finish(self.live[min(self.live)])
        return True

    def admit(self) -> None:
        ps, rng = self.ps, self.rng
        r = Request(self.next_rid, rng.randint(2, 12) * ps + rng.randrange(ps), 0)
        r.finish_at = r.target + rng.randint(4, 12 * ps + 24)
        donors = [d for d in self.live.values() if len(d.tokens) >= 2 * ps and d.swa_from == 0]
        if donors and rng.random() < 0.5:  # share a page-aligned prefix, counted once
            d = rng.choice(donors)
            k = min(rng.randint(1, len(d.tokens) // ps), (r.target - 1) // ps) * ps
            r.tokens = d.tokens[:k]
            for p in self._pages(r.tokens):
                self.refs[p] += 1
            self.report.shared_tokens += k
        if self.slots is not None:
            if hasattr(self.alloc, "prepare_mamba_allocation"):
                self.alloc.prepare_mamba_allocation(1)
            got = self.slots.alloc(1)
            while got is None and self._make_room():
                got = self.slots.alloc(1)
            if got is None:
                for p in self._pages(r.tokens):
                    self.refs[p] -= 1
                return
            r.slot = int(got.reshape(-1)[0])
            self._write_state(r.slot)
        self.live[r.rid] = r
        self.next_rid += 1
        self.report.admitted += 1

    def _extend(self, batch: list[Request], chunk: int) -> None:
        """One chunk of prefill for each request of ``batch``."""
        batch = [r for r in batch if r.rid in self.live]
        if not batch:
            return
        prefix = [len(r.tokens) for r in batch]
        seq = [min(r.target, p + chunk) for r, p in zip(batch, prefix)]
        last = [r.tokens[-1] if r.tokens else -1 for r in batch]
        n = sum(seq) - sum(prefix)
        p_cpu, s_cpu = torch.tensor(prefix, dtype=I64), torch.tensor(seq, dtype=I64)
        if self.ps == 1:  # SGLang's scheduler takes plain slots at page size 1 (alloc_token_slots)
            out = self.alloc.alloc(n)
        else:
            dev = self.dev
            out = self.alloc.alloc_extend(p_cpu.to(dev), p_cpu, s_cpu.to(dev), s_cpu, self._t(last), n)
        if out is None:
            if self._make_room():
                self._extend(batch, chunk)
            return
        ids = out.tolist()
        k = 0
        for r, p, s in zip(batch, prefix, seq):
            new = ids[k : k + s - p]
            k += s - p
            fresh = [q for q in self._pages(new) if q not in self.refs]
            for q in fresh:
                self.refs[q] = 1
            r.tokens += new
            r.decoding = len(r.tokens) == r.target
        self._write(ids)

    def _decode(self) -> None:
        batch = [r for r in self.live.values() if r.decoding]
        if not batch:
            return
        seq = torch.tensor([len(r.tokens) + 1 for r in batch], dtype=I64)
        last = self._t([r.tokens[-1] for r in batch])
        out = self.alloc.alloc(len(batch)) if self.ps == 1 else self.alloc.alloc_decode(seq.to(self.dev), seq, last)
        if out is None:
            if self._make_room():
                self._decode()
            return
        ids = out.tolist()
        for r, t in zip(batch, ids):
            if t // self.ps not in self.refs:
                self.refs[t // self.ps] = 1
            r.tokens.append(t)
        self._write(ids)
        for r in list(batch):
            if len(r.tokens) >= r.finish_at and r.rid in self.live:
                self.finish(r)

    def _slide_windows(self) -> None:
        """Free each request's SWA pages the window has passed, once no
        sharer still needs them (a segment of whole pages, all live)."""
        if not self.has_swa:
            return
        ps = self.ps
        for r in self.live.values():
            upto = max(0, (len(r.tokens) - self.g.window) // ps * ps)
            if upto <= r.swa_from:
                continue
            pages = self._pages(r.tokens[r.swa_from : upto])
            if any(self.refs[p] > 1 for p in pages):
                continue
            self.alloc.free_swa_segment(self._t(r.tokens[r.swa_from : upto]), start_pos=r.swa_from)
            self.report.swa_pages_freed += len(pages)
            r.swa_from = upto

    def step(self) -> None:
        for _ in range(self.rng.randint(0, 3)):
            self.admit()
        prefilling = [r for r in self.live.values() if not r.decoding]
        if prefilling:
            self._extend(prefilling, self.rng.choice([2, 3, 5]) * self.ps)
        self._decode()
        self._slide_windows()
        self.report.steps += 1
        self.check()


def run(
    kind: str,
    steps: int = 120,
    page_size: int = 1,
    lazy: bool = True,
    seed: int = 0,
    geometry: Geometry | None = None,
    device: str = "cpu",
) -> Report:
    """The workload on ``kind``'s stack as SGLang's factory builds it now
    (kvarena's allocator after ``install()``)."""
    w = Workload(kind, geometry or Geometry(), page_size, lazy, seed, device)
    for _ in range(steps):
        w.step()
        if w.report.errors:
            break
    while w.live:
        w.finish(w.live[min(w.live)])
    w.report.pages_moved = dict(getattr(w.alloc, "pages_moved", {}))
    return w.report
