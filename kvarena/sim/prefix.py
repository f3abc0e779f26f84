"""A radix-style prefix cache for the simulator, the same on every setup.

A finished request leaves its whole blocks (``Request.blocks``, each
``block_tokens`` tokens) in a tree, one node a block, keyed by the block's
key under its parent: two requests share a prefix exactly as far as their
keys agree.  A node owns its block's unit ids (full KV, and SWA KV where it
still holds it) and, on a model with recurrent state, may own a
**checkpoint**: a state slot holding the state at the node's end.

A new request **matches** the deepest node on its path that it can resume
from (SGLang's hybrid radix caches, docs/anchor.md §3 and docs/design.md §11):

- with state, the node must hold a checkpoint (a recurrent state cannot be
  rebuilt from KV without recomputing the prefix);
- with SWA, the nodes covering the last ``window`` tokens before the match
  end must still hold their SWA KV.

The match leaves at least one prompt token to compute.  The request locks
its matched path (a locked node is never evicted), reads those units as its
own prefix, and takes a state slot of its own (a copy of the checkpoint).
At its end it inserts its blocks: new nodes take its ids, a block another
request inserted meanwhile keeps the older copy, and its state slot becomes
the checkpoint of the node its state ends at (``state_at``; by default its
deepest node).  Where the engine keeps states only at a grid
(``engines.Checkpoints``), the engine says how far the request's KV goes
into the tree (``kv_until``: SGLang frees the KV past the last checkpoint)
and where its state is, and reads the branch point of a match from
``kv_depth``: how far the cached KV reaches past the last checkpoint.

**Eviction** frees the least recently used unlocked node: a leaf whole (its
ids and checkpoint); an inner node only its checkpoint and SWA KV, which
makes it a node that can be passed through but not resumed from (SGLang's
tombstones).  A locked path keeps its KV and the checkpoint its request
resumed from; the checkpoints before that one may go (so a request holds
at most its engine's slots and the one it resumed from).  The engine evicts before any relief, as SGLang's scheduler
evicts its tree before it allocates.

The cache only bookkeeps; the engine frees what it returns through the
setup's own calls (``release``, ``free_window``).
"""

import heapq


class Node:
    __slots__ = ("children", "depth", "ids", "key", "parent", "pins", "ref", "slot", "swa", "used")

    def __init__(self, key, parent, ids, swa):
        self.key, self.parent, self.ids, self.swa = key, parent, ids, swa
        self.children = {}
        self.depth = (parent.depth + len(ids)) if parent is not None else 0  # units from the root to the end
        self.slot = None
        self.ref = 0  # requests whose match runs through this node: its KV stays
        self.pins = 0  # requests whose match ends here: its checkpoint stays too
        self.used = 0


