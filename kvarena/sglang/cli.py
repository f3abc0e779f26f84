"""``kvarena sglang check``: SGLang's three unified-memory stacks on this
install, built by SGLang's own factories with kvarena installed, each run
through the byte-checked workload (``workload.py``), then again with
forwards in flight as SGLang's overlap scheduling runs them (the overlap
phase: every write a forward lands late must be kept), then with requests
retracted to the host and resumed while forwards are in flight (the
retraction phase: every byte must come back), then with a speculative
draft's K/V lanes fused into the full entries (the draft phase: the
draft's bytes must survive every relocation as the target's do), then
with HiCache's load-back driven through SGLang's own controller calls
(the HiCache phase: every loaded byte must land where the copy was
resolved to, under SGLang's move gate), then with PD disaggregation
between a prefill node and a decode node through SGLang's own queues and
sender path (the PD phase: every transferred byte must arrive where the
decode node reads it, and no page move while SGLang's gate is closed);
then ``uninstall()``
and the factories build SGLang's allocators again.  Prints what held and
exits non-zero on any failure."""

import argparse
import json
import sys
import time
from pathlib import Path


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("action", choices=["check"], help="check: build the three stacks and run the workload on each")
    c.add_argument("--steps", type=int, default=80, help="workload steps per stack (default 80)")
    c.add_argument(
        "--overlap-steps", type=int, default=40, help="steps per stack in the overlap phase (default 40; 0 skips it)"
    )
    c.add_argument(
        "--extra-buffer-steps",
        type=int,
        default=40,
        help="steps per mamba stack with SGLang's mamba extra buffer on (default 40; 0 skips it)",
    )
    c.add_argument(
        "--retract-steps",
        type=int,
        default=40,
        help="steps per stack in the retraction-to-host phase, with forwards in flight (default 40; 0 skips it)",
    )
    c.add_argument(
        "--draft-steps",
        type=int,
        default=40,
        help="steps per stack with a speculative draft's K/V fused into the full entries, forwards in flight "
        "(default 40; 0 skips it)",
    )
    c.add_argument(
        "--hicache-steps",
        type=int,
        default=40,
        help="steps per stack with HiCache load-backs landing late, forwards in flight (default 40; 0 skips it)",
    )
    c.add_argument(
        "--pd-requests",
        type=int,
        default=8,
        help="requests per stack through PD disaggregation, prefill node to decode node (default 8; 0 skips it)",
    )
    c.add_argument("--page-sizes", type=int, nargs="+", default=[1, 4], help="page sizes (default 1 4)")
    c.add_argument("--policy", choices=["planner", "anchor"], default="planner", help="kvarena's relief policy")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--json", metavar="PATH", help="write the reports")
    c.add_argument(
        "--engine",
        metavar="MODEL_PATH",
        help="instead: the A/B on SGLang's own Engine with this checkpoint, SGLang's allocator then kvarena's "
        "(greedy tokens compared request by request; bytes moved, retractions, time per decode step)",
    )
    c.add_argument("--requests", type=int, default=16, help="--engine: requests, sent at once (default 16)")
    c.add_argument("--new-tokens", type=int, default=24, help="--engine: greedy tokens per request (default 24)")
    c.add_argument("--prompt-tokens", type=int, default=24, help="--engine: tokens per prompt (default 24)")
    c.add_argument(
        "--max-total-tokens",
        type=int,
        default=256,
        help="--engine: the token budget (default 256: tight, so both relieve)",
    )
    c.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--engine: one more of sglang.Engine's keywords (VALUE read as JSON where it parses: "
        "--engine-arg max_mamba_cache_size=96); SGLANG_* settings come from the environment",
    )
    c.add_argument(
        "--plant",
        help="--engine: run kvarena with a planted bug (relocation-skips-the-bytes, translation-one-page-off)",
    )
    c.add_argument(
        "--no-install",
        action="store_true",
        help="fail instead of running `pip install --no-deps sglang==0.5.23` when it is missing",
    )


