"""Run-time checking of the spec's PEP 316 contracts.

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
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import FunctionType, ModuleType
from typing import Any

from . import arena, arith, composites, geometry, policy

MODULES = (arith, policy, geometry, arena, composites)
NAMES = {m.__name__ for m in MODULES}


class ContractError(AssertionError):
    """A pre- or postcondition (or the invariant) did not hold."""


def conditions(doc: str | None) -> dict[str, list[str]]:
    """``{"pre": [...], "post": [...], "inv": [...]}`` from a docstring."""
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

    With ``outermost``, a call made from inside another checked method is
    not checked: mid-operation the arena is legitimately between states.
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
        _check("pre", cond["pre"], fn, env)
        if wants_old:
            env["__old__"] = _Old(copy.deepcopy(env))
        env["__return__"] = fn(*args, **kwargs)
        _check("post", cond["post"], fn, env)
        _check("inv", invariants, fn, env)
        return env["__return__"]

    wrapper.__wrapped_contract__ = fn  # type: ignore[attr-defined]  # a mark: checking() wraps no method twice
    return wrapper


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Inside ``checking()``, call the arena's methods unchecked for a while
    (a test's own reads of the state, where the contracts add nothing)."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1


@contextlib.contextmanager
def checking() -> Iterator[None]:
    """Check every spec contract while the block runs."""
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
