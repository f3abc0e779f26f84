"""HiCache's load-back, driven through SGLang's own code on the CPU.

SGLang's hierarchical cache (HiCache) copies evicted prefixes to host
memory and loads them back on a hit.  What the allocator sees of it
(docs/design.md §13) is:

- at startup, ``set_host_transfer_move_gate(gate)``: the scheduler's gate
  is ``not cache_controller.has_inflight_device_transfers()``, which reads
  the controller's four queues (loads and backups, queued or not yet
  acknowledged);
- per load-back, ``HybridCacheController.load``: the full rows alone from
  ``full_attn_allocator.alloc``, the SWA pages (and a mamba slot) through
  the callbacks ``_swa_allocation_callbacks`` picks, rolled back on a
  shortfall by ``_resolve_device_transfers``; then the tree's commit binds
  the SWA pages to the full rows (``set_full_to_swa_mapping``);
- a backup (``write_backup``, ``start_writing``) copies a cached prefix's
  rows to the host the same way, in the other direction;
- ``start_loading``: the transfer is submitted (full ids resolved to
  physical rows by the pool's ``host_transfer_translate``,
  ``L2TransferEngine._resolve_device_indices``), its done event handed
  over (``set_hicache_transfer_done_event``), the operation moved to the
  acknowledgement queue; the copy lands later, at the rows resolved then.

``HostCache`` runs those calls of SGLang's (its ``load``, its
``_resolve_device_transfers``, its ``_swa_allocation_callbacks``, its
``has_inflight_device_transfers``, its ``_resolve_device_indices``) over a
controller that holds only the queues and the host pool's entry map: the
copy engines need a GPU (``sgl_kernel.kvcacheio``), so the copy itself is
played here, late, at the rows SGLang resolved when it submitted.  A page
moved between submit and landing loses the load (its bytes land on the old
rows) or is clobbered by it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from types import MethodType, SimpleNamespace
from typing import Any

import torch

from kvarena.anchor.loader import import_sglang

from .overlap import Device

I64 = torch.int64


@dataclass
class Load:
    """One load-back in flight: the request it becomes, the writes the copy
    makes when it lands (``buffer[rows] = values``, rows resolved at submit),
    and the step it lands at."""

    tokens: list[int]
    swa_from: int
    slot: int | None
    writes: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    due: int


@dataclass
class Backup:
    """One backup in flight: the request it copies, the rows it reads when
    it lands (resolved at submit) with what they held then, the step it
    lands at, and how many rows read something else."""

    rid: int
    reads: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    due: int
    lost: int = 0


class HostCache:
    """SGLang's HiCache controller as the allocator meets it: the queues its
    move gate reads, the load-back calls, and the copies, landed late.

    Args:
        alloc: the token-to-KV allocator (SGLang's or kvarena's).
        kvcache: the KV pool (``full_kv_pool`` and, where there is one,
            ``swa_kv_pool``).
        slots: the mamba slot allocator (``req_to_token_pool.mamba_allocator``), or None.
        state_pool: the mamba pool (its ``host_transfer_translate`` resolves slots), or None.
        fence: the forward stream, with overlap scheduling: a copy lands only
            after the forwards launched before it was submitted, as
            ``start_loading`` orders the host-to-device stream after
            ``load_fence_stream`` (a reclaimed page may still be written by
            the forward in flight).
    """

    def __init__(
        self, alloc: Any, kvcache: Any, slots: Any = None, state_pool: Any = None, fence: Device | None = None
    ) -> None:
        cc = import_sglang("sglang.srt.managers.cache_controller")
        hybrid = import_sglang("sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller")
        assembler = import_sglang("sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler")
        self._storage = import_sglang("sglang.srt.mem_cache.hicache_storage")
        self._l2 = import_sglang("sglang.srt.mem_cache.l2_transfer")
        self._load = hybrid.HybridCacheController.load
        self.alloc, self.kvcache, self.slots, self.state_pool = alloc, kvcache, slots, state_pool
        names = self._storage.PoolName
        entries = {}
        swa = getattr(alloc, "swa_attn_allocator", None)
        if swa is not None:
            callbacks = assembler._swa_allocation_callbacks(swa)  # SGLang's choice of the SWA calls
            entries[names.SWA] = SimpleNamespace(device_evict_fn=None, device_pool=None, **callbacks)
        if slots is not None:  # the mamba entry allocates through the slot allocator (hybrid_pool_assembler)
            entries[names.MAMBA] = SimpleNamespace(
                device_alloc_fn=slots.alloc, device_free_fn=slots.free, device_evict_fn=None, device_pool=None
            )
        self.ctl = SimpleNamespace(
            write_queue=[],
            load_queue=[],
            ack_write_queue=[],
            ack_load_queue=[],
            mem_pool_device_allocator=alloc,
            device=alloc.device,
            mem_pool_host=SimpleNamespace(entry_map=entries),
        )
        self.ctl._resolve_device_transfers = MethodType(
            hybrid.HybridCacheController._resolve_device_transfers, self.ctl
        )
        gate_open = cc.HiCacheController.has_inflight_device_transfers
        alloc.set_host_transfer_move_gate(lambda c=self.ctl: not gate_open(c))  # as the scheduler installs it
        # the copy engine's stream: a copy lands when polled or waited on (late, which a CPU copy never is)
        self.engine = Device()
        self.fence = fence
        self.in_flight: list[tuple[Load | Backup, Any]] = []
        self.loads = 0  # load-backs submitted
        self.refused = 0  # load-backs that found no room (rolled back by SGLang's code)

    def load(self, n: int, swa: int, slot: bool) -> tuple[list[int], list[int], int | None] | None:
        """SGLang's ``HybridCacheController.load`` of ``n`` tokens whose last
        ``swa`` have SWA entries, and a mamba slot if ``slot``; then the
        commit's ``set_full_to_swa_mapping``.  Returns the full virtual
        token ids, the SWA physical token ids and the slot, or None (SGLang
        rolled back what it took)."""
        names = self._storage.PoolName
        extra = []
        if swa:
            extra.append(self._storage.PoolTransfer(name=names.SWA, host_indices=torch.arange(swa, dtype=I64)))
        if slot:
            extra.append(self._storage.PoolTransfer(name=names.MAMBA, host_indices=torch.arange(1, dtype=I64)))
        full = self._load(self.ctl, host_indices=torch.arange(n, dtype=I64), node_id=self.loads, extra_pools=extra)
        if full is None:
            self.refused += 1
            return None
        by_name = {t.name: t.device_indices for t in extra}
        swa_rows = by_name.get(names.SWA)
        if swa_rows is not None:  # the tree's commit (RebuildFullToSWAMapping)
            self.alloc.set_full_to_swa_mapping(full[n - swa :], swa_rows)
        state = by_name.get(names.MAMBA)
        self.loads += 1
        return (
            full.tolist(),
            [] if swa_rows is None else swa_rows.tolist(),
            None if state is None else int(state.reshape(-1)[0]),
        )

    def resolve(self, device_pool: Any, ids: torch.Tensor) -> torch.Tensor:
        """The rows a submitted copy addresses: SGLang's transfer engine
        resolves the controller's ids by the pool's ``host_transfer_translate``."""
        transfer = self._l2.L2Transfer(
            host_pool=SimpleNamespace(), device_pool=device_pool, host_indices=ids, device_indices=ids
        )
        return self._l2.L2TransferEngine._resolve_device_indices(transfer)

    def _copy(self, body: Callable[[], None]):
        """A copy on the engine's stream, fenced after the forwards launched
        so far; ``body`` runs when it lands.  Returns its done event."""
        fence = self.fence
        before = fence.in_flight[-1] if fence is not None and fence.in_flight else None

        def land() -> None:
            if fence is not None and before is not None:
                fence.land(before)
            body()

        return self.engine.launch(on_land=land)

    def submit(self, load: Load) -> None:
        """``start_loading``: the queued operation is submitted to the copy
        engine (its writes recorded, landing later), its done event handed
        to the allocator, and it waits for its acknowledgement."""

        def write() -> None:
            for buf, rows, values in load.writes:
                buf[rows] = values

        event = self._copy(write)
        self.alloc.set_hicache_transfer_done_event((id(self.ctl), "load"), event)
        self.ctl.load_queue.clear()
        self.ctl.ack_load_queue.append(load)
        self.in_flight.append((load, event))

    def back_up(self, backup: Backup) -> None:
        """``write_backup`` then ``start_writing``: a device-to-host copy of
        rows resolved now, read when it lands; its done event handed over,
        and it waits for its acknowledgement.  What it read is compared
        with what the rows held at submit (``Backup.lost``)."""

        def read() -> None:
            for buf, rows, want in backup.reads:
                backup.lost += int((buf[rows] != want).reshape(len(rows), -1).any(dim=1).sum())

        event = self._copy(read)
        self.alloc.set_hicache_transfer_done_event((id(self.ctl), "write"), event)
        self.ctl.ack_write_queue.append(backup)
        self.in_flight.append((backup, event))

    def poll(self, step: int | None = None) -> list["Load | Backup"]:
        """``loading_check`` and ``writing_check``: the copies due by ``step``
        (None: all) have landed (at the rows resolved at submit) and their
        acknowledgements are popped, so the gate may open."""
        due = [(x, e) for x, e in self.in_flight if step is None or x.due <= step]
        for x, event in due:
            event.synchronize()
            self.in_flight.remove((x, event))
            (self.ctl.ack_load_queue if isinstance(x, Load) else self.ctl.ack_write_queue).remove(x)
        return [x for x, _ in due]