def run(args: argparse.Namespace) -> int:
    from kvarena.anchor.loader import AnchorUnavailable, ensure_installed

    if args.engine:
        try:
            ensure_installed(allow_install=not args.no_install)
        except AnchorUnavailable as e:
            print(f"kvarena sglang: {e}", file=sys.stderr)
            return 2
        return _engine_ab(args)
    try:
        ensure_installed(allow_install=not args.no_install)
        from . import allocators, factories, stacks, workload

        stacks.runtime_context()
    except AnchorUnavailable as e:
        print(f"kvarena sglang: {e}", file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.table import Table

    factories.install(args.policy)
    built = {kind: type(stacks.build(kind).token_to_kv_pool_allocator) for kind in stacks.KINDS}
    failures = [
        f"{k}: factory built {c.__name__} from {c.__module__}"
        for k, c in built.items()
        if not issubclass(c, allocators.ALLOCATORS)
    ]
    table = Table(title=f"kvarena sglang check: SGLang's stacks on kvarena ({args.policy} policy)")
    for col in (
        "stack",
        "ps",
        "lazy",
        "requests",
        "refused",
        "tokens checked",
        "slots checked",
        "pages moved",
        "bytes",
    ):
        table.add_column(col, justify="left" if col in ("stack", "pages moved", "bytes") else "right")
    reports: list[dict] = []
    t0 = time.perf_counter()
    for kind in stacks.KINDS:
        for ps in args.page_sizes:
            for lazy in (True, False):
                r = workload.run(kind, steps=args.steps, page_size=ps, lazy=lazy, seed=args.seed)
                reports.append({"lazy": lazy, **r.__dict__})
                idle = [n for n, k in r.pages_moved.items() if k == 0]
                moved = " ".join(f"{n} {k}" for n, k in r.pages_moved.items())
                table.add_row(
                    kind,
                    str(ps),
                    "yes" if lazy else "no",
                    str(r.admitted),
                    str(r.refused),
                    f"{r.tokens_checked:,}",
                    f"{r.slots_checked:,}",
                    moved,
                    "intact" if r.ok else "CORRUPTED",
                )
                failures += [f"{kind} ps={ps} lazy={lazy}: {e}" for e in r.errors[:3]]
                if lazy and idle and r.refused:
                    print(f"note: {kind} ps={ps} lazy: no relocation in {', '.join(idle)}")
    console = Console(width=max(Console().width, 110))
    console.print(table)
    if args.extra_buffer_steps:
        failures += _extra_buffer_phase(args, workload, console, reports)
    if args.overlap_steps:
        failures += _overlap_phase(args, workload, stacks, console, reports)
    if args.retract_steps:
        failures += _retraction_phase(args, workload, stacks, console, reports)
    if args.draft_steps:
        failures += _draft_phase(args, workload, stacks, console, reports)
    if args.hicache_steps:
        failures += _hicache_phase(args, workload, stacks, console, reports)
    if args.pd_requests:
        failures += _pd_phase(args, console, reports)
    factories.uninstall()
    back = {kind: type(stacks.build(kind).token_to_kv_pool_allocator) for kind in stacks.KINDS}
    failures += [
        f"{k}: after uninstall the factory still builds kvarena's {c.__name__}"
        for k, c in back.items()
        if issubclass(c, allocators.ALLOCATORS)
    ]
    print(
        f"factories: kvarena's allocators after install(), SGLang's after uninstall(): "
        f"{'ok' if not any('factory' in f for f in failures) else 'FAIL'}"
    )
    return _finish(args, reports, failures, "kvarena sglang check", t0)


def _engine_ab(args: argparse.Namespace) -> int:
    """``--engine MODEL_PATH``: the checkpoint on SGLang's Engine, once per
    allocator (``engine.compare``), each page size of ``--page-sizes``; one
    table row per run."""
    from rich.console import Console
    from rich.table import Table

    from . import engine

    cuda = engine.on_cuda()
    config = json.loads((Path(args.engine) / "config.json").read_text())
    stack = engine.stack_of(config)
    vocab = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size", 1000))
    requests = engine.prompts(args.requests, args.prompt_tokens, args.prompt_tokens // 2, groups=3, vocab=vocab)
    where = "CUDA, SGLang's kernels" if cuda else "CPU: SGLang's CPU engine, Triton interpreted, kvarena's stand-ins"
    table = Table(title=f"kvarena sglang check --engine {args.engine} ({stack or 'unknown'} stack; {where})")
    for col in ("ps", "allocator", "tokens", "pages moved", "bytes moved", "retracted", "decode steps", "s / step"):
        table.add_column(col, justify="left" if col in ("allocator", "tokens", "pages moved") else "right")
    failures, reports = [], []
    t0 = time.perf_counter()
    for ps in args.page_sizes:
        kw = engine.engine_arguments(stack, ps, args.max_total_tokens, cuda=cuda, **_engine_args(args.engine_arg))
        theirs, ours = engine.compare(args.engine, requests, args.new_tokens, kw, plant=args.plant)
        diff = engine.first_difference(ours, theirs)
        for r in (theirs, ours):
            fields = {k: v for k, v in r.__dict__.items() if k != "log"}
            reports.append({"page_size": ps, "same_tokens_as_sglang": diff is None, **fields})
            if r.error:
                failures.append(f"ps={ps} {r.allocator}: {r.error.splitlines()[0] if r.error else ''}")
                print(r.error, file=sys.stderr)
            same = (
                "reference"
                if r is theirs
                else ("equal" if diff is None else f"differ: request {diff[0]} token {diff[1]}")
            )
            moved = " ".join(f"{n} {k}" for n, k in r.pages_moved.items()) or "0"
            table.add_row(
                str(ps),
                r.allocator,
                same,
                moved,
                f"{r.bytes_moved:,}",
                str(r.retracted),
                str(r.decode_steps),
                f"{r.seconds_per_step:.3f}",
            )
        if diff is not None and not ours.error and not theirs.error:
            failures.append(f"ps={ps}: kvarena's tokens differ from SGLang's at request {diff[0]}, token {diff[1]}")
    Console(width=max(Console().width, 110)).print(table)
    return _finish(args, reports, failures, "kvarena sglang check --engine", t0)


def _finish(args: argparse.Namespace, reports: list[dict], failures: list[str], what: str, t0: float) -> int:
    """Write the reports (``--json``), print the failures and the verdict; the exit status."""
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1) + "\n")
    for f in failures:
        print(f"FAIL {f}")
    print(f"{what}: {'FAIL' if failures else 'ok'} ({time.perf_counter() - t0:.0f} s)")
    return 1 if failures else 0


