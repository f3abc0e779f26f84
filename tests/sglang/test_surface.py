"""Completeness of kvarena's drop-in against SGLang's three allocator classes.

Every method and property SGLang defines on ``UnifiedSWATokenToKVPoolAllocator``,
``UnifiedMambaSWATokenToKVPoolAllocator``, ``UnifiedMambaTokenToKVPoolAllocator``
and their bases (``object`` and ``abc.ABC`` aside) is kvarena's (defined in
the drop-in's modules: ``_Dropin`` and its mixins, ``_SWACalls``, the class), SGLang's
policy kept on purpose (``INHERITED``), or unsupported (``UNSUPPORTED``, raising
``NotImplementedError`` that names the feature).  A member SGLang adds in a
later release falls in none and fails here.  Each ``INHERITED`` member's source
is scanned for what it reads off the allocator and its sub-allocator views, so
SGLang's policy never reaches an attribute kvarena's objects lack.  And
``install()`` / ``uninstall()`` switch what SGLang's factories build.
"""

import abc
import ast
import copy
import importlib
import inspect
import textwrap

import pytest

from kvarena.sglang import dropin, stacks, surface, views

KIND = {  # kvarena's class name -> the stack whose factory builds it
    "UnifiedSWATokenToKVPoolAllocator": "swa",
    "UnifiedMambaSWATokenToKVPoolAllocator": "mamba_swa",
    "UnifiedMambaTokenToKVPoolAllocator": "mamba",
}
FACTORY = {
    "swa": "init_unified_swa_pools",
    "mamba": "init_unified_mamba_pools",
    "mamba_swa": "init_unified_mamba_swa_pools",
}
SMALL = stacks.Geometry(tokens=64, mamba_slots=8, context_len=64)


@pytest.fixture
def A():
    from kvarena.sglang import allocators

    return allocators


def _member(v) -> bool:
    return inspect.isfunction(v) or isinstance(v, (property, staticmethod, classmethod))


def sglang_members(base) -> dict[str, type]:
    """SGLang's methods and properties on ``base`` and its bases: name -> the class that defines it."""
    out: dict[str, type] = {}
    for k in base.__mro__:
        if k in (object, abc.ABC):
            continue
        for name, v in vars(k).items():
            if _member(v):
                out.setdefault(name, k)
    return out


def _is_ours(k) -> bool:
    """One of kvarena's classes: the drop-in's modules', or the subclass ``install()`` makes."""
    return k.__module__.startswith("kvarena.sglang.")


def kvarena_defined(cls, A) -> set[str]:
    """What kvarena's own classes in ``cls``'s MRO define."""
    return {n for k in cls.__mro__ if _is_ours(k) for n in vars(k)}


def unclassified(cls, base, A) -> list[str]:
    """SGLang's members that are in none of kvarena's three sets."""
    mine = kvarena_defined(cls, A)
    return sorted(n for n in sglang_members(base) if n not in mine | surface.INHERITED | set(surface.UNSUPPORTED))


@pytest.mark.parametrize("name", list(KIND))
def test_every_member_is_classified(A, name):
    cls = getattr(A, name)
    base = A._BASE_OF[cls]
    assert issubclass(cls, base)
    assert unclassified(cls, base, A) == []


def test_the_sets_are_disjoint_and_current(A):
    """No member is both kept and refused, and every listed name exists on one of SGLang's classes (a stale name
    would hide a member SGLang renamed)."""
    assert not surface.INHERITED & set(surface.UNSUPPORTED)
    everywhere = set().union(*(sglang_members(base) for base in A._BASE_OF.values()))
    assert sorted(surface.INHERITED - everywhere) == []
    assert sorted(set(surface.UNSUPPORTED) - everywhere) == []


def _stripped(cls, name: str):
    """A copy of ``cls`` whose kvarena classes (it and its kvarena bases) lack ``name``."""
    if not _is_ours(cls):
        return cls
    bases = tuple(_stripped(b, name) for b in cls.__bases__)
    body = {k: v for k, v in vars(cls).items() if k not in (name, "__dict__", "__weakref__")}
    return type(cls.__name__, bases, body)


