"""SGLang's own engine on kvarena and on SGLang's allocator, token for token.

``run`` starts ``sglang.Engine`` in a child process (the engine spawns its
scheduler and detokenizer processes and owns that process tree, so every
run gets a fresh one), with kvarena's allocators switched on through the
plugin hook (``KVARENA_SGLANG``) or not.  It sends greedy requests
(``ignore_eos``) as token ids, all at once, and returns their tokens with
the counters the scheduler process recorded (``record``): pages and bytes
relocated, requests retracted, decode steps.  ``compare`` runs both
allocators on the same engine settings and finds the first token that
differs.

Where torch has no CUDA the engine runs on the CPU (``cpu_environment``):
SGLang's CPU engine, the Triton attention backend under Triton's
interpreter (unified memory's page-major layout rules out the
``torch_native`` backend), and kvarena's stand-ins for the ``sgl_kernel``
CPU ops (``cpu_ops``).  On CUDA SGLang's own kernels run.

``checkpoint`` writes the tiny random-weight checkpoints the tests use,
with weights large enough (``initializer_range`` 0.2) that every token a
layer reads moves the output: with SGLang's ``load_format="dummy"``
(weights of about 1e-3) the next token depends on the current one alone,
so a wrong read of the KV would not change a single token.
"""

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV = "KVARENA_SGLANG"  # the plugin hook's switch (kvarena.sglang.factories.ENV)
STATS_ENV = "KVARENA_SGLANG_STATS"  # a file: the scheduler process records its counters there
PLANT_ENV = "KVARENA_SGLANG_PLANT"  # a planted drop-in bug, to show an A/B can fail (PLANTS)
BOOT_DIR = Path(__file__).parent / "cpu_boot"
ALLOCATORS = ("sglang", "kvarena")

# The stacks, each with a tiny checkpoint SGLang serves with unified memory on CPU, and the engine settings
# that stack needs there beyond SGLang's defaults.
# "cpu": the settings the CPU engine needs on top (docs/guides/integrating.md "SGLang's engine on CPU").
STACKS: dict[str, dict[str, Any]] = {
    # sliding window + full attention: SGLang's defaults, overlap scheduling on
    "swa": {"architecture": "MellumForCausalLM", "engine": {}, "cpu": {}},
    # mamba + full attention: LFM2's short convolutions keep a conv state per request in the mamba pool
    "mamba": {
        "architecture": "Lfm2ForCausalLM",
        "engine": {},
        "cpu": {
            # extra_buffer needs platform support (arg_groups/mamba_hook.py:120), no_buffer needs overlap off (:158)
            "mamba_radix_cache_strategy": "no_buffer",
            "disable_overlap_schedule": True,
            # LFM2 refuses attention_backend="triton" (arg_groups/model_hook.py:716) though the Triton backend
            # serves it; the split settings pass that check and choose the same backend
            "attention_backend": None,
            "prefill_attention_backend": "triton",
            "decode_attention_backend": "triton",
        },
    },
}


# ------------------------------------------------------------------ checkpoints


def checkpoint(stack: str, path: str | os.PathLike, seed: int = 0) -> Path:
    """Write ``stack``'s tiny checkpoint (random float32 weights, a word-level
    tokenizer over its 512 ids: ``t0`` ... ``t511``) to ``path``."""
    import torch
    import transformers

    if stack not in STACKS:
        raise ValueError(f"stack must be one of {sorted(STACKS)}, got {stack!r}")
    path = Path(path)
    torch.manual_seed(seed)
    config = _config(stack)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(path)
    _tokenizer(config.vocab_size).save_pretrained(path)
    return path


def _config(stack: str) -> Any:
    import transformers

    # every stack: 4 layers of width 64 (4 heads, 2 KV heads), float32 weights large enough to move every output
    common: dict[str, Any] = {
        "vocab_size": 512,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "initializer_range": 0.2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 4,
        "max_position_embeddings": 1024,
    }
    if stack == "swa":
        # two sliding-window layers (a window of 8 tokens) and two full ones, dense MLPs
        return transformers.MellumConfig(
            head_dim=16,
            layer_types=["sliding_attention", "full_attention"] * 2,
            mlp_layer_types=["dense"] * 4,
            sliding_window=8,
            **common,
        )
    if stack == "mamba":
        # conv, full, conv, full: LFM2's gated short convolution (a conv state of 2 inputs) and attention
        return transformers.Lfm2Config(
            layer_types=["conv", "full_attention"] * 2,
            conv_L_cache=3,
            conv_bias=False,
            block_auto_adjust_ff_dim=False,
            norm_eps=1e-5,
            tie_word_embeddings=True,
            **common,
        )
    raise ValueError(f"no checkpoint for stack {stack!r}")


