"""The capacity memo: epoch-counting fields and a memo emptied on each tick (docs/design.md §5).

A scheduler reads capacity views O(queue) times per step, so the arena
memoises them.  Every field a view depends on is a ``CapField``: a data
descriptor whose ``__set__`` bumps its band's ``epoch`` and, when the band
belongs to an arena, ticks the arena-wide ``Clock`` that all its bands share.
A tick empties every memo on that clock (the arena's and its composite's),
so an entry present is valid by construction and a memoised read is one
dict lookup: no key to compute, no epoch to compare.
Such fields must be *rebound*, never mutated in place (ints are immutable;
tensors held in a ``CapField`` are replaced, not written into).  A write
that goes around the descriptor (``obj.__dict__``) bumps nothing;
``Arena.verify`` catches it as a "stale memo".
"""

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:
    from .band import Band

T = TypeVar("T")
Key = tuple[str, str]  # (view, pool)
Cache = dict[Key, int]


class Clock:
    """The arena-wide epoch, shared by every band of the arena (docs/design.md §5).

    A tick empties the caches on it (nothing reads a count), so a memoised
    read is one lookup."""

    __slots__ = ("caches",)

    def __init__(self) -> None:
        self.caches: list[Cache] = []

    def tick(self) -> None:
        """Empty every cache on this clock; each rebind of a ``CapField`` calls it (docs/design.md §5)."""
        for c in self.caches:
            c.clear()

    @classmethod
    def shared_by(cls, bands: "Iterable[Band]") -> "Clock":
        """A new clock, attached to every band in ``bands`` (docs/design.md §5).

        Args:
            bands: the bands that will share the clock (an arena's bands).

        Returns:
            The new clock.
        """
        clock = cls()
        for b in bands:
            b.clock = clock
        return clock


class CapField(Generic[T]):
    """A capacity-bearing attribute (docs/design.md §5).

    Each rebind bumps ``owner.epoch`` and ticks the owner's arena clock
    (``owner.clock``, once attached).  It has no ``__get__`` at run time, so
    a read is the instance dict's plain lookup, at C speed: the hot paths
    read these fields dozens of times a step.  The typing stub below tells
    type checkers what a read returns."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    if TYPE_CHECKING:

        @overload
        def __get__(self, obj: None, objtype: type | None = None) -> "CapField[T]": ...
        @overload
        def __get__(self, obj: object, objtype: type | None = None) -> T: ...
        def __get__(self, obj: object, objtype: type | None = None) -> "T | CapField[T]": ...

    def __set__(self, obj: object, value: T) -> None:
        d: dict[str, Any] = obj.__dict__
        d[self.name] = value
        d["epoch"] += 1  # the band sets epoch = 0 before its first field
        clock = d.get("clock")
        if clock is not None:
            clock.tick()


class Memo:
    """Cached views by ``(view, pool)`` on a ``Clock`` (docs/design.md §5).

    Every tick of the clock empties ``cache`` (the dict is cleared in place,
    never rebound, so a reader may hold it), so an entry present is valid.
    Readers look ``cache`` up themselves (the hit path is that one lookup)
    and ``put`` what they compute on a miss.

    Args:
        clock: the clock whose ticks empty this memo.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.cache: Cache = {}
        self.misses = 0
        clock.caches.append(self.cache)

    @classmethod
    def shared_by(cls, bands: "Iterable[Band]") -> "Memo":
        """A memo on a new ``Clock`` attached to every band in ``bands`` (docs/design.md §5).

        Args:
            bands: the bands that will share the new clock.

        Returns:
            The new memo.
        """
        return cls(Clock.shared_by(bands))

    def put(self, view: str, pool: str, value: int) -> int:
        """Store a value computed on a miss (computing reads, never ticks; docs/design.md §5).

        Args:
            view: the view's name, e.g. ``"available_pages"``.
            pool: the pool it was computed for.
            value: the computed value.

        Returns:
            ``value``, so a reader can return the ``put`` itself.
        """
        self.misses += 1
        self.cache[view, pool] = value
        return value

    def entries(self) -> list[tuple[str, str, int]]:
        """Every entry, for ``verify`` to recompute (docs/design.md §5).

        Returns:
            ``(view, pool, value)`` for every entry (each is valid: a tick empties them).
        """
        return [(v, p, val) for (v, p), val in self.cache.items()]
