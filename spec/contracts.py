"""Run-time checking of the spec's PEP 316 contracts (docs/design.md §7).

The spec states its contracts in docstrings (``pre:``, ``post:``, and the
class invariant ``inv:``), the style ``crosshair check`` reads.  This module
evaluates the same lines at run time, so tests and ``kvarena verify`` check
exactly what CrossHair checks: there is one statement of each contract.

``checking()`` is a context manager that wraps every contract-bearing
function of the spec for its duration and restores them afterwards.
"""

import contextlib
import copy
import functools
import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import FunctionType, ModuleType
from typing import Any

from . import arena, arith, composites, geometry, policy

MODULES = (arith, policy, geometry, arena, composites)
NAMES = {m.__name__ for m in MODULES}


class ContractError(AssertionError):
    """A pre- or postcondition (or the invariant) did not hold (docs/design.md §7).

    The message names the function, the kind of condition, the expression
    and the arguments it was evaluated with.
    """


def conditions(doc: str | None) -> dict[str, list[str]]:
    """The contract lines of a docstring, by kind (docs/design.md §7).

    A line is a condition when its text before the first colon is ``pre``,
    ``post`` or ``inv`` and an expression follows; every other line (the
    prose, the Google sections, CrossHair's ``raises``) is skipped.

    Args:
        doc: a docstring, or None (no conditions).

    Returns:
        ``{"pre": [...], "post": [...], "inv": [...]}``: each kind's
            expressions, in the order written.
    """
    found: dict[str, list[str]] = {"pre": [], "post": [], "inv": []}
    for line in (doc or "").splitlines():
        head, _, expr = line.strip().partition(":")
        if head in found and expr.strip():
            found[head].append(expr.strip())
    return found


# ``env``: a checked call's arguments by name, with ``__return__`` and
# ``__old__``; values of any type, hence ``Any``.
def _check(kind: str, exprs: Iterable[str], fn: FunctionType, env: dict[str, Any]) -> None:
    for expr in exprs:
        if not eval(expr, {**fn.__globals__, **env}):  # one dict: genexprs see the names
            raise ContractError(f"{fn.__qualname__}: {kind} failed: {expr}  with {_show(env)}")


def _show(env: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in env.items() if k not in ("self", "__old__") and not k.startswith("_")}


class _Old:
    def __init__(self, env: dict[str, Any]) -> None:
        self.__dict__.update(env)


_depth = [0]  # nesting of method calls: only the outermost one is checked


def checked(fn: FunctionType, invariants: Sequence[str] = (), outermost: bool = False) -> Callable[..., Any]:
    """Wrap ``fn`` so its docstring contract (and ``invariants``) are checked.

    docs/design.md §7, contracts: the preconditions are evaluated on the
    bound arguments, the postconditions and ``invariants`` on them plus
    ``__return__`` and, where a postcondition reads it, ``__old__`` (a deep
    copy of the arguments taken before the call).  A failed condition is a
    ``ContractError``.  A one-shot iterator argument is read into a list
    for the conditions, and the call gets an iterator over the same items: a
    condition that read it after the call would otherwise see it empty.

    With ``outermost``, a call made from inside another checked method is
    not checked: mid-operation the arena is legitimately between states.

    Args:
        fn: the function or method whose docstring states the contract.
        invariants: class invariants (``inv:`` expressions) to check after
            each call as well, for a method.
        outermost: check only calls not made from inside another checked call.

    Returns:
        The wrapper, or ``fn`` itself when there is nothing to check.
    """
    cond = conditions(fn.__doc__)
    if not any(cond.values()) and not invariants:
        return fn
    sig = inspect.signature(fn)
    wants_old = any("__old__" in p for p in cond["post"])

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if outermost and _depth[0]:
            return fn(*args, **kwargs)
        _depth[0] += outermost
        try:
            return _call(args, kwargs)
        finally:
            _depth[0] -= outermost

    def _call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        env = dict(bound.arguments)
        for name, value in env.items():
            if isinstance(value, Iterator):  # one pass only: the call gets a twin, the conditions a list
                bound.arguments[name], twin = itertools.tee(value)
                env[name] = list(twin)
        _check("pre", cond["pre"], fn, env)
        if wants_old:
            env["__old__"] = _Old(copy.deepcopy(env))
        env["__return__"] = fn(*bound.args, **bound.kwargs)
        _check("post", cond["post"], fn, env)
        _check("inv", invariants, fn, env)
        return env["__return__"]

    wrapper.__wrapped_contract__ = fn  # type: ignore[attr-defined]  # a mark: checking() wraps no method twice
    return wrapper


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Inside ``checking()``, call the arena's methods unchecked for a while
    (a test's own reads of the state, where the contracts add nothing;
    docs/design.md §7).

    Yields:
        None; the block runs as if nested in a checked call.
    """
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1


@contextlib.contextmanager
def checking() -> Iterator[None]:
    """Check every spec contract while the block runs (docs/design.md §7).

    Every contract-bearing function of the spec's modules is wrapped, once
    even where another module imported it, and every public method of a
    class with an ``inv:`` is checked with that invariant (outermost calls
    only; ``verify`` is the invariant and is left alone).  On exit, however
    the block ends, every original is put back.

    Yields:
        None; the block runs with the contracts checked.
    """
    saved: list[tuple[ModuleType | type, str, object]] = []  # (owner, name, what it held; None: inherited)
    try:
        # one wrapper per function, also where another module imported it
        wrapped: dict[FunctionType, Callable[..., Any]] = {}
        for mod in MODULES:
            for name, obj in list(vars(mod).items()):
                if inspect.isfunction(obj) and obj.__module__ in NAMES:
                    w = wrapped.setdefault(obj, checked(obj))
                    if w is not obj:
                        saved.append((mod, name, obj))
                        setattr(mod, name, w)
        # Every class with an ``inv:`` (the arena, each composite): its public
        # methods, inherited ones included, checked with that invariant.
        for mod in MODULES:
            for cls in [c for c in vars(mod).values() if inspect.isclass(c) and c.__module__ == mod.__name__]:
                inv = conditions(cls.__doc__)["inv"]
                if not inv:
                    continue
                for name in dir(cls):
                    obj = getattr(cls, name)
                    if (
                        inspect.isfunction(obj)
                        and not name.startswith("_")
                        and name != "verify"
                        and obj.__module__ in NAMES
                        and not hasattr(obj, "__wrapped_contract__")
                    ):
                        saved.append((cls, name, vars(cls).get(name)))
                        # only the outermost call: a composite's operation passes
                        # through arena states (and trial copies) of its own
                        setattr(cls, name, checked(obj, inv, outermost=True))
        yield
    finally:
        for owner, name, obj in reversed(saved):
            if obj is None:
                delattr(owner, name)  # it was inherited: uncover the base's
            else:
                setattr(owner, name, obj)
