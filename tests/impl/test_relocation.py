"""``make_room``'s slide on the Triton path (docs/design.md §14, "Relocation").

The plan is computed on the device and the bytes and tables move in one
launch (``kernels.move``).  Each case runs one slide on two twins, torch's
kernels and Triton's (under Triton's interpreter on the CPU), and holds
them equal: the result, the snapshot (spans, holes in their order, tables)
and every byte of the buffer (``tests/impl/test_kernels.py``'s
``differences``).  The torch path is the one the differential machine
holds to the spec byte for byte; the machine also draws Triton's for its
slides.  Then: the one host read, the undo after a failed launch, the
engine's mover, and planted off-by-ones in the kernel and in the plan.
"""

import random
from types import SimpleNamespace

import pytest
import torch

from kvarena import impl
from kvarena.impl import Arena, SubPool, kernels
from tests.impl.test_kernels import arena_case, differences, fill, live, needs_triton, planted
from tests.support import mutant_module

pytestmark = needs_triton


def slide(name, side, extra):
    """``make_room(name, side, ...)`` asking ``extra`` pages past the band on
    ``side``; ``"leap"`` asks exactly what a leapfrog reaches."""

    def script(x):
        a = x.arena
        b, epp = a.bands[name], a.geometry(name).epp
        lo, hi = a.frontiers(name)
        below, above = a.below(name), a.above(name)
        band_side = lo - below if side == "low" else above - hi
        if extra == "leap":
            r_lo, r_hi = a.region(name)
            want = (r_hi - b.live) * epp - below if side == "low" else above - (r_lo + b.live) * epp
        else:
            want = band_side + extra * epp
        moved = a.make_room(name, side, want)
        return moved, a.frontiers(name), a.bands[name].holes

    return script


def moved_some(build, script):
    """The slide moves a page (else it is no test of the kernel)."""
    x = build()
    x.arena.kernels = "triton"
    return script(x)[0] > 0


EXTRAS = (1, 3, 5, "leap")


@pytest.mark.parametrize("flight", [False, True])
@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("side", ["low", "high"])
@pytest.mark.parametrize("name", ["F", "swa"])
@pytest.mark.parametrize("ps", [1, 4])
def test_a_slide_matches_torch(ps, name, side, extra, flight):
    """A boundary slide (into holes, then the gap) and a leapfrog, each side,
    with holes in the float, a borrower (swa) and an END lender, a forward in
    flight or not: the twins agree; the Triton twin launched the move."""
    build, script = arena_case(ps, 3, True, flight), slide(name, side, extra)
    diffs, names = differences(build, script)
    assert not diffs, "\n".join(diffs[:6])
    assert names.count("move_kernel") == (1 if moved_some(build, script) else 0), names


def test_the_cases_move_pages_and_reach_both_destinations():
    """The cases above are the ones meant: slides that move pages into holes
    and past the span, and one whose cleared pages are all holes (it moves
    none, and the span shrinks)."""
    build = arena_case(4, 3, True)
    kinds = set()
    for side in ("low", "high"):
        for extra in EXTRAS:
            x = build()
            x.arena.kernels = "triton"
            b = x.arena.bands["F"]
            holes, span = set(b.holes.tolist()), (b.lo, b.hi)
            pages = set(x.arena.v2p("F").tolist())
            moved, _, _ = slide("F", side, extra)(x)
            now = set(x.arena.v2p("F").tolist())
            if not moved:
                kinds.add("none")
                assert x.arena.frontiers("F") != tuple(p * x.arena.geometry("F").epp for p in span)
            new = now - pages
            kinds |= {"hole" for p in new if p in holes} | {"gap" for p in new if not span[0] <= p < span[1]}
    assert kinds == {"hole", "gap", "none"}


def wide_arena(entry_bytes, pages, freed=5, device="cpu"):
    """Two ENDs and one float ``f`` of ``entry_bytes``-byte pages, 12 of them
    allocated and ``freed`` of those freed in a shuffled order."""

    def build():
        a = Arena(
            entry_bytes * pages,
            [
                SubPool("U", entry_bytes, 1, "up"),
                SubPool("f", entry_bytes, 1, "float"),
                SubPool("D", entry_bytes, 1, "down"),
            ],
            kernels="torch",
            device=device,
        )
        a.alloc("U", 2)
        a.alloc("D", 2)
        ids = a.alloc("f", 12).tolist()
        fill(a)
        a.free("f", random.Random(entry_bytes).sample(ids, freed))
        return SimpleNamespace(arena=a)

    return build