@pytest.mark.parametrize("name", list(KIND))
def test_planted_every_dropped_override_is_caught(A, name):
    """Remove each of kvarena's overrides in turn from a copy of the class (and of ``_Dropin`` / ``_SWACalls``):
    the completeness check names exactly that member."""
    cls = getattr(A, name)
    base = A._BASE_OF[cls]
    theirs = sglang_members(base)
    overrides = sorted(
        n for n in kvarena_defined(cls, A) & set(theirs) if n not in surface.UNSUPPORTED and n not in surface.INHERITED
    )
    assert {"alloc", "alloc_extend", "free", "clear", "__init__"} <= set(overrides)
    for n in overrides:
        assert unclassified(_stripped(cls, n), base, A) == [n]


# ------------------------------------------------------------------ unsupported


def _built(kind: str):
    from kvarena import sglang as ks

    ks.install()
    try:
        return stacks.build(kind, SMALL, page_size=1, lazy=True)
    finally:
        ks.uninstall()


@pytest.mark.parametrize("name", list(KIND))
def test_unsupported_members_raise_naming_the_feature(A, name):
    cls = getattr(A, name)
    a = _built(KIND[name]).token_to_kv_pool_allocator
    assert type(a).__mro__[1] is cls
    listed = [n for n in surface.UNSUPPORTED if n in sglang_members(A._BASE_OF[cls])]
    assert listed
    for n in listed:
        with pytest.raises(NotImplementedError) as e:
            member = getattr(a, n)  # a property raises here
            member(None, None)
        assert surface.UNSUPPORTED[n] in str(e.value) and n in str(e.value), n


# ------------------------------------------------------- what INHERITED code reads

Objs = list[object]


