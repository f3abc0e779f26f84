"""The capacity memo: epoch-counting fields and a memo keyed on one epoch.

A scheduler reads capacity views O(queue) times per step, so the arena
memoises them.  Every field a view depends on is a ``CapField``: a data
descriptor whose ``__set__`` bumps its band's ``epoch`` and, when the band
belongs to an arena, the arena-wide ``Clock`` that all its bands share.
Epochs only grow, so the clock changes on every rebind anywhere in the chain
and is a sound memo key; a tick empties the memo, so a memoised read is a
single dict lookup (the sum of the bands' epochs, the key before, cost a
walk over the chain on every read).
Such fields must be *rebound*, never mutated in place (ints are immutable;
tensors held in a ``CapField`` are replaced, not written into).  A write
that goes around the descriptor (``obj.__dict__``) bumps nothing;
``Arena.verify`` catches it as a "stale memo".
"""


class Clock:
    """One arena-wide epoch, shared by every band of the arena.  Each tick
    also empties the caches keyed on it, so a memoised read is one lookup."""

    __slots__ = ("now", "caches")

    def __init__(self):
        self.now = 0
        self.caches = []

    def tick(self):
        self.now += 1
        for c in self.caches:
            c.clear()

    @classmethod
    def shared_by(cls, bands):
        """A new clock, attached to every band in ``bands``."""
        clock = cls()
        for b in bands:
            b.clock = clock
        return clock


class CapField:
    """A capacity-bearing attribute; each rebind bumps ``owner.epoch`` and
    ticks the owner's arena clock (``owner.clock``, once attached)."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__[self.name]

    def __set__(self, obj, value):
        d = obj.__dict__
        d[self.name] = value
        d["epoch"] = d.get("epoch", 0) + 1
        clock = d.get("clock")
        if clock is not None:
            clock.tick()


_MISSING = object()


class Memo:
    """Cached views by ``(view, pool)``, valid while the key holds.

    ``key`` is a ``Clock``: every entry is dropped when it ticks, so an
    entry present is valid and a read is one dict lookup (the arena's
    memo); or a function returning the key, stored with each entry and
    compared on each read (the composites key their joint view on the sum
    of the chain's epochs)."""

    def __init__(self, key):
        self.clock = key if isinstance(key, Clock) else None
        self._key_fn = None if self.clock is not None else key
        self._cache = {}
        self.hits = self.misses = 0
        if self.clock is not None:
            self.clock.caches.append(self._cache)
            self.get = self._get_clocked

    @classmethod
    def shared_by(cls, bands):
        """A memo on a new ``Clock`` attached to every band in ``bands``."""
        return cls(Clock.shared_by(bands))

    def key(self):
        return self.clock.now if self._key_fn is None else self._key_fn()

    def _get_clocked(self, view, pool, compute, _missing=_MISSING):
        value = self._cache.get((view, pool), _missing)
        if value is _missing:
            self.misses += 1
            value = self._cache[(view, pool)] = compute()
            return value
        self.hits += 1
        return value

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
        if self.clock is not None:
            return [(v, p, val) for (v, p), val in self._cache.items()]
        key = self._key_fn()
        return [(v, p, val) for (v, p), (k, val) in self._cache.items() if k == key]
