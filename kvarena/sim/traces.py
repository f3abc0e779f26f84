"""Serving traces: requests ``(arrival, prompt_len, output_len)``.

Arrivals are in seconds (the simulator's clock, ``kvarena.sim.timing``);
lengths in tokens.  Four generated kinds, each from a documented length
distribution (seeded, so a trace is reproducible):

============  ==============================================  ====================================
kind          prompt tokens                                   output tokens
============  ==============================================  ====================================
balanced      lognormal, median 1,024, sigma 1.0, [16, 16,384]  median 256, sigma 0.8, [16, 2,048]
long          lognormal, median 8,192, sigma 0.6, [1,024, 32,768]  median 256, sigma 0.6, [16, 2,048]
short         lognormal, median 128, sigma 0.6, [16, 1,024]    median 128, sigma 0.6, [16, 1,024]
shift         ``short`` for the first half, then ``long``      (as those)
============  ==============================================  ====================================

and ``phases``, chat and long-context phases alternating (below).

Three more kinds take their lengths from public datasets' published
summaries (``PUBLISHED``, each with its source): ``sharegpt`` and
``mooncake`` are single requests, ``lmsys`` is multi-turn chat, whose turn
``k + 1`` arrives when turn ``k`` finishes (no think time) with the whole
conversation so far as its prompt: the prefix a cache can reuse
(``blocks``, ``kvarena.sim.prefix``).  Where a source gives only means, the
shape is lognormal with an assumed sigma (the median follows: ``mean *
exp(-sigma**2 / 2)``); the table says which figures are published and which
assumed.

Arrivals (``ARRIVALS``): ``saturating``, every request at time 0, so a queue
builds and memory, not arrivals, limits how many requests run; ``poisson``
at ``rate`` requests a second; ``bursty``, the same mean rate with gamma
gaps of squared coefficient of variation ``BURST_CV2`` (bursts and lulls).
A seed's lengths are the same under every arrival process and rate (their
own random stream), so a sweep over rates serves the same requests.
``read_jsonl`` reads any other trace, one JSON object a line with those
three fields.

**Phases** (``phases``): where a static split, tuned once at boot, must lose
to one buffer, the mix of memory kinds shifting over time.  The trace
alternates a **chat** phase (``PHASE_MIXES["chat"]``: many short requests,
state-heavy on a model with recurrent state, and fitting inside a 1,024-token
sliding window: prompt and output at most 512 tokens each) with a
**long-context** phase (``PHASE_MIXES["long"]``: documents of 12,288 to
32,768 prompt tokens with short outputs: KV-heavy), ``PHASE_REPEATS`` times
(chat, long, chat, long).  Each request carries its phase's index
(``Request.phase``; -1 in every other kind).

The phases are sized by **work**, not by count, so that each takes about
the same time on a memory-bound run.  A request's work is its
``output_len`` times the memory it holds while it decodes, its
**footprint**: on a memory-bound run the buffer is full, so a decode
iteration costs about the same whatever runs (it reads about the buffer),
and the iterations a phase takes are its work over the buffer.  Prefill is
not counted (a document's prefill makes its phase somewhat longer).
``generate(..., footprint=f)`` takes the footprint as ``f(prompt_len,
output_len)`` in any unit, ``footprint(preset)`` gives a model's in bytes
(its state, its full KV and its window's SWA at the mean length held,
``prompt + output / 2``); without one it is that length in tokens, a model
with full attention only.

``n`` is the number of requests in all, approximately: each chat phase has
``chat_n`` chats, with ``chat_n`` chosen so that ``PHASE_REPEATS`` pairs of
a chat phase and the long phase that matches its work come to ``n`` at the
mixes' mean work (``_per_request_work``), at least one a phase; each long
phase then takes documents until its work is closest to its own chat
phase's (so the two differ by at most half of one document's work).

Arrivals: saturating, every request at time 0, queued in phase order.  At a
``rate``, the rate **cycles**: the run spans ``len(trace) / rate`` seconds
(the mean rate is ``rate``), each phase the same share of it, so each
phase's own rate is its requests over its span; within a span the gaps are
Poisson's or bursty's (``BURST_CV2``), scaled so that the phase's arrivals
end inside its own span.
"""

