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

Arrivals (``ARRIVALS``): ``saturating``, every request at time 0, so a queue
builds and memory, not arrivals, limits how many requests run; ``poisson``
at ``rate`` requests a second; ``bursty``, the same mean rate with gamma
gaps of squared coefficient of variation ``BURST_CV2`` (bursts and lulls).
A seed's lengths are the same under every arrival process and rate (their
own random stream), so a sweep over rates serves the same requests.
``read_jsonl`` reads any other trace, one JSON object a line with those
three fields.
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
KINDS = ("balanced", "long", "short", "shift")
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


def generate(kind, n, seed=0, arrivals="saturating", rate=None):
    """``n`` requests of trace ``kind`` (see the module docstring)."""
    if kind not in KINDS:
        raise ValueError(f"unknown trace {kind!r}; traces: {', '.join(KINDS)}")
    if n < 1:
        raise ValueError(f"trace {kind!r}: n must be >= 1, got {n}")
    times = arrival_times(n, arrivals, rate, seed)
    rng = random.Random(f"{kind}/{seed}")
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


def read_jsonl(path):
    """Requests from a JSONL file: ``{"arrival": .., "prompt_len": .., "output_len": ..}``
    a line (blank lines skipped), sorted by arrival (stable).  A bad line is a
    ``ValueError`` naming the file and the line."""
    out = []
    with open(path) as f:
        for no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"trace {path}: line {no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not JSON ({e.msg})") from None
            if not isinstance(row, dict) or not {"arrival", "prompt_len", "output_len"} <= row.keys():
                raise ValueError(f"{where}: needs arrival, prompt_len and output_len")
            arrival, prompt, output = row["arrival"], row["prompt_len"], row["output_len"]
            if (
                isinstance(arrival, bool)
                or not isinstance(arrival, (int, float))
                or not math.isfinite(arrival)
                or arrival < 0
            ):
                raise ValueError(f"{where}: arrival must be a number >= 0, got {arrival!r}")
            for what, v, least in (("prompt_len", prompt, 1), ("output_len", output, 1)):
                if isinstance(v, bool) or not isinstance(v, int) or v < least:
                    raise ValueError(f"{where}: {what} must be an int >= {least}, got {v!r}")
            out.append(Request(len(out), float(arrival), prompt, output))
    if not out:
        raise ValueError(f"trace {path}: no requests")
    out.sort(key=lambda r: r.arrival)
    return [Request(i, r.arrival, r.prompt_len, r.output_len) for i, r in enumerate(out)]


def write_jsonl(requests, path):
    with open(path, "w") as f:
        for r in requests:
            f.write(json.dumps({"arrival": r.arrival, "prompt_len": r.prompt_len, "output_len": r.output_len}) + "\n")