def _tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer: id i is the word ``t{i}``, words split on
    spaces, so a text's tokens are its words and decoding is one-to-one."""
    import tokenizers
    import transformers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t3"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="t1", eos_token="t2", pad_token="t0", unk_token="t3"
    )


def prompts(n: int, length: int, shared: int, groups: int, seed: int = 0, vocab: int = 512) -> list[list[int]]:
    """``n`` prompts of ``length`` token ids below ``vocab`` (5 and up: not the
    special ids); prompts in one of ``groups`` groups share their first
    ``shared`` tokens (the radix cache's hits)."""
    import random

    rng = random.Random(seed)
    heads = [[rng.randrange(5, vocab) for _ in range(shared)] for _ in range(groups)]
    return [heads[i % groups] + [rng.randrange(5, vocab) for _ in range(length - shared)] for i in range(n)]


def stack_of(config: dict) -> str | None:
    """The stack of ``STACKS`` whose architecture a checkpoint's config
    names, or None (then SGLang's defaults alone)."""
    names = config.get("architectures") or []
    return next((k for k, v in STACKS.items() if v["architecture"] in names), None)


# ------------------------------------------------------------------ the environment


def on_cuda() -> bool:
    """Whether torch here has CUDA (then SGLang's own kernels run), else the CPU engine."""
    import torch

    return torch.cuda.is_available()