class Scan:
    """A best-effort reading of SGLang's source: every ``self.X`` (and ``self.<view>.Y``, and aliases such as
    ``fa = self.full_attn_allocator``) that one of SGLang's functions reads, resolved against kvarena's objects;
    calls into SGLang's module helpers and classes that receive the allocator or a view are followed."""

    def __init__(self, A, allocator) -> None:
        self.A, self.allocator, self.problems, self.seen = A, allocator, [], set()

    # which objects are ours, and what reading ``attr`` off one gives
    def _tracked(self, obj) -> bool:
        return isinstance(obj, (dropin._Dropin, views.BandView))

    def _read(self, where: str, obj, attr: str):
        """Record a problem if ``obj.attr`` is not something kvarena provides; the object read, if tracked."""
        if isinstance(obj, views.BandView):
            if not hasattr(obj, attr):
                self.problems.append(f"{where}: {type(obj).__name__} has no {attr!r}")
                return None
            value = getattr(obj, attr)
            return value if self._tracked(value) else None
        if attr in vars(obj):
            value = vars(obj)[attr]
            return value if self._tracked(value) else None
        owner = next((k for k in type(obj).__mro__ if attr in vars(k)), None)
        if owner is None:
            self.problems.append(f"{where}: the allocator has no {attr!r}")
            return None
        if _is_ours(owner):
            if attr in surface.UNSUPPORTED:
                self.problems.append(f"{where}: reaches unsupported {attr!r}")
            return None
        if _member(vars(owner)[attr]) and attr not in surface.INHERITED:
            self.problems.append(f"{where}: reaches SGLang's {owner.__name__}.{attr}, which is not INHERITED")
        return None

    # source handling
    @staticmethod
    def _tree(func):
        func = inspect.unwrap(func)
        node = ast.parse(textwrap.dedent(inspect.getsource(func))).body[0]
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        return func, node

    @staticmethod
    def _chain(node) -> list[str] | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        return [node.id, *reversed(parts)]

    def _resolve(self, env: dict[tuple[str, ...], Objs], chain: list[str], where: str, record: bool = True) -> Objs:
        """The tracked objects ``chain`` names, reading (and checking) each attribute past the known prefix."""
        for cut in range(len(chain), 0, -1):
            if tuple(chain[:cut]) in env:
                objs = env[tuple(chain[:cut])]
                break
        else:
            return []
        for attr in chain[cut:]:
            nxt = []
            for obj in objs:
                got = self._read(where, obj, attr) if record else self._peek(obj, attr)
                if got is not None:
                    nxt.append(got)
            objs = nxt
            if not objs:
                return []
        return objs

    def _peek(self, obj, attr):
        value = getattr(obj, attr, None)
        return value if self._tracked(value) else None

    def _names(self, func, fn) -> dict[str, object]:
        """The function's globals plus what it imports in its body."""
        names = dict(func.__globals__)
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = importlib.import_module(node.module)
                for alias in node.names:
                    names[alias.asname or alias.name] = getattr(mod, alias.name, None)
        return names

    def function(self, func, env: dict[tuple[str, ...], Objs], where: str) -> None:
        key = (getattr(func, "__qualname__", repr(func)), tuple(sorted((k, tuple(map(id, v))) for k, v in env.items())))
        if key in self.seen:
            return
        self.seen.add(key)
        func, fn = self._tree(func)
        env = dict(env)
        parent = {child: node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(fn):  # aliases: ``fa = self.x``, ``fa, sa = self.x, self.y``, ``for m in (self.x, ...)``
            pairs = []
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                t, v = node.targets[0], node.value
                if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) and len(t.elts) == len(v.elts):
                    pairs = list(zip(t.elts, v.elts))
                else:
                    pairs = [(t, v)]
            elif isinstance(node, ast.For) and isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Tuple):
                objs = [o for e in node.iter.elts if (c := self._chain(e)) for o in self._resolve(env, c, where, False)]
                if objs:
                    env[(node.target.id,)] = objs
            for t, v in pairs:
                c = self._chain(v)
                if isinstance(t, ast.Name) and c and (objs := self._resolve(env, c, where, False)):
                    env[(t.id,)] = objs
        names = self._names(func, fn)
        skip = self._guarded_out(fn, env, names, where)
        for node in ast.walk(fn):
            if node in skip:
                continue
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                up = parent.get(node)
                if isinstance(up, ast.Attribute) and up.value is node:
                    continue  # the longest chain is read once
                chain = self._chain(node)
                if chain:
                    self._resolve(env, chain, f"{where} ({func.__qualname__})")
            elif isinstance(node, ast.Call):
                self._call(node, env, names, where)

    def _guarded_out(self, fn, env, names, where: str) -> set[ast.AST]:
        """The nodes under ``if isinstance(x, C):`` where none of the objects ``x`` names is a ``C``."""
        out: set[ast.AST] = set()
        for node in ast.walk(fn):
            test = node.test if isinstance(node, ast.If) else None
            if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"):
                continue
            chain = self._chain(test.args[0])
            objs = self._resolve(env, chain, where, False) if chain else []
            kinds = [
                names.get(c[0]) if (c := self._chain(e)) and len(c) == 1 else None for e in self._elts(test.args[1])
            ]
            known = objs and kinds and all(inspect.isclass(k) for k in kinds)
            if known and not any(isinstance(o, tuple(kinds)) for o in objs):
                out |= {n for stmt in node.body for n in ast.walk(stmt)}
        return out

    @staticmethod
    def _elts(node) -> list[ast.AST]:
        return list(node.elts) if isinstance(node, ast.Tuple) else [node]

    def _call(self, node: ast.Call, env, names, where: str) -> None:
        """Follow a call into SGLang's code that hands it the allocator or a view."""
        args = [self._resolve(env, c, where, False) if (c := self._chain(a)) else [] for a in node.args]
        kwargs = {
            k.arg: self._resolve(env, c, where, False) for k in node.keywords if k.arg and (c := self._chain(k.value))
        }
        if not any(args) and not any(kwargs.values()):
            return
        chain = self._chain(node.func)
        if not chain or chain[0] not in names:
            return
        target = names[chain[0]]
        for attr in chain[1:]:
            target = getattr(target, attr, None)
        if not getattr(target, "__module__", "").startswith("sglang."):
            return
        if inspect.isclass(target):
            self._constructed(target, args, kwargs, where)
        elif inspect.isfunction(inspect.unwrap(target)):
            params = list(inspect.signature(inspect.unwrap(target)).parameters)
            bound = {(p,): objs for p, objs in zip(params, args) if objs}
            bound |= {(k,): objs for k, objs in kwargs.items() if objs and k in params}
            if bound:
                self.function(target, bound, where)

    def _constructed(self, cls, args, kwargs, where: str) -> None:
        """``cls(...)`` given the allocator: the fields its ``__init__`` stores it in, then each method reading them."""
        init = inspect.unwrap(cls.__init__)
        if not inspect.isfunction(init):
            return
        params = list(inspect.signature(init).parameters)[1:]
        given = {p: objs for p, objs in zip(params, args) if objs} | {k: o for k, o in kwargs.items() if o}
        fields: dict[tuple[str, ...], Objs] = {}
        for k in cls.__mro__:
            if "__init__" not in vars(k) or not k.__module__.startswith("sglang."):
                continue
            _, fn = self._tree(vars(k)["__init__"])
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in given:
                    for t in node.targets:
                        if (c := self._chain(t)) and len(c) == 2 and c[0] == "self":
                            fields[("self", c[1])] = given[node.value.id]
        if not fields:
            return
        for k in cls.__mro__:
            if not k.__module__.startswith("sglang."):
                continue
            for name, v in vars(k).items():
                func = v.fget if isinstance(v, property) else v
                if inspect.isfunction(func):
                    self.function(func, fields, f"{where} -> {k.__name__}.{name}")


