"""vLLM v1's hybrid allocator as a simulator setup: one block pool, every
kind's page padded to one size.

The layout follows vLLM 0.34.0's hybrid KV cache manager (paths under
``vllm/``, and vLLM's design document on that manager):

1. **Block size** (``platforms/interface.py``, ``_align_hybrid_block_size``).
   Attention pages hold ``page_tokens`` tokens; with a state kind the
   attention block size rises to ``a * ceil(state_layer / (a *
   kv_layer_token))`` tokens, so that one layer's attention page holds one
   layer's state, and the state page is padded to that size.  ``a`` is the
   kernel alignment, 16; with prefix caching (``mamba_cache_mode="align"``,
   vLLM's default for these models then) it is ``lcm(16, the state
   kernel's prefill checkpoint alignment)``: 64 for a gated delta net
   (``v1/attention/backends/gdn_attn.py``,
   ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``), 1 for mamba2.  Qwen3-Next: 544
   tokens without the cache, 576 with it.
2. **Groups** (``v1/core/kv_cache_planning.py``,
   ``_get_kv_cache_groups_uniform_page_size``).  Layers are grouped by
   kind, ``g`` to a group: ``g`` is the smallest layer count among the
   kinds, or the largest when the largest is under 1.5 times the smallest
   (``GROUP_LARGEST_BELOW``); a kind with ``c`` layers gets ``ceil(c / g)``
   groups, the last padded with empty layers.
3. **One pool.**  A block is one group's pages (``g`` layer pages); every
   group allocates from one pool of ``budget // block`` blocks.

Per request: each full group holds ``ceil(tokens / block_size)`` blocks;
each SWA group the blocks not wholly outside the window (vLLM frees those);
each state group one block per state the request holds (two with the
cache: ``engines.Checkpoints``).  Every block is alike, so nothing ever
needs to move and there is no ladder: relief is eviction only.  The waste
is the padding: partly filled attention blocks (large when the block size
rose to fit a state), padded layers, and padded state pages.

The scheduler speaks in 16-token units as with every setup: this backend
hands out one unit id per unit and keeps, per request, its units and the
blocks they need.  Its admission gate prices a demand as a new request's
(whole blocks, no partly filled block of its own to reuse), which errs
toward refusing.
"""

import math

from kvarena.impl import MAX_EVICT_ROUNDS
from kvarena.sim.backends import _slack

ALIGN = 16  # vLLM's kernel block alignment for these attention backends
CHECKPOINT_ALIGN = {"gdn": 64, "mamba2": 1}  # a state kernel's prefill checkpoint alignment (align mode)
GROUP_LARGEST_BELOW = 1.5  # group by the largest layer count when it is under this times the smallest


class Layout:
    """A preset's padded pool (``layout``): block size in tokens, layers a
    group, groups per kind, and bytes (unscaled) of one block.
    ``prefix_cache``: vLLM's ``align`` mode (its default with the cache on)."""

    def __init__(self, preset, page_tokens, prefix_cache=False):
        full, swa, state = preset.layers
        if not full or (swa and not preset.swa_bytes) or (state and not preset.state_bytes):
            raise ValueError(f"preset {preset.name!r}: no per-layer geometry for a padded pool")
        kv_layer_token = preset.full_bytes // full  # one layer's KV per token
        for what, total, count in (("swa", preset.swa_bytes, swa), ("full", preset.full_bytes, full)):
            if count and total != count * kv_layer_token:
                raise ValueError(f"preset {preset.name!r}: {what} layers differ in size; one page size cannot fit")
        self.block_tokens = page_tokens
        self.state_layer = preset.state_bytes // state if state else 0
        if state:
            a = math.lcm(ALIGN, CHECKPOINT_ALIGN[preset.state_kind]) if prefix_cache else ALIGN
            self.block_tokens = max(page_tokens, a * math.ceil(self.state_layer / (a * kv_layer_token)))
        self.layer_page = self.block_tokens * kv_layer_token
        counts = {k: c for k, c in (("full", full), ("swa", swa), ("state", state)) if c}
        least, most = min(counts.values()), max(counts.values())
        self.group_layers = most if most < GROUP_LARGEST_BELOW * least else least
        self.groups = {k: math.ceil(c / self.group_layers) for k, c in counts.items()}
        self.block_bytes = self.group_layers * self.layer_page
        used = {
            "full": full * kv_layer_token,
            "swa": swa * kv_layer_token,
            "state": preset.state_bytes,
        }
        # bytes a kind's groups reserve per token (state: per request) against what it uses
        self.padding = {
            k: (self.groups[k] * self.block_bytes / (self.block_tokens if k != "state" else 1)) / used[k] - 1
            for k in self.groups
        }