def _engine_args(pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs as keywords, each value read as JSON where it parses (else the string)."""
    kw = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--engine-arg {pair!r}: write KEY=VALUE")
        try:
            kw[key] = json.loads(value)
        except json.JSONDecodeError:
            kw[key] = value
    return kw


def _extra_buffer_phase(args: argparse.Namespace, workload, console, reports: list[dict]) -> list[str]:
    """The mamba stacks again with SGLang's mamba extra buffer on (the
    ping-pong tracking slots its "auto" mamba strategy turns on for
    Qwen3-Next): each request also takes its tracking slots from the state
    band, and their state is checked every step.  Adds the runs to
    ``reports`` and returns the failures."""
    from rich.table import Table

    table = Table(title="extra buffer: the mamba stacks with their tracking slots")
    for col in ("stack", "ps", "lazy", "requests", "refused", "slots checked", "pages moved", "bytes"):
        table.add_column(col, justify="left" if col in ("stack", "pages moved", "bytes") else "right")
    failures = []
    for kind in ("mamba", "mamba_swa"):
        for ps in args.page_sizes:
            for lazy in (True, False):
                r = workload.run(
                    kind, steps=args.extra_buffer_steps, page_size=ps, lazy=lazy, seed=args.seed, extra_buffer=True
                )
                reports.append({"lazy": lazy, "extra_buffer": True, **r.__dict__})
                moved = " ".join(f"{n} {k}" for n, k in r.pages_moved.items())
                row = (kind, str(ps), "yes" if lazy else "no", str(r.admitted), str(r.refused))
                table.add_row(*row, f"{r.slots_checked:,}", moved, "intact" if r.ok else "CORRUPTED")
                failures += [f"extra buffer {kind} ps={ps} lazy={lazy}: {e}" for e in r.errors[:3]]
    console.print(table)
    return failures


def _overlap_phase(args: argparse.Namespace, workload, stacks, console, reports: list[dict]) -> list[str]:
    """The workload again with SGLang's overlap scheduling: each step's
    batch is a forward that lands late (``overlap.Device``), handed to the
    allocator by SGLang's two hooks, while the next batch is prepared.
    Prints, per run, the in-flight writes kept (of those still live when
    their forward landed), the rows the forwards read intact, and the
    settles that waited on a forward; adds the runs to ``reports`` and
    returns the failures."""
    from rich.table import Table

    table = Table(title="overlap phase: forwards land late, as SGLang's overlap scheduling runs them")
    for col in ("stack", "ps", "lazy", "forwards", "in-flight writes kept", "reads intact", "waits", "bytes"):
        table.add_column(col, justify="left" if col in ("stack", "bytes") else "right")
    failures = []
    kept = written = 0
    for kind in stacks.KINDS:
        for ps in args.page_sizes:
            for lazy in (True, False):
                r = workload.run(kind, steps=args.overlap_steps, page_size=ps, lazy=lazy, seed=args.seed, overlap=True)
                reports.append({"lazy": lazy, **r.__dict__})
                kept += r.inflight_writes - r.inflight_lost
                written += r.inflight_writes
                table.add_row(
                    kind,
                    str(ps),
                    "yes" if lazy else "no",
                    str(r.forwards),
                    f"{r.inflight_writes - r.inflight_lost:,} of {r.inflight_writes:,}",
                    f"{r.reads_checked - r.reads_corrupted:,} of {r.reads_checked:,}",
                    str(r.waits),
                    "intact" if r.ok else "CORRUPTED",
                )
                failures += [f"overlap {kind} ps={ps} lazy={lazy}: {e}" for e in r.errors[:3]]
    console.print(table)
    print(f"overlap: {kept:,} of {written:,} in-flight writes kept")
    return failures


def _runs(args: argparse.Namespace, workload, stacks, reports: list[dict], steps: int, lazies=(True, False), **kw):
    """The overlap workload with ``kw`` on every stack, page size and relief
    mode (of ``lazies``): yields ``(label, report)`` per run and adds each to ``reports``."""
    for kind in stacks.KINDS:
        for ps in args.page_sizes:
            for lazy in lazies:
                r = workload.run(kind, steps=steps, page_size=ps, lazy=lazy, seed=args.seed, overlap=True, **kw)
                reports.append({"lazy": lazy, **kw, **r.__dict__})
                yield (kind, str(ps), "yes" if lazy else "no"), r


def _table(title: str, columns: tuple[str, ...]):
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in ("stack", "pages moved", "bytes") else "right")
    return table


def _retraction_phase(args: argparse.Namespace, workload, stacks, console, reports: list[dict]) -> list[str]:
    """The overlap workload with retraction to host (SGLang's PD decode
    ``cpu_tensor`` backup): every fifth step a request of the forward in
    flight is copied to the host (``get_cpu_copy``) and freed, and three
    steps later resumed on fresh pages (``load_cpu_copy``) and compared.
    Adds the runs to ``reports`` and returns the failures."""
    table = _table(
        "retraction phase: requests copied to the host mid-flight, resumed on fresh pages",
        ("stack", "ps", "lazy", "retracted", "resumed", "tokens compared", "pages moved", "bytes"),
    )
    failures = []
    for label, r in _runs(args, workload, stacks, reports, args.retract_steps, retract=True):
        moved = " ".join(f"{n} {k}" for n, k in r.pages_moved.items())
        table.add_row(*label, str(r.retracted), str(r.restored), f"{r.restored_tokens:,}", moved, _bytes(r))
        where = "retraction {} ps={} lazy={}".format(*label)
        failures += [f"{where}: {e}" for e in r.errors[:3]]
        if not r.retracted:
            failures.append(f"{where}: nothing was retracted")
    console.print(table)
    return failures


def _draft_phase(args: argparse.Namespace, workload, stacks, console, reports: list[dict]) -> list[str]:
    """The overlap workload on stacks built with a speculative draft (an
    EAGLE or MTP head) fused into the full sub-pool's entries, the draft
    runner's pool bound by SGLang's own binder: the draft's K/V are written
    and checked with the target's through every relocation.  Adds the runs
    to ``reports`` and returns the failures."""
    table = _table(
        "draft phase: a speculative draft's K/V lanes fused into the target's pages",
        ("stack", "ps", "lazy", "requests", "tokens checked", "in-flight writes kept", "pages moved", "bytes"),
    )
    failures = []
    for label, r in _runs(args, workload, stacks, reports, args.draft_steps, draft=True):
        moved = " ".join(f"{n} {k}" for n, k in r.pages_moved.items())
        kept = f"{r.inflight_writes - r.inflight_lost:,} of {r.inflight_writes:,}"
        table.add_row(*label, str(r.admitted), f"{r.tokens_checked:,}", kept, moved, _bytes(r))
        failures += ["draft {} ps={} lazy={}: ".format(*label) + e for e in r.errors[:3]]
    console.print(table)
    return failures


def _hicache_phase(args: argparse.Namespace, workload, stacks, console, reports: list[dict]) -> list[str]:
    """The overlap workload with HiCache's load-back (``hicache.HostCache``:
    SGLang's own ``HybridCacheController.load``, its SWA callbacks and its
    move gate): every sixth step a prompt is loaded back from the host, and
    three steps later a running request is backed up, each copy landing one
    to three steps later at the rows resolved when it was submitted.  Lazy
    compaction only: SGLang's gate requires it.  Adds the runs to
    ``reports`` and returns the failures."""
    table = _table(
        "HiCache phase: load-backs and backups landing late under SGLang's move gate",
        ("stack", "ps", "lazy", "loads", "tokens loaded", "backups", "rows backed up", "pages moved", "bytes"),
    )
    failures = []
    for label, r in _runs(args, workload, stacks, reports, args.hicache_steps, lazies=(True,), hicache=True):
        moved = " ".join(f"{n} {k}" for n, k in r.pages_moved.items())
        loads, backups = (str(r.loads_landed), f"{r.loaded_tokens:,}"), (str(r.backups), f"{r.backed_up_rows:,}")
        table.add_row(*label, *loads, *backups, moved, _bytes(r))
        where = "hicache {} ps={} lazy={}".format(*label)
        failures += [f"{where}: {e}" for e in r.errors[:3]]
        if not r.loads_landed or not r.backups:
            failures.append(f"{where}: nothing was loaded back or backed up")
    console.print(table)
    return failures


def _pd_phase(args: argparse.Namespace, console, reports: list[dict]) -> list[str]:
    """PD disaggregation (``pd.run``): a prefill node and a decode node, both
    on kvarena, their queues and sender path SGLang's own, the bytes copied
    by a loopback transfer engine; every transferred byte checked where the
    decode node reads it, every decode allocator call under SGLang's closed
    move gate watched, both nodes audited.  The SWA stack again with a
    crowded decode node, whose later requests need relief the gate must
    hold back.  Adds the runs to ``reports`` and returns the failures."""
    from . import pd

    table = _table(
        "PD phase: prefill node to decode node through SGLang's queues, every transferred byte checked",
        ("stack", "ps", "crowded", "requests", "bytes checked", "differ", "calls under gate", "moved", "bytes"),
    )
    failures = []
    prompts = pd.prompts(args.pd_requests)
    runs = [(kind, ps, False) for kind in pd.KINDS for ps in args.page_sizes]
    runs += [("swa", ps, True) for ps in args.page_sizes]
    for kind, ps, crowded in runs:
        r = pd.run(kind, ps, prompts=prompts, crowded=crowded)
        reports.append({"phase": "pd", **r.__dict__})
        counts = (str(r.requests), f"{r.bytes_checked:,}", f"{r.mismatches:,}", str(r.gated_calls))
        table.add_row(kind, str(ps), "yes" if crowded else "no", *counts, str(r.moved_under_gate), _bytes(r))
        where = f"pd {kind} ps={ps}{' crowded' if crowded else ''}"
        problems = r.errors + r.audit
        if r.mismatches:
            problems.append(f"{r.mismatches} of {r.bytes_checked} transferred bytes differ")
        failures += [f"{where}: {e}" for e in problems[:3]]
        if r.requests != len(prompts) or not r.bytes_checked:
            failures.append(f"{where}: {r.requests} of {len(prompts)} requests transferred")
    console.print(table)
    return failures


def _bytes(r) -> str:
    return "intact" if r.ok else "CORRUPTED"