@pytest.mark.parametrize("name", list(KIND))
def test_inherited_code_reads_only_what_kvarena_provides(A, name):
    cls = getattr(A, name)
    base = A._BASE_OF[cls]
    a = _built(KIND[name]).token_to_kv_pool_allocator
    members = sglang_members(base)
    scan = Scan(A, a)
    mine = kvarena_defined(cls, A)
    kept = sorted(n for n in surface.INHERITED if n in members and n not in mine)
    assert kept
    for n in kept:
        v = vars(members[n])[n]
        func = v.fget if isinstance(v, property) else getattr(v, "__func__", v)
        scan.function(func, {("self",): [a]}, n)
    assert sorted(set(scan.problems)) == []


def _lacking(view, missing: str):
    """``view`` as a view without ``missing`` (the view is shared, not copied)."""

    class Lacking(type(view)):
        def __getattribute__(self, name):
            if name == missing:
                raise AttributeError(name)
            return object.__getattribute__(self, name)

    out = object.__new__(Lacking)
    out.__dict__.update(vars(view))
    return out


def test_planted_the_scan_finds_what_is_missing(A):
    """Planted: the tri-pool's full view without ``free_virtual_ids`` (SGLang's ``_token_id_capacity`` reads it),
    without ``shards_under_dcp`` (read inside the module helper ``full_tokens_before_mamba_recheck`` calls), and a
    function reading an unknown attribute through an alias and reaching an unsupported member: each is reported."""
    built = _built("mamba_swa").token_to_kv_pool_allocator
    theirs = vars(A._BASE_OF[A.UnifiedMambaSWATokenToKVPoolAllocator])
    for missing, member in (
        ("free_virtual_ids", "_token_id_capacity"),
        ("shards_under_dcp", "full_tokens_before_mamba_recheck"),
    ):
        a = copy.copy(built)
        a.full_attn_allocator = _lacking(built.full_attn_allocator, missing)
        scan = Scan(A, a)
        scan.function(theirs[member], {("self",): [a]}, member)
        assert any(f"has no {missing!r}" in p for p in scan.problems), (member, scan.problems)

    def planted(self):
        fa = self.full_attn_allocator
        return fa.no_such_table, self.no_such_count, self._token_end_frontiers(1)

    scan = Scan(A, _built("mamba_swa").token_to_kv_pool_allocator)
    scan.function(planted, {("self",): [scan.allocator]}, "planted")
    assert sorted(p.split(": ", 1)[1] for p in scan.problems) == [
        "BandView has no 'no_such_table'",
        "reaches unsupported '_token_end_frontiers'",
        "the allocator has no 'no_such_count'",
    ]


# ----------------------------------------------------------------- install


@pytest.mark.parametrize("kind", stacks.KINDS)
def test_install_switches_what_the_factories_build(A, kind):
    from kvarena import sglang as ks
    from kvarena.anchor.loader import import_sglang

    pools = import_sglang("sglang.srt.mem_cache.unified_memory_pool")
    ours = {v: k for k, v in KIND.items()}[kind]
    theirs = A._BASE_OF[getattr(A, ours)]
    sglang_factory = getattr(pools, FACTORY[kind])

    ks.install()
    assert ks.installed() and getattr(pools, FACTORY[kind]) is not sglang_factory
    a = stacks.build(kind, SMALL).token_to_kv_pool_allocator
    assert isinstance(a, getattr(A, ours)) and isinstance(a, theirs)
    assert isinstance(a, dropin._Dropin)
    ks.install("anchor")  # installing again changes the policy, not the originals
    assert stacks.build(kind, SMALL).token_to_kv_pool_allocator.policy == "anchor"

    ks.uninstall()
    assert not ks.installed() and getattr(pools, FACTORY[kind]) is sglang_factory
    b = stacks.build(kind, SMALL).token_to_kv_pool_allocator
    assert type(b) is theirs and not isinstance(b, dropin._Dropin)
    ks.uninstall()  # twice is harmless
    assert getattr(pools, FACTORY[kind]) is sglang_factory