@pytest.mark.parametrize("entry_bytes", [3, 6, 8 * kernels.MOVE_CHUNK * 2 + 8])
@pytest.mark.parametrize("side", ["low", "high"])
def test_words_of_every_width_and_pages_of_many_chunks(entry_bytes, side):
    """Rows of bytes (3), of 2-byte words (6) and a page past two chunks of
    int64 words (its last chunk partial): every byte moves."""
    build = wide_arena(entry_bytes, 64)
    for extra in (3, "leap"):
        diffs, names = differences(build, slide("f", side, extra))
        assert not diffs and "move_kernel" in names, (diffs[:4], names)


@pytest.mark.parametrize("side", ["low", "high"])
def test_a_leapfrog_with_no_hole_moves_two_runs(side):
    """A span with no hole, wholly outside its target: the sets are two runs
    the host knows (no read, ``test_host_reads``), and the twins agree."""
    build = wide_arena(64, 64, freed=0)
    x = build()
    assert x.arena.bands["f"].n_holes == 0
    diffs, names = differences(build, slide("f", side, "leap"))
    assert not diffs and names == ["move_kernel"], (diffs[:4], names)


def host_reads(monkeypatch, x, script):
    """The device reads ``script(x)`` makes: ``tolist``, ``int``, ``bool`` and ``nonzero`` of a tensor."""
    count = [0]

    def counted(real):
        def f(*a, **k):
            count[0] += 1
            return real(*a, **k)

        return f

    with monkeypatch.context() as m:
        for owner, name in (
            (torch.Tensor, "tolist"),
            (torch.Tensor, "__int__"),
            (torch.Tensor, "__bool__"),
            (torch, "nonzero"),
        ):
            m.setattr(owner, name, counted(getattr(owner, name)))
        assert script(x)[0] > 0
    return count[0]


def test_host_reads(monkeypatch):
    """The slide reads the device once: the count that sizes the launch,
    with the span and holes it leaves; a hole-free leapfrog reads nothing;
    the torch path reads more."""
    reads = {}
    for kind in ("torch", "triton"):
        x = arena_case(4, 3, True)()
        x.arena.kernels = kind
        reads[kind] = host_reads(monkeypatch, x, slide("F", "low", 3))
        x = wide_arena(64, 64, freed=0)()
        x.arena.kernels = kind
        reads[kind, "leap"] = host_reads(monkeypatch, x, slide("f", "high", "leap"))
    assert reads["triton"] == 1 and reads["triton", "leap"] == 0, reads
    assert reads["torch"] > 1 and reads["torch", "leap"] > 0, reads


def test_with_a_mover_the_bytes_go_through_it():
    """With an engine's mover (SGLang's page copy) the plan is still the
    device's, and the mover gets the pairs in one call."""
    calls = []

    def build():
        x = arena_case(4, 3, True)()
        a = x.arena
        rows = {n: a.page_view(n) for n in a.chain}

        def mover(name, dst, src):
            calls.append((name, dst.numel()))
            rows[name].index_copy_(0, dst, rows[name].index_select(0, src))

        a.mover = mover
        return x

    diffs, names = differences(build, slide("F", "high", 3))
    assert not diffs and "move_kernel" not in names, (diffs[:4], names)
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0][1] > 0, calls  # once a twin


def test_a_failed_launch_changes_nothing(monkeypatch):
    """The move's launch raising leaves the state and bytes as they were; the
    same slide then runs as torch's does."""
    build, script = arena_case(4, 3, True, True), slide("F", "low", "leap")

    def run(x):
        if x.arena.kernels == "triton":
            before, data = x.arena.snapshot(), x.arena.buffer.clone()
            real = kernels.launch

            def launch(kernel, *args, **kw):
                if kernel.fn.__name__ == "move_kernel":
                    raise RuntimeError("planted launch failure")
                real(kernel, *args, **kw)

            with monkeypatch.context() as m:
                m.setattr(kernels, "launch", launch)
                with pytest.raises(RuntimeError, match="planted"):
                    script(x)
            assert x.arena.snapshot() == before and torch.equal(x.arena.buffer, data)
            x.arena.verify()
        return script(x)

    diffs, _ = differences(build, run)
    assert not diffs, diffs[:4]


