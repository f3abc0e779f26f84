"""The static free list: the textbook static SWA + full allocator on the
device (docs/anchor.md §2), one free-id ring per pool and a full-to-SWA page
map, in torch.

``kvarena bench`` times and counts it against the composites (its ``decode``
and ``ops`` sections: the "static twin"), and the simulator prices its static
splits and vLLM's padded pool at what it dispatches per call
(``kvarena.sim.launches.free_list_ops``).
"""


class StaticFreeList:
    """The textbook static SWA + full allocator on the device (docs/anchor.md
    §2): a free-id ring per pool, a full-to-SWA page map, the
    anchor's slot rules, and the composite's host reads: one per
    ``free_swa`` (the count that sizes the call) unless it is given the
    engine's ``num_live``, and one per ``alloc_decode`` unless it is given
    the engine's ``seq_lens_cpu``."""

    def __init__(self, full_pages, swa_pages, page_size, device):
        import torch

        self.ps, self.device = page_size, device
        self.full = Ring(full_pages, device)
        self.swa = Ring(swa_pages, device)
        self.full_to_swa = torch.zeros(full_pages + 2, dtype=torch.int64, device=device)
        self.full_to_swa[-1] = -1  # the -1 sentinel row: an empty prefix's last_loc
        self.counter = None  # bench ops: counts the reads

    def _read(self, t):
        """A host read of a 0-dim tensor, counted when a counter is set."""
        if self.counter is not None:
            self.counter.reads += 1
        return int(t)  # SYNC: the twin's documented reads

    def _bind(self, n):
        if n > min(self.full.count, self.swa.count):
            return None
        pages = self.full.take(n)
        self.full_to_swa.index_copy_(0, pages, self.swa.take(n))
        return pages

    def alloc_extend(self, prefix, seq, last):
        """Setup only (untimed): whole new pages for empty prefixes."""
        import torch

        ps = self.ps
        new = (seq + ps - 1) // ps
        pages = self._bind(int(new.sum()))
        req = torch.repeat_interleave(torch.arange(seq.numel(), device=self.device), seq)
        first = torch.cumsum(seq, 0) - seq
        pos = torch.arange(int(seq.sum()), device=self.device) - first[req]
        base = torch.cumsum(new, 0) - new
        return pages[base[req] + pos // ps] * ps + pos % ps

    def alloc_decode(self, seq, last, seq_lens_cpu=None):
        import torch

        ps = self.ps
        new = (seq % ps == 1) if ps > 1 else torch.ones_like(seq, dtype=torch.bool)
        if seq_lens_cpu is not None:  # the engine's host copy: no read, as the composite's
            n = int((seq_lens_cpu % ps == 1 % ps).sum())
        else:
            n = self._read(new.sum())  # SYNC: the one read, as the composite's
        pages = self._bind(n)
        if pages is None:
            return None
        idx = torch.cumsum(new.to(torch.int64), 0) - 1
        page = torch.cat([pages, pages.new_zeros(1)])[torch.where(new, idx, n)]
        return torch.where(new, page * ps + (seq - 1) % ps, last + 1)

    def free_swa(self, tokens, start_pos, num_live=None):
        import torch

        reps = tokens[:: self.ps]
        page = torch.where(reps >= 0, reps // self.ps, 0)  # -1 reads (and refills) the sink row: 0
        swa = self.full_to_swa.index_select(0, page)
        live = swa > 0
        if num_live is not None:  # the engine's host count: no read, as the composite's
            count = num_live
        else:
            count = self._read(live.sum())  # SYNC: the one read, as the composite's
        self.swa.put(torch.sort(torch.where(live, swa, swa.new_full((), 1 << 62))).values[:count])
        self.full_to_swa.index_fill_(0, page, 0)

    def translate(self, tokens, pool="full"):
        import torch

        if pool == "full":
            return tokens.clone()
        page = torch.div(tokens, self.ps, rounding_mode="floor")
        sentinel = self.full_to_swa.numel() - 1  # holds -1: translates to slot 0
        phys = self.full_to_swa.index_select(0, torch.where(tokens >= 0, page, sentinel))
        return torch.where(phys > 0, phys * self.ps + tokens % self.ps, torch.zeros_like(phys))


class Ring:
    """A FIFO of free ids ``1..n`` on the device; head and count on the host."""

    def __init__(self, n, device):
        import torch

        self.cap = n
        self.buf = torch.arange(1, n + 1, dtype=torch.int64, device=device)
        self.head, self.count = 0, n

    def _slots(self, start, k):
        import torch

        return (torch.arange(k, dtype=torch.int64, device=self.buf.device) + start) % self.cap

    def take(self, k):
        out = self.buf.index_select(0, self._slots(self.head, k))
        self.head, self.count = (self.head + k) % self.cap, self.count - k
        return out

    def put(self, ids):
        k = ids.numel()
        self.buf.index_copy_(0, self._slots(self.head + self.count, k), ids)
        self.count += k
