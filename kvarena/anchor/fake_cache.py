"""The fake KV cache the anchor's allocators move pages in.

The anchor's allocator never touches KV bytes itself: it calls its cache's
``move_physical_pages(dst, src, page_size)`` (destination first, physical
page ids, disjoint sets).  This stand-in keeps, for every physical *slot* of
one pool's grid, the virtual token id whose data sits there (-1: nothing),
and counts the pages each call copies, which is how the adapter reports
"pages moved" for calls whose anchor return value means something else.
"""

import torch


class FakeKVCache:
    def __init__(self, num_pages, page_size):
        self.page_size = page_size
        self.owner = torch.full((num_pages * page_size,), -1, dtype=torch.int64)
        self.pages_moved = 0

    def _slots(self, pages):
        pages = torch.as_tensor(pages, dtype=torch.int64).reshape(-1).cpu()  # the record lives on the host
        return (pages[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)

    def write(self, vpages, ppages):
        """Record that virtual pages ``vpages`` were just written at ``ppages``."""
        vtok = self._slots(vpages)
        self.owner[self._slots(ppages)] = vtok

    def move_physical_pages(self, dst_pages, src_pages, page_size):
        assert page_size == self.page_size, (page_size, self.page_size)
        src, dst = self._slots(src_pages), self._slots(dst_pages)
        self.owner[dst] = self.owner[src].clone()  # read every source before writing
        self.pages_moved += int(src.numel()) // self.page_size

    def misplaced(self, vpages, ppages):
        """Virtual pages whose every slot's data is not at its translated slot."""
        vtok, ptok = self._slots(vpages), self._slots(ppages)
        bad = (self.owner[ptok] != vtok).reshape(-1, self.page_size).any(dim=1)
        return [int(v) for v, b in zip(torch.as_tensor(vpages).reshape(-1).tolist(), bad.tolist()) if b]

    def zero_physical_pages(self, pages):
        """The anchor zeroes MHA/MLA envelopes on hand-out; data is recorded on write."""