# ------------------------------------------------------------ planted bugs

# In the kernel (``impl/triton_kernels.py``): a regular expression, its replacement.
KERNEL_PLANTS = {
    "last word": (r"m = w < words\n", "m = w < words - 1\n"),
    "id's page": (r"tl\.store\(v2p \+ tl\.maximum\(vid, 0\), d,", "tl.store(v2p + tl.maximum(vid, 0), d + 1,"),
    "source kept": (r"tl\.store\(p2v \+ s, -1\)", "tl.store(p2v + s, vid)"),
}

# In the plan (``Arena._slide_on_device``): one source edit, and a slide it shows on.
PLAN_PLANTS = {
    "hole index": ("ordered[(below + r).clamp_max(nh)]", "ordered[(below + r + 1).clamp_max(nh)]", ("low", 1)),
    "gap below": ("lo - gap + r", "lo - gap + r - 1", ("high", 5)),
    "span end": (
        "torch.maximum(last_held, last), last_held) + 1",
        "torch.maximum(last_held, last), last_held) + 2",
        ("low", 5),
    ),
    "leapfrog target": (
        "first = region_hi - n if low else region_lo",
        "first = region_hi - n - 1 if low else region_lo",
        ("low", "leap"),
    ),
}


@pytest.mark.parametrize("plant", list(KERNEL_PLANTS))
def test_a_planted_kernel_bug_is_caught(monkeypatch, tmp_path, plant):
    old, new = KERNEL_PLANTS[plant]
    mod = planted(tmp_path, old, new)
    monkeypatch.setattr(kernels, "_triton", lambda: mod)
    diffs, names = differences(arena_case(4, 3, True), slide("F", "low", 3))
    assert "move_kernel" in names and diffs, plant


@pytest.mark.parametrize("plant", list(PLAN_PLANTS))
def test_a_planted_plan_bug_is_caught(monkeypatch, plant):
    old, new, (side, extra) = PLAN_PLANTS[plant]
    build, script = arena_case(4, 3, True), slide("F", side, extra)
    assert not differences(build, script)[0]
    mutant = mutant_module(impl.arena, old, new)
    monkeypatch.setattr(Arena, "_slide_on_device", mutant.Arena._slide_on_device)
    diffs, _ = differences(build, script)
    assert diffs, plant


def test_the_prewarm_launches_the_move_once_a_word_type():
    a = arena_case(4, 1, True)().arena
    a.kernels = "triton"
    launched = []
    with kernels.wrapped(lambda kernel, go: (launched.append(kernel.fn.__name__), go())):
        a.prewarm()
    assert launched.count("move_kernel") == len({a._page_rows(n).dtype for n in a.chain}) == 1
    assert live(a, "F")  # untouched: the arena still holds its pages


def test_a_planted_bug_in_the_two_runs_is_caught(monkeypatch):
    build, script = wide_arena(64, 64, freed=0), slide("f", "low", "leap")
    assert not differences(build, script)[0]
    old = "src, dst, k = b.pages(lo, hi), b.pages(first, first + n), n"
    mutant = mutant_module(impl.arena, old, old.replace("b.pages(lo, hi)", "b.pages(lo + 1, hi + 1)"))
    monkeypatch.setattr(Arena, "_slide_on_device", mutant.Arena._slide_on_device)
    assert differences(build, script)[0]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("freed", [0, 5])
@pytest.mark.parametrize("side", ["low", "high"])
def test_a_slide_on_cuda_matches_torch(side, freed):
    """Compiled on a GPU: boundary slides and leapfrogs of pages past two
    chunks, with holes and without (the two runs), as torch's path leaves them."""
    build = wide_arena(8 * kernels.MOVE_CHUNK * 2 + 8, 64, freed=freed, device="cuda")
    for extra in (3, "leap"):
        diffs, names = differences(build, slide("f", side, extra))
        assert not diffs and "move_kernel" in names, (diffs[:4], names)