def cpu_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with what SGLang's engine needs on
    CPU: its CPU engine, Triton's interpreter for the attention kernels, and
    ``cpu_boot/`` first on ``PYTHONPATH`` (its ``sitecustomize`` puts the
    ``sgl_kernel`` and ``torchvision`` stand-ins in every engine process)."""
    env = dict(os.environ if env is None else env)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def engine_arguments(stack: str | None, page_size: int, max_total_tokens: int, cuda: bool, **overrides: Any) -> dict:
    """``sglang.Engine``'s keywords for an A/B run: unified memory, the radix
    cache on, prompts as token ids, SGLang's defaults otherwise (overlap
    scheduling included) wherever the device allows; ``stack`` (None for a
    checkpoint of another architecture) adds what its model needs."""
    kw: dict[str, Any] = {
        "enable_unified_memory": True,
        "page_size": page_size,
        "max_total_tokens": max_total_tokens,
        "skip_tokenizer_init": True,
        "random_seed": 0,
        "log_level": "warning",
    }
    if not cuda:
        # SGLang's CPU engine; the Triton backend (interpreted), no CUDA graphs
        kw |= {"device": "cpu", "attention_backend": "triton", "disable_cuda_graph": True}
        kw |= {"triton_attention_num_kv_splits": 2}  # fewer interpreted kernel launches; the result is the same
        # float32, as the checkpoints are written (SGLang's "auto" casts them to float16, slow on a CPU): a batch
        # of another composition (requests a server receives at their own times) then rounds the logits the same
        # to ~1e-7, far inside the gaps between the greedy choices
        kw |= {"dtype": "float32"}
        kw |= STACKS[stack]["cpu"] if stack else {}
    kw |= STACKS[stack]["engine"] if stack else {}
    kw |= overrides
    return kw


# ------------------------------------------------------------------ a run


@dataclass
class Run:
    """One engine run: the tokens of each request, and what the scheduler
    process counted."""

    allocator: str
    tokens: list[list[int]] = field(default_factory=list)
    pages_moved: dict[str, int] = field(default_factory=dict)
    bytes_moved: int = 0
    retracted: int = 0
    decode_steps: int = 0
    seconds: float = 0.0  # generation wall time, prefills included
    kvarena: bool = False  # the scheduler built kvarena's allocator
    error: str = ""
    log: str = ""  # the engine's log (its processes' stderr)

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / self.decode_steps if self.decode_steps else 0.0


def run(
    model: str | os.PathLike,
    allocator: str,
    requests: list[list[int]],
    max_new_tokens: int,
    engine: dict[str, Any],
    plant: str | None = None,
    timeout: float = 900,
    environment: dict[str, str] | None = None,
) -> Run:
    """``requests`` through a fresh ``sglang.Engine`` on ``allocator``
    (``"sglang"`` or ``"kvarena"``) with ``engine``'s keywords, in a child
    process; ``plant`` names one of ``PLANTS``; ``environment``: more of
    SGLang's environment settings (``SGLANG_...``)."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"plant must be one of {sorted(PLANTS)}, got {plant!r}")
    with tempfile.TemporaryDirectory(prefix="kvarena-engine-") as tmp:
        spec, out, stats = Path(tmp, "spec.json"), Path(tmp, "out.json"), Path(tmp, "stats.json")
        env = _environment(engine, allocator, stats, plant, environment)
        spec.write_text(
            json.dumps({"model": str(model), "requests": requests, "max_new_tokens": max_new_tokens, "engine": engine})
        )
        cmd = [sys.executable, "-m", "kvarena.sglang.engine", str(spec), str(out)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        result = Run(allocator, log=proc.stderr)
        if proc.returncode != 0 or not out.exists():
            result.error = f"the engine exited with {proc.returncode}:\n{proc.stdout[-4000:]}{proc.stderr[-8000:]}"
            return result
        got = json.loads(out.read_text())
        result.tokens, result.seconds = got["tokens"], got["seconds"]
        counted = json.loads(stats.read_text()) if stats.exists() else {}
        for key in ("pages_moved", "bytes_moved", "retracted", "decode_steps", "kvarena"):
            if key in counted:
                setattr(result, key, counted[key])
        if result.kvarena != (allocator == "kvarena"):
            result.error = (
                f"asked for {allocator}'s allocator, the scheduler built {'kvarena' if result.kvarena else 'sglang'}'s"
            )
        return result


def _environment(
    engine: dict[str, Any],
    allocator: str,
    stats: str | os.PathLike,
    plant: str | None,
    environment: dict[str, str] | None,
) -> dict[str, str]:
    """An engine run's environment: this process's (``cpu_environment`` on a
    CPU), kvarena switched on by the hook or not, the counters' file, the
    planted bug if any, then ``environment``."""
    env = cpu_environment() if engine.get("device") == "cpu" else dict(os.environ)
    env.pop(ENV, None)
    env.pop(PLANT_ENV, None)
    if allocator == "kvarena":
        env[ENV] = "1"
    if plant is not None:
        env[PLANT_ENV] = plant
    env[STATS_ENV] = str(stats)
    return env | (environment or {})


def first_difference(a: Run, b: Run) -> tuple[int, int] | None:
    """(request, token position) of the first token ``a`` and ``b`` differ
    in, or None when every request's tokens are equal."""
    for i, (x, y) in enumerate(zip(a.tokens, b.tokens)):
        for j in range(max(len(x), len(y))):
            if j >= len(x) or j >= len(y) or x[j] != y[j]:
                return i, j
    if len(a.tokens) != len(b.tokens):
        return min(len(a.tokens), len(b.tokens)), 0
    return None


def compare(model, requests, max_new_tokens, engine, plant=None, environment=None) -> tuple[Run, Run]:
    """SGLang's allocator, then kvarena's (with ``plant``, if any), on the same
    engine settings."""
    return (
        run(model, "sglang", requests, max_new_tokens, engine, environment=environment),
        run(model, "kvarena", requests, max_new_tokens, engine, plant=plant, environment=environment),
    )


# ------------------------------------------------------------------ a server


def server_command(model: str | os.PathLike, port: int, engine: dict[str, Any]) -> list[str]:
    """``python -m sglang.launch_server`` with ``engine``'s keywords as its
    flags (SGLang's own spelling: ``--page-size 4``, ``--disable-cuda-graph``),
    serving text through the checkpoint's tokenizer."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1"]
    cmd += ["--port", str(port)]
    for key, value in engine.items():
        if key == "skip_tokenizer_init" or value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        cmd += [flag] if value is True else [flag, str(value)]
    return cmd


@contextlib.contextmanager
def serve(
    model: str | os.PathLike,
    allocator: str,
    port: int,
    engine: dict[str, Any],
    stats: str | os.PathLike,
    boot_timeout: float = 300,
    environment: dict[str, str] | None = None,
):
    """A server on ``allocator`` (kvarena through the plugin hook, as a user
    starts one) on loopback: yields its base URL once ``/health`` answers;
    stops its whole process tree on the way out.  The scheduler records its
    counters in ``stats``."""
    import signal

    env = _environment(engine, allocator, stats, None, environment)
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            server_command(model, port, engine), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield _wait_for_health(proc, log, f"http://127.0.0.1:{port}", boot_timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_for_health(proc: subprocess.Popen, log: Any, url: str, timeout: float) -> str:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited with {proc.returncode}:\n{log.read()[-8000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return url
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not answer /health in {timeout} s")
        time.sleep(1)


# ------------------------------------------------------------------ inside the engine's processes


def record(path: str) -> None:
    """In a scheduler process: count, at SGLang's own methods, the pages its
    pools relocate (``move_physical_pages``, which both allocators' moves go
    through) and their bytes, the requests ``retract_decode`` retracts and
    the decode steps; rewrite ``path`` (JSON) after each (only a scheduler
    process sees these events, though every engine process loads the hook).  Called by the
    plugin hook when ``KVARENA_SGLANG_STATS`` names a file."""
    from kvarena.anchor.loader import import_sglang

    sb = import_sglang("sglang.srt.managers.schedule_batch")
    pools = import_sglang("sglang.srt.mem_cache.unified_memory_pool")
    from . import factories

    if not factories.installed():
        _answer_torch_cuda_stream_on_cpu()
    counts: dict[str, Any] = {
        "pages_moved": {},
        "bytes_moved": 0,
        "retracted": 0,
        "decode_steps": 0,
        "kvarena": factories.installed(),
    }

    def dump() -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(counts, f)
        os.replace(tmp, path)

    def wrap(cls: type, name: str, count) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def counted(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            count(self, result, *args)
            dump()
            return result

        setattr(cls, name, counted)

    def moved(pool, _result, tgt_pages, *_):
        n = int(tgt_pages.numel())  # a shape: no read
        name = getattr(pool, "_sub_pool_name", type(pool).__name__)
        counts["pages_moved"][name] = counts["pages_moved"].get(name, 0) + n
        page_bytes = getattr(pool, "_page_bytes", None)
        if page_bytes is None:  # a mamba pool: a state slot is a page
            page_bytes = pool._unified_buffer.mamba_spec(pool._sub_pool_name).entry_bytes()
        counts["bytes_moved"] += n * page_bytes

    def retracted(_batch, result, *_):
        counts["retracted"] += len(result[0])

    def decoded(*_):
        counts["decode_steps"] += 1

    for cls in (pools.UnifiedMHATokenToKVPool, pools.UnifiedMLATokenToKVPool, pools.UnifiedMambaPool):
        wrap(cls, "move_physical_pages", moved)
    wrap(sb.ScheduleBatch, "retract_decode", retracted)
    wrap(sb.ScheduleBatch, "prepare_for_decode", decoded)


def _answer_torch_cuda_stream_on_cpu() -> None:
    """SGLang's own allocator asks ``torch.cuda.current_stream()`` for the
    stream to wait on, whatever the pool's device (``_settle_inflight_forward``,
    ``mem_cache/allocator/unified_sub_pool.py:1810``; docs/findings.md), so
    on a CPU build of torch its first settle under tight memory raises.  For
    the reference runs of the A/B on CPU only, torch.cuda's answer is the CPU
    stream (a wait on it is a no-op, as the CPU forward has run); kvarena's
    runs get no such help."""
    import torch

    if not torch.cuda.is_available():
        setattr(torch.cuda, "current_stream", lambda device=None: torch.cpu.current_stream())  # noqa: B010


def _skip_the_bytes(alloc: Any, name: str, dst: Any, src: Any) -> None:
    alloc.pages_moved[name] += dst.numel()  # the tables move, the bytes stay behind


def _one_page_off(translate: Any) -> Any:
    def shifted(v2p, ps, loc, out, fused=False):
        res = translate(v2p, ps, loc, None, fused)
        res = res - (res >= 2 * ps) * ps  # one page down (not below page 1): writes and reads land on a neighbour's
        return res if out is None else out.copy_(res.reshape(out.shape))

    return shifted


# Planted drop-in bugs (``kvarena sglang check --engine --plant``, the engine tests): each must change tokens.
# A relocation plant replaces the drop-in's mover; a translation plant wraps its translation.
PLANTS: dict[str, tuple[str, Any]] = {
    "relocation-skips-the-bytes": ("_move_pages", _skip_the_bytes),
    "translation-one-page-off": ("_translate", _one_page_off),
}


def plant_from_env() -> None:
    """In a scheduler process: put in the bug ``KVARENA_SGLANG_PLANT`` names."""
    name = os.environ.get(PLANT_ENV)
    if not name:
        return
    if name not in PLANTS:
        raise ValueError(f"{PLANT_ENV}={name!r}: use one of {sorted(PLANTS)}")
    from . import dropin, views

    where, bug = PLANTS[name]
    if where == "_move_pages":
        setattr(dropin._Dropin, "_move_pages", lambda self, pool, dst, src: bug(self, pool, dst, src))  # noqa: B010
    else:
        views._translate = bug(views._translate)


def _child(spec_path: str, out_path: str) -> None:
    import sglang

    spec = json.loads(Path(spec_path).read_text())
    engine = sglang.Engine(model_path=spec["model"], **spec["engine"])
    try:
        params = {"max_new_tokens": spec["max_new_tokens"], "temperature": 0, "ignore_eos": True}
        t0 = time.perf_counter()
        outs = engine.generate(input_ids=spec["requests"], sampling_params=params)
        seconds = time.perf_counter() - t0
    finally:
        engine.shutdown()
    Path(out_path).write_text(json.dumps({"tokens": [o["output_ids"] for o in outs], "seconds": seconds}))


def main(argv: list[str] | None = None) -> None:
    """``python -m kvarena.sglang.engine SPEC OUT``: one run's child process."""
    p = argparse.ArgumentParser(description="one engine run (kvarena.sglang.engine.run's child process)")
    p.add_argument("spec")
    p.add_argument("out")
    args = p.parse_args(argv)
    _child(args.spec, args.out)


if __name__ == "__main__":
    main()
