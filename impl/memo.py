"""The capacity memo: epoch-counting fields and a memo keyed on their sum.

A scheduler reads capacity views O(queue) times per step, so the arena
memoises them.  Every field a view depends on is a ``CapField``: a data
descriptor whose ``__set__`` bumps the owner's epoch.  Epochs only grow, so
the sum of the chain's epochs changes on every rebind anywhere in the chain
and is a sound memo key.  Such fields must be *rebound*, never mutated in
place (ints are immutable; tensors held in a ``CapField`` are replaced, not
written into).  A write that goes around the descriptor (``obj.__dict__``)
leaves the key unchanged; ``Arena.verify`` catches it as a "stale memo".
"""


class CapField:
    """A capacity-bearing attribute; each rebind bumps ``owner.epoch``."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__[self.name]

    def __set__(self, obj, value):
        obj.__dict__[self.name] = value
        obj.__dict__["epoch"] = obj.__dict__.get("epoch", 0) + 1


class Memo:
    """Cached views, ``(view, pool) -> (key, value)``, valid while the key holds."""

    def __init__(self, key_fn):
        self._key_fn = key_fn
        self._cache = {}
        self.hits = self.misses = 0

    def get(self, view, pool, compute):
        key = self._key_fn()
        hit = self._cache.get((view, pool))
        if hit is not None and hit[0] == key:
            self.hits += 1
            return hit[1]
        self.misses += 1
        value = compute()
        self._cache[(view, pool)] = (key, value)
        return value

    def entries(self):
        """``(view, pool, value)`` for entries still valid under the current key."""
        key = self._key_fn()
        return [(v, p, val) for (v, p), (k, val) in self._cache.items() if k == key]