import json
import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    rid: int
    arrival: float
    prompt_len: int
    output_len: int
    # Prefix caching (``kvarena.sim.prefix``): the keys of the whole blocks of
    # ``block_tokens`` tokens that this request's prompt and output fill, in
    # order; two requests share a prefix exactly as far as their keys agree.
    blocks: tuple = ()
    block_tokens: int = 0
    after: int = -1  # a later turn: arrives no earlier than request ``after`` finishes
    phase: int = -1  # the ``phases`` kind: the index of the phase it belongs to (-1: no phases)


@dataclass(frozen=True)
class Mix:
    prompt_median: int
    prompt_sigma: float
    prompt_range: tuple
    output_median: int
    output_sigma: float
    output_range: tuple


MIXES = {
    "balanced": Mix(1024, 1.0, (16, 16_384), 256, 0.8, (16, 2048)),
    "long": Mix(8192, 0.6, (1024, 32_768), 256, 0.6, (16, 2048)),
    "short": Mix(128, 0.6, (16, 1024), 128, 0.6, (16, 1024)),
}


@dataclass(frozen=True)
class Published:
    """Lengths from a dataset's published summary.  ``*_median`` and
    ``*_sigma`` are a lognormal's; ``turns`` is the mean turns a conversation
    (1: single requests; more: geometric turn counts)."""

    source: str
    prompt_median: float
    prompt_sigma: float
    prompt_range: tuple
    output_median: float
    output_sigma: float
    output_range: tuple
    turns: float = 1.0


def _median(mean, sigma):
    """A lognormal's median from its mean and sigma."""
    return mean * math.exp(-(sigma**2) / 2)


ASSUMED_SIGMA = 1.0  # where a source publishes means only
PUBLISHED = {
    "sharegpt": Published(
        "Kwon et al., 'Efficient Memory Management for Large Language Model Serving with PagedAttention', "
        "SOSP 2023, section 6.1 and figure 11: ShareGPT means 161.31 input and 337.99 output tokens. "
        "Sigma 1.0 assumed; range as vLLM's ShareGPT benchmark filter (prompts up to 1,024 tokens)",
        _median(161.31, ASSUMED_SIGMA),
        ASSUMED_SIGMA,
        (4, 1024),
        _median(337.99, ASSUMED_SIGMA),
        ASSUMED_SIGMA,
        (4, 2048),
    ),
    "lmsys": Published(
        "Zheng et al., 'LMSYS-Chat-1M: A Large-Scale Real-World LLM Conversation Dataset', ICLR 2024, table 1: "
        "2.0 turns a conversation, 69.5 tokens a user prompt and 214.5 a response (means). Sigma 1.0 and "
        "geometric turn counts assumed",
        _median(69.5, ASSUMED_SIGMA),
        ASSUMED_SIGMA,
        (1, 4096),
        _median(214.5, ASSUMED_SIGMA),
        ASSUMED_SIGMA,
        (1, 2048),
        turns=2.0,
    ),
    "mooncake": Published(
        "Qin et al., 'Mooncake: Trading More Storage for Less Computation', FAST 2025: its published "
        "conversation trace (github.com/kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl, "
        "12,031 requests), fitted here: input median 6,909, log-sd 1.199, range [891, 126,195]; "
        "output median 350, log-sd 1.358, range [1, 2,000]",
        6909,
        1.199,
        (891, 126_195),
        350,
        1.358,
        (1, 2000),
    ),
}
# A generated chat trace's prefix blocks: one page of the default page size.
# A turn's blocks cover its conversation so far, its last partly filled block
# included (the simulator holds whole pages), so the next turn may be
# credited at most one page more than it truly shares.
CHAT_BLOCK_TOKENS = 16
MAX_TURNS = 32
# The ``phases`` kind (module docstring): its two phase mixes, alternated
# chat first, PHASE_REPEATS times.
PHASE_MIXES = {
    "chat": Mix(128, 0.6, (16, 512), 128, 0.6, (16, 512)),
    "long": Mix(20_000, 0.3, (12_288, 32_768), 128, 0.6, (16, 512)),
}
PHASE_CYCLE = ("chat", "long")
PHASE_REPEATS = 2
KINDS = ("balanced", "long", "short", "shift", *PUBLISHED, "phases")
ARRIVALS = ("saturating", "poisson", "bursty")
BURST_CV2 = 4.0  # squared coefficient of variation of a bursty trace's gaps (Poisson: 1)