class PaddedPool:
    """The padded block pool behind the simulator's calls (``Layout``)."""

    static = False

    def __init__(self, sizes, prefix_cache=False):
        p = sizes.preset
        self.sizes, self.layout = sizes, Layout(p, sizes.page_tokens, prefix_cache)
        lay = self.layout
        if lay.block_bytes % sizes.byte_scale:
            raise ValueError(f"preset {p.name!r}: a block of {lay.block_bytes} bytes does not scale exactly")
        self.block = lay.block_bytes // sizes.byte_scale
        self.blocks = sizes.budget_bytes // lay.block_bytes
        self.has_swa, self.has_state = "swa" in lay.groups, "state" in lay.groups
        self.nf, self.ns, self.nm = (lay.groups.get(k, 0) for k in ("full", "swa", "state"))
        self.epp = {"full": sizes.unit_full, "swa": sizes.unit_swa, "state": sizes.slot}
        self.unit_bytes = sizes.unit_full + (sizes.unit_swa if self.has_swa else 0)
        self.slack_bytes = _slack({k: v for k, v in self.epp.items() if k != "swa" or self.has_swa})
        self.allocated_bytes = 0
        self.moved_bytes = 0  # blocks never move
        self.used = 0
        self.owner = {}  # unit id -> request key
        self.reqs = {}  # request key -> [units, units freed from the window]
        self.slots = set()
        self._next_id = self._next_key = 0
        self._refused = 0  # blocks the last refused extend or decode needed

    # blocks
    def _kv_blocks(self, units, swa_done):
        bt, pt = self.layout.block_tokens, self.sizes.page_tokens
        end = math.ceil(units * pt / bt)
        return self.nf * end + self.ns * max(0, end - swa_done * pt // bt)

    def _new_blocks(self, units):
        """Blocks a new request of ``units`` units takes (the gate's price)."""
        return (self.nf + self.ns) * math.ceil(units * self.sizes.page_tokens / self.layout.block_tokens)

    @property
    def free(self):
        return self.blocks - self.used

    # views and gates
    def available(self):
        per = self.nf + self.ns
        return self.free // per * self.layout.block_tokens // self.sizes.page_tokens

    def admits(self, units, slots, reserve):
        return self._new_blocks(units + reserve) + self.nm * slots <= self.free

    def fits_empty(self, full_units, swa_units, slots):
        bt, pt = self.layout.block_tokens, self.sizes.page_tokens
        need = self.nf * math.ceil(full_units * pt / bt) + self.ns * math.ceil(swa_units * pt / bt)
        return need + self.nm * slots <= self.blocks

    # allocation
    def alloc_state(self):
        if self.nm > self.free:
            return None
        self.used += self.nm
        self.allocated_bytes += self.epp["state"]
        self._next_id += 1
        self.slots.add(self._next_id)
        return self._next_id

    def _grow(self, keys_units):
        """Add units to requests (``[(key, n)]``) if the blocks they need are
        free, all or nothing; their new unit ids, or None."""
        delta = 0
        for key, n in keys_units:
            u, d = self.reqs.get(key, (0, 0))
            delta += self._kv_blocks(u + n, d) - self._kv_blocks(u, d)
        if delta > self.free:
            self._refused = delta  # what relief must free for this call to pass
            return None
        self._refused = 0
        self.used += delta
        out = []
        for key, n in keys_units:
            u, d = self.reqs.get(key, (0, 0))
            self.reqs[key] = [u + n, d]
            for _ in range(n):
                self._next_id += 1
                self.owner[self._next_id] = key
                out.append(self._next_id)
        self.allocated_bytes += sum(n for _, n in keys_units) * self.unit_bytes
        return out

    def extend(self, prefix, n, last, own=None):
        """``own``: units the request holds itself, 0 for its first chunk
        (then ``last`` may be a cached prefix's, another key's)."""
        if last == -1 or own == 0:
            self._next_key += 1
            key = self._next_key
        else:
            key = self.owner[last]
        return self._grow([(key, n)])

    def decode(self, seqs, lasts):
        return self._grow([(self.owner[last], 1) for last in lasts])

    def free_window(self, ids):
        if not self.has_swa:
            return
        for i in ids:
            u, d = self.reqs[self.owner[i]]
            self.used -= self._kv_blocks(u, d) - self._kv_blocks(u, d + 1)
            self.reqs[self.owner[i]] = [u, d + 1]

    def release(self, ids, slots):
        for i in ids:
            key = self.owner.pop(i)
            u, d = self.reqs[key]
            u2 = u - 1
            d2 = min(d, u2)
            self.used -= self._kv_blocks(u, d) - self._kv_blocks(u2, d2)
            if u2:
                self.reqs[key] = [u2, d2]
            else:
                del self.reqs[key]
        for s in slots:
            self.slots.remove(s)
            self.used -= self.nm

    def _fits(self, units, slots):
        """A demand of ``units`` as a new request's, or, after a refused
        decode or extend, that call's own block count if larger (a decode
        batch's requests each open their own block)."""
        return max(self._new_blocks(units) + self.nm * slots, self._refused) <= self.free

    def relieve(self, units, slots, evict=None, reserve=0):
        """No ladder: only eviction rounds (at most 4, as the arena's).  The
        reserve is part of the demand, as the gate prices it."""
        units += reserve
        for _ in range(MAX_EVICT_ROUNDS if evict is not None else 0):
            if self._fits(units, slots):
                return True
            if not evict(max(1, units - self.available())):
                break
        return self._fits(units, slots)

    # bytes
    def live_bytes(self):
        """Bytes the pool has handed out, padding included."""
        return self.used * self.block

    def free_bytes(self):
        return self.sizes.total - self.live_bytes()

    def demand_bytes(self, units, slots):
        return units * self.unit_bytes + slots * self.epp["state"]

    def live_by_kind(self):
        return {"blocks": self.used}

    def boundaries(self):
        return None

    def verify(self):
        want = sum(self._kv_blocks(u, d) for u, d in self.reqs.values()) + self.nm * len(self.slots)
        if want != self.used or not 0 <= self.used <= self.blocks:
            raise AssertionError(f"padded pool: {self.used} blocks used, requests and slots hold {want}")