class PrefixCache:
    def __init__(self, block_units, window_units, has_swa, has_state):
        """``window_units``: the units before a match's end whose SWA KV a
        resumed request attends over (``ceil(window / page_tokens)``)."""
        if block_units < 1:
            raise ValueError(f"prefix cache: block_units must be >= 1, got {block_units}")
        self.block_units, self.window_need = block_units, window_units
        self.has_swa, self.has_state = has_swa, has_state
        self.root = Node(None, None, [], True)
        self.tick = 0
        self.heap = []  # (used, seq, node): eviction candidates, checked when popped
        self.seq = 0
        self.nodes = 0
        self.units = 0  # units the cache owns
        self.slots = 0  # checkpoints the cache owns

    # ---------------------------------------------------------------- match

    def _resumable(self, node):
        if node is self.root:
            return True
        if self.has_state and node.slot is None:
            return False
        if self.has_swa:
            need, n = self.window_need, node
            while need > 0 and n is not self.root:
                if not n.swa:
                    return False
                need -= len(n.ids)
                n = n.parent
        return True

    def match(self, blocks, max_units):
        """The path (root excluded) to the deepest resumable node on
        ``blocks``' path that ends at most at ``max_units``."""
        path, best, n = [], 0, self.root
        for key in blocks:
            n = n.children.get(key)
            if n is None or n.depth > max_units:
                break
            path.append(n)
            if self._resumable(n):
                best = len(path)
        return path[:best]

    def kv_depth(self, blocks, max_units):
        """Units of ``blocks``' path whose KV the tree holds, checkpoint or
        not, ending at most at ``max_units``."""
        n, depth = self.root, 0
        for key in blocks:
            n = n.children.get(key)
            if n is None or n.depth > max_units:
                break
            depth = n.depth
        return depth

    def lock(self, path):
        """A request runs on ``path``: its KV stays, and the checkpoint it
        resumed from; the checkpoints before it may still go."""
        self.tick += 1
        for n in path:
            n.ref += 1
            n.used = self.tick
            if n.slot is not None and n is not path[-1]:
                self._candidate(n)
        if path:
            path[-1].pins += 1

    def unlock(self, path):
        self.tick += 1
        if path:
            path[-1].pins -= 1
        for n in path:
            n.ref -= 1
            n.used = self.tick
            if n.ref == 0:
                self._candidate(n)

    def _candidate(self, n):
        self.seq += 1
        heapq.heappush(self.heap, (n.used, self.seq, n))

    # --------------------------------------------------------------- insert

    def insert(self, path, blocks, ids, swa_from, slot, state_at=None, kv_until=None):
        """A finished request's blocks: ``path`` is its locked match (its
        first ``len`` ids), ``ids`` all its units, ``swa_from`` the first
        unit whose SWA it still holds, ``slot`` its state slot, holding the
        state after ``state_at`` units (None: its deepest node's).  Only
        its first ``kv_until`` units (None: all) go into the tree.  Unlocks
        ``path``.  Returns what the engine frees: ``(release_ids,
        window_ids, slots)``."""
        node = path[-1] if path else self.root
        off, bu = node.depth, self.block_units
        end = len(ids) if kv_until is None else min(kv_until, len(ids))
        release, window = [], []
        self.tick += 1
        at = node if state_at is not None and node.depth == state_at else None
        for key in blocks[len(path) :]:
            if off + bu > end:
                break
            own = ids[off : off + bu]
            child = node.children.get(key)
            if child is None:
                child = Node(key, node, own, off >= swa_from or not self.has_swa)
                if self.has_swa and not child.swa:  # a block the window half left: free the SWA it still has
                    window += own[max(0, swa_from - off) :]
                node.children[key] = child
                self.nodes += 1
                self.units += bu
            else:
                release += own  # another request cached this block first: keep that copy
            child.used = self.tick
            self._candidate(child)
            node, off = child, off + bu
            if state_at is not None and off == state_at:
                at = child
        release += ids[off:]
        at = node if state_at is None else at
        slots = []
        if slot is not None:
            if at is not None and at is not self.root and at.slot is None:
                at.slot = slot
                self.slots += 1
            else:
                slots.append(slot)
        self.unlock(path)
        return release, window, slots

    # ---------------------------------------------------------------- evict

    def evict_one(self):
        """Free the least recently used unlocked node that holds anything;
        ``(release_ids, window_ids, slots)``, or None when nothing can go."""
        while self.heap:
            used, _, n = heapq.heappop(self.heap)
            if used != n.used or n.parent is None or n.parent.children.get(n.key) is not n:
                continue  # touched since, or gone
            if n.ref:  # on a running request's path: only a checkpoint it did not resume from
                if n.slot is None or n.pins:
                    continue
                self.slots -= 1
                slot, n.slot = n.slot, None
                return [], [], [slot]
            slots = [n.slot] if n.slot is not None else []
            self.slots -= len(slots)
            n.slot = None
            if not n.children:  # a leaf: all of it
                del n.parent.children[n.key]
                self.nodes -= 1
                self.units -= len(n.ids)
                p = n.parent
                if p is not self.root and not p.children and not p.ref:
                    self._candidate(p)  # its parent may now go whole
                return n.ids, [], slots
            window = n.ids if (self.has_swa and n.swa) else []
            n.swa = n.swa and not window
            if slots or window:  # an inner node: its checkpoint and SWA (a tombstone)
                return [], window, slots
        return None

    def check(self):
        """The counts agree with the tree (a test's check)."""
        nodes = units = slots = 0
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            nodes, units, slots = nodes + 1, units + len(n.ids), slots + (n.slot is not None)
            if n.ref < 0 or n.depth != n.parent.depth + len(n.ids):
                raise AssertionError(f"prefix cache: node {n.key!r}: ref {n.ref}, depth {n.depth}")
            stack += n.children.values()
        if (nodes, units, slots) != (self.nodes, self.units, self.slots):
            raise AssertionError(
                f"prefix cache: counted {(nodes, units, slots)}, kept {(self.nodes, self.units, self.slots)}"
            )
