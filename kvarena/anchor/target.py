"""The anchor as a replay target of ``kvarena vectors`` (``--target anchor``).

Implements the adapter protocol of ``kvarena.verification.vectors`` (``boot``, ``call``,
``observe``) over ``AnchorArena``.  The anchor has the page-level arena
only: a composite case, a ``policy`` other than ``"anchor"``, a relieve
with an evictor (the anchor evicts only in its composites) and a call whose
arguments break the anchor's preconditions (it does not validate ids; a
bad id corrupts its free lists instead of raising) are ``Unsupported``, so
the replay counts them apart and never passes them.
"""

from kvarena.spec import SubPool
from kvarena.verification import vectors

from .adapter import AnchorArena
from .adapter import Unsupported as AdapterUnsupported

VIEWS = ("available_pages", "available_size", "schedulable_available_size", "gap_bytes", "frontiers", "holes")


class AnchorTarget:
    def __init__(self, device="cpu"):
        if device != "cpu":
            raise vectors.Unsupported("the anchor adapter runs on CPU (its Triton paths need tools/cuda_checks.sh)")
        self.arena = None

    def boot(self, allocator, config):
        if allocator != "arena":
            raise vectors.Unsupported(f"the anchor adapter drives the page-level arena, not {allocator}")
        cfg = dict(config)
        if cfg.get("policy", "anchor") != "anchor":
            raise vectors.Unsupported(f"policy {cfg['policy']!r}: the anchor has its own policy only")
        pools = [SubPool(p["name"], p["entry_bytes"], p["page_size"], p["grow"], p["kind"]) for p in cfg["pools"]]
        lazy = cfg.get("lazy", False)
        lazy = set(lazy) if isinstance(lazy, list) else lazy
        try:
            self.arena = AnchorArena(cfg["total_bytes"], pools, lazy=lazy, borrow=cfg.get("borrow"))
        except AdapterUnsupported as e:
            raise vectors.Unsupported(str(e)) from None

    def _check_ids(self, name, ids, live):
        """The anchor's callers must pass ids that are live (``live``) or
        free (not ``live``), distinct and in range; it checks none of it."""
        a = self.arena
        ids = [int(i) for i in ids]
        pages = a.pages(name) if name in a.chain else None
        if pages is None or len(set(ids)) != len(ids):
            raise vectors.Unsupported("bad input: the anchor does not validate it")
        for v in ids:
            if v <= 0 or (v in pages) != live:
                raise vectors.Unsupported("bad input: the anchor does not validate it")
        return ids

    def call(self, call, args):
        a, args = self.arena, dict(args)
        name = args.get("name")
        if name not in a.chain:
            raise vectors.Unsupported("bad input: unknown pool")
        if call == "alloc":
            if args.get("n", 0) < 0:
                raise vectors.Unsupported("bad input: the anchor does not validate it")
            if args.get("ids") is not None:
                ids = self._check_ids(name, args["ids"], live=False)
                lender = a.borrow.get(name)
                if lender is None or any(v not in a.pages(lender) for v in ids) or len(ids) != args["n"]:
                    raise vectors.Unsupported("bad input: the anchor does not validate it")
                return a.alloc(name, args["n"], ids=ids)
            if name in a.borrow:
                raise vectors.Unsupported("bad input: a borrower needs ids")
            return a.alloc(name, args["n"])
        if call == "free":
            ids = self._check_ids(name, args["ids"], live=True)
            for borrower, lender in a.borrow.items():
                if lender == name and any(v in a.pages(borrower) for v in ids):
                    raise vectors.Unsupported("bad input: the id is still bound in its borrower")
            a.free(name, ids)
            return None
        if call == "relieve":
            if args.get("evict") is not None:
                raise vectors.Unsupported("the anchor's page-level ladder has no evictor")
            return a.relieve(name, args["need_pages"])
        if call == "translate":
            return a.translate(name, args["ids"])
        if call in ("flush", "make_room", "compact_holes", "open_short_side"):
            try:
                return getattr(a, call)(**args)
            except AssertionError as e:
                raise vectors.Unsupported(f"bad input: the anchor asserts ({e})") from None
        if call in VIEWS:
            try:
                return getattr(a, call)(name)
            except AdapterUnsupported as e:
                raise vectors.Unsupported(str(e)) from None
        raise vectors.Unsupported(f"the anchor adapter has no call {call!r}")

    def observe(self):
        a = self.arena
        if a.violations():
            raise AssertionError(f"the anchor's own accounting check failed: {a.violations()[:3]}")
        pools = {}
        for n in a.chain:
            pools[n] = {
                "frontiers": list(a.frontiers(n)),
                "pages": sorted([v, p] for v, p in a.pages(n).items()),
                "holes": a.holes(n),
                "available_pages": a.available_pages(n),
                "available_size": a.available_size(n),
                "schedulable_available_size": a.schedulable_available_size(n),
            }
            if n not in a.borrow:
                pools[n]["free_ids"] = a.free_ids(n)
            if a.alloc_of[n].grow_direction != "float":
                pools[n]["gap_bytes"] = a.gap_bytes(n)
        return {"pools": pools, "data_follows": not any(a.misplaced(n) for n in a.chain)}