def _length(rng, median, sigma, bounds):
    lo, hi = bounds
    return min(hi, max(lo, round(rng.lognormvariate(math.log(median), sigma))))


def arrival_times(n, arrivals="saturating", rate=None, seed=0):
    """``n`` arrival times in seconds, ascending (see the module docstring)."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"unknown arrivals {arrivals!r}; arrivals: {', '.join(ARRIVALS)}")
    if arrivals == "saturating":
        return [0.0] * n
    if rate is None or not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"arrivals {arrivals!r}: rate must be a number > 0 (requests a second), got {rate!r}")
    rng = random.Random(f"arrivals/{arrivals}/{seed}")
    out, t = [], 0.0
    shape = 1 / BURST_CV2
    for _ in range(n):
        t += rng.expovariate(rate) if arrivals == "poisson" else rng.gammavariate(shape, 1 / (rate * shape))
        out.append(t)
    return out


def generate(kind, n, seed=0, arrivals="saturating", rate=None, footprint=None):
    """``n`` requests of trace ``kind`` (see the module docstring); the
    ``phases`` kind about ``n``, sized by ``footprint(prompt_len,
    output_len)`` (None: the tokens held; other kinds ignore it)."""
    if kind not in KINDS:
        raise ValueError(f"unknown trace {kind!r}; traces: {', '.join(KINDS)}")
    if n < 1:
        raise ValueError(f"trace {kind!r}: n must be >= 1, got {n}")
    if kind == "phases":
        return _phases(n, seed, arrivals, rate, footprint)
    times = arrival_times(n, arrivals, rate, seed)
    rng = random.Random(f"{kind}/{seed}")
    if kind in PUBLISHED:
        return _published(PUBLISHED[kind], n, rng, times)
    out = []
    for i in range(n):
        mix = MIXES[("short" if i < n // 2 else "long") if kind == "shift" else kind]
        out.append(
            Request(
                i,
                times[i],
                _length(rng, mix.prompt_median, mix.prompt_sigma, mix.prompt_range),
                _length(rng, mix.output_median, mix.output_sigma, mix.output_range),
            )
        )
    return out


def footprint(p):
    """Preset ``p``'s footprint for ``generate``: the bytes a request of
    ``(prompt_len, output_len)`` holds at the mean length it decodes at,
    ``prompt + output / 2``: its state, full KV over that length and SWA
    over at most the window (``kvarena.sim.presets.Preset``)."""

    def f(prompt_len, output_len):
        held = prompt_len + output_len / 2
        return p.state_bytes + p.full_bytes * held + p.swa_bytes * min(held, p.window + 1)

    return f


def _tokens_held(prompt_len, output_len):
    return prompt_len + output_len / 2


ESTIMATE_SAMPLES = 4096  # draws per mix for the mean work that sizes the chat phases


def _work(footprint, prompt_len, output_len):
    return output_len * footprint(prompt_len, output_len)


def _per_request_work(mix, footprint):
    """A phase mix's mean work a request, over a fixed sample (its own
    stream: the same for every seed)."""
    rng = random.Random("phases/estimate")
    total = 0.0
    for _ in range(ESTIMATE_SAMPLES):
        p = _length(rng, mix.prompt_median, mix.prompt_sigma, mix.prompt_range)
        o = _length(rng, mix.output_median, mix.output_sigma, mix.output_range)
        total += _work(footprint, p, o)
    return total / ESTIMATE_SAMPLES


def phase_lengths(n, seed=0, footprint=None):
    """The ``phases`` kind's lengths: one list of ``(prompt_len,
    output_len)`` a phase, in order (the module docstring); arrivals play no
    part, so they are the same under every arrival process and rate."""
    fp = footprint or _tokens_held
    chat, long = PHASE_MIXES["chat"], PHASE_MIXES["long"]
    w_chat, w_long = _per_request_work(chat, fp), _per_request_work(long, fp)
    if not (w_chat > 0 and w_long > 0):
        raise ValueError(f"trace 'phases': a footprint must be > 0, got mean work {w_chat} (chat), {w_long} (long)")
    # a pair of phases: chat_n chats and chat_n * w_chat / w_long documents
    chat_n = max(1, round(n / PHASE_REPEATS / (1 + w_chat / w_long)))
    rng = random.Random(f"phases/{seed}")

    def draw(mix):
        p = _length(rng, mix.prompt_median, mix.prompt_sigma, mix.prompt_range)
        return p, _length(rng, mix.output_median, mix.output_sigma, mix.output_range)

    out = []
    for _ in range(PHASE_REPEATS):
        chats = [draw(chat) for _ in range(chat_n)]
        target = sum(_work(fp, p, o) for p, o in chats)
        docs = [draw(long)]
        work = _work(fp, *docs[0])
        while work < target:
            nxt = draw(long)
            w = _work(fp, *nxt)
            if work + w - target > target - work:  # the next one would overshoot more than stopping falls short
                break
            docs.append(nxt)
            work += w
        out += [chats, docs]
    return out


def phase_arrivals(counts, arrivals="saturating", rate=None, seed=0):
    """Arrival times for phases of ``counts`` requests, one list a phase: at
    0, or at a ``rate`` that cycles (each phase the same span of
    ``sum(counts) / rate / len(counts)`` seconds; the module docstring)."""
    if arrivals not in ARRIVALS:
        raise ValueError(f"unknown arrivals {arrivals!r}; arrivals: {', '.join(ARRIVALS)}")
    if arrivals == "saturating":
        return [[0.0] * c for c in counts]
    if rate is None or not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"arrivals {arrivals!r}: rate must be a number > 0 (requests a second), got {rate!r}")
    span = sum(counts) / rate / len(counts)
    rng = random.Random(f"arrivals/{arrivals}/{seed}/phases")
    shape = 1 / BURST_CV2
    out = []
    for k, c in enumerate(counts):
        # c + 1 gaps at the phase's own rate, scaled to the span: the phase's arrivals end inside it
        gaps = [
            rng.expovariate(1.0) if arrivals == "poisson" else rng.gammavariate(shape, 1 / shape) for _ in range(c + 1)
        ]
        scale, t, times = span / sum(gaps), k * span, []
        for g in gaps[:-1]:
            t += g * scale
            times.append(min(t, (k + 1) * span))
        out.append(times)
    return out


def _phases(n, seed, arrivals, rate, footprint):
    phases = phase_lengths(n, seed, footprint)
    times = phase_arrivals([len(ph) for ph in phases], arrivals, rate, seed)
    out = []
    for k, (ph, ts) in enumerate(zip(phases, times)):
        for (p, o), t in zip(ph, ts):
            out.append(Request(len(out), t, p, o, phase=k))
    return out


def _published(pub, n, rng, times):
    """``n`` requests of a ``Published`` kind: single requests, or
    conversations (``times[c]`` is conversation ``c``'s start) whose turns
    each carry the conversation so far."""
    out, c = [], 0
    while len(out) < n:
        turns = 1
        if pub.turns > 1:  # geometric, mean pub.turns
            while turns < MAX_TURNS and rng.random() > 1 / pub.turns:
                turns += 1
        context, prev = 0, -1
        for _ in range(min(turns, n - len(out))):
            prompt = context + _length(rng, pub.prompt_median, pub.prompt_sigma, pub.prompt_range)
            output = _length(rng, pub.output_median, pub.output_sigma, pub.output_range)
            blocks, bt = (), 0
            if pub.turns > 1:
                bt = CHAT_BLOCK_TOKENS
                blocks = tuple((c, i) for i in range(-(-(prompt + output) // bt)))
            out.append(Request(len(out), times[c], prompt, output, blocks, bt, prev))
            prev, context = len(out) - 1, prompt + output
        c += 1
    return out


MOONCAKE_BLOCK_TOKENS = 512  # the block size of the Mooncake traces' hash_ids


def _row(row, where):
    """One JSONL line as ``(arrival, prompt, output, blocks, block_tokens,
    after)``: kvarena's own fields, or a Mooncake trace's (``timestamp`` in
    ms, ``input_length``, ``output_length``, ``hash_ids`` of 512-token
    blocks, of which the whole ones of the prompt are its prefix keys)."""
    if isinstance(row, dict) and {"timestamp", "input_length", "output_length"} <= row.keys():
        ts = row["timestamp"]
        arrival = ts / 1000 if isinstance(ts, (int, float)) and not isinstance(ts, bool) else ts
        prompt, output = row["input_length"], row["output_length"]
        hashes = row.get("hash_ids", [])
        if not isinstance(hashes, list):
            raise ValueError(f"{where}: hash_ids must be a list, got {hashes!r}")
        keys = tuple(hashes[: prompt // MOONCAKE_BLOCK_TOKENS]) if isinstance(prompt, int) else ()
        blocks, bt, after = keys, MOONCAKE_BLOCK_TOKENS if keys else 0, -1
    elif isinstance(row, dict) and {"arrival", "prompt_len", "output_len"} <= row.keys():
        arrival, prompt, output = row["arrival"], row["prompt_len"], row["output_len"]
        blocks, bt, after = row.get("blocks", []), row.get("block_tokens", 0), row.get("after", -1)
        if not isinstance(blocks, list):
            raise ValueError(f"{where}: blocks must be a list, got {blocks!r}")
        blocks = tuple(tuple(b) if isinstance(b, list) else b for b in blocks)
        for what, v, least in (("block_tokens", bt, 0), ("after", after, -1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError(f"{where}: {what} must be an int >= {least}, got {v!r}")
        if blocks and not bt:
            raise ValueError(f"{where}: blocks need block_tokens > 0")
    else:
        raise ValueError(
            f"{where}: needs arrival, prompt_len and output_len (or a Mooncake trace's timestamp, "
            "input_length and output_length)"
        )
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival) or arrival < 0:
        raise ValueError(f"{where}: arrival must be a number >= 0, got {arrival!r}")
    for what, v in (("prompt_len", prompt), ("output_len", output)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{where}: {what} must be an int >= 1, got {v!r}")
    return float(arrival), prompt, output, blocks, bt, after


def read_jsonl(path):
    """Requests from a JSONL file: ``{"arrival": .., "prompt_len": ..,
    "output_len": ..}`` a line, with optional prefix fields (``blocks``,
    ``block_tokens``, and ``after``: the 0-based line of the request this
    turn follows), or a Mooncake trace's lines (``_row``).  Blank lines are
    skipped; requests are sorted by arrival (stable).  A bad line is a
    ``ValueError`` naming the file and the line.  An optional ``phase``
    (the ``phases`` kind's index) is kept."""
    rows, phases = [], []
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"trace {path}: line {no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            rows.append(_row(row, where))
            phase = row.get("phase", -1)
            if isinstance(phase, bool) or not isinstance(phase, int) or phase < -1:
                raise ValueError(f"{where}: phase must be an int >= -1, got {phase!r}")
            phases.append(phase)
    if not rows:
        raise ValueError(f"trace {path}: no requests")
    sizes = {bt for *_, bt, _ in rows if bt}
    if len(sizes) > 1:
        raise ValueError(f"trace {path}: one block_tokens a trace, got {sorted(sizes)}")
    for i, (*_, after) in enumerate(rows):
        if after >= i:
            raise ValueError(f"trace {path}: request {i} follows request {after}, which is not before it")
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    new = {old: k for k, old in enumerate(order)}
    return [
        Request(k, a, p, o, b, bt, new[after] if after >= 0 else -1, phases[i])
        for k, (i, (a, p, o, b, bt, after)) in enumerate((i, rows[i]) for i in order)
    ]


def write_jsonl(requests, path):
    with open(path, "w") as f:
        for r in requests:
            row = {"arrival": r.arrival, "prompt_len": r.prompt_len, "output_len": r.output_len}
            if r.blocks:
                row.update(blocks=list(r.blocks), block_tokens=r.block_tokens)
            if r.after >= 0:
                row["after"] = r.after
            if r.phase >= 0:
                row["phase"] = r.phase
            f.write(json.dumps(row) + "\n")
