"""A real client against SGLang's HTTP server: ``python -m sglang.launch_server``
on loopback, first on SGLang's allocator, then with kvarena switched on
through the plugin hook (``KVARENA_SGLANG=1``) as a user starts it; the
``openai`` client's completions put 16 requests in flight at once, and each
request's tokens must be the same on both (issue 53).  The test stops each
server itself.

The 16 prompts go in one completions call (a list of prompts), which the
server admits together, as ``Engine.generate`` does.  Sixteen separate
calls arrive at their own times, so the batches, and which prompt finds
its prefix cached, differ from run to run, and SGLang's CPU path is not
batch-invariant: two servers on SGLang's own allocator answered one of 16
requests differently (its deterministic mode needs CUDA or XPU,
``utils/common.py:628``)."""

import json
import socket

import openai

from kvarena.sglang import engine

REQUESTS = 16
NEW_TOKENS = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _texts(n: int) -> list[str]:
    """Prompts as the checkpoint's words (``t5 t17 ...``), sharing prefixes."""
    return [" ".join(f"t{i}" for i in p) for p in engine.prompts(n, 20, 10, groups=4, seed=1)]


def _complete(url: str, model: str, prompts: list[str]) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600, max_retries=0)
    r = client.completions.create(
        model=model,
        prompt=prompts,  # every request in flight at once
        max_tokens=NEW_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True, "skip_special_tokens": False},
    )
    by_index = {c.index: c.text for c in r.choices}
    return [by_index[i] for i in range(len(prompts))]


def test_the_http_server_on_kvarena_answers_as_on_sglangs_allocator(tmp_path):
    model = str(engine.checkpoint("swa", tmp_path / "swa"))
    kw = engine.engine_arguments("swa", 4, 192, cuda=engine.on_cuda())
    del kw["skip_tokenizer_init"]  # the server detokenizes with the checkpoint's word-level tokenizer
    prompts, answers, stats = _texts(REQUESTS), {}, {}
    for allocator in engine.ALLOCATORS:
        counted = tmp_path / f"{allocator}.json"
        with engine.serve(model, allocator, _free_port(), kw, counted) as url:
            answers[allocator] = _complete(url, model, prompts)
        stats[allocator] = json.loads(counted.read_text())
    assert stats["kvarena"]["kvarena"] and not stats["sglang"]["kvarena"]  # the hook switched kvarena on, there only
    assert all(len(a.split()) == NEW_TOKENS for a in answers["kvarena"]), answers["kvarena"]
    assert answers["kvarena"] == answers["sglang"]
    assert len(set(answers["kvarena"])) > 1
