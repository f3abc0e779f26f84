"""SGLang's own ``Engine`` serving real tokens, on SGLang's allocator and then
on kvarena's (``KVARENA_SGLANG=1``, the plugin hook), token for token
(``kvarena.sglang.engine``; issue 53).

Each stack runs a tiny random-weight checkpoint written here, with the radix
cache on, prompts that share prefixes, and a token budget small enough that
SGLang retracts requests and kvarena's relief relocates pages; both are
read from the counters the scheduler process records.  Every request set
holds two prompts that differ only in their first token, far outside the
sliding window and before every later conv state: their outputs must
differ, so a wrong read of the KV or of a state would show in the tokens.
A planted drop-in bug (a relocation that moves the tables and not the
bytes, a translation one page off) must change tokens.

On this CPU machine the engine runs SGLang's CPU engine with the Triton
attention backend under Triton's interpreter and kvarena's CPU stand-ins
(``kvarena.sglang.cpu_ops``): a run takes 30 to 60 s.  SGLang's own
allocator asks ``torch.cuda`` for a stream on CPU; its reference runs get
the CPU stream there (``engine._answer_torch_cuda_stream_on_cpu``), kvarena's
get nothing.
"""

import functools

import pytest

from kvarena.sglang import engine

NEW_TOKENS = 24
# per stack: the engine's budget, the requests (count, length, shared prefix) and SGLang's environment
SETTINGS = {
    "swa": {"tokens": 256, "requests": (15, 24, 12), "engine": {}, "environment": {}},
    # LFM2 on CPU: no_buffer keeps 3 state slots a request; admission reserves every new token unless its estimate
    # is clipped, and then it over-admits and retracts
    "mamba": {
        "tokens": 128,
        "requests": (11, 12, 6),
        "engine": {"max_mamba_cache_size": 96},
        "environment": {"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "8"},
    },
}
# (stack, page size): the mamba stack runs at page size 1 only on CPU (no_buffer, arg_groups/mamba_hook.py:157)
CASES = [("swa", 1), ("swa", 4), ("mamba", 1)]


@functools.cache
def _model(stack: str, tmp: str) -> str:
    return str(engine.checkpoint(stack, f"{tmp}/{stack}"))


def requests(stack: str) -> list[list[int]]:
    n, length, shared = SETTINGS[stack]["requests"]
    reqs = engine.prompts(n, length, shared, groups=3)
    twin = list(reqs[0])
    twin[0] = 5 if twin[0] != 5 else 6  # the first prompt, its first token changed
    return reqs + [twin]


@functools.cache
def _run(stack: str, page_size: int, allocator: str, tmp: str, plant: str | None = None) -> engine.Run:
    s = SETTINGS[stack]
    kw = engine.engine_arguments(stack, page_size, s["tokens"], cuda=engine.on_cuda(), **s["engine"])
    return engine.run(
        _model(stack, tmp), allocator, requests(stack), NEW_TOKENS, kw, plant=plant, environment=s["environment"]
    )


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("checkpoints"))


@pytest.mark.parametrize(("stack", "page_size"), CASES)
def test_kvarena_serves_the_same_tokens_as_sglangs_allocator(stack, page_size, tmp):
    ours, theirs = _run(stack, page_size, "kvarena", tmp), _run(stack, page_size, "sglang", tmp)
    assert ours.error == "" and theirs.error == "", ours.error or theirs.error
    assert ours.kvarena and not theirs.kvarena  # the plugin hook built kvarena's allocator, and only there
    assert len(ours.tokens) == len(requests(stack)) and all(len(t) == NEW_TOKENS for t in ours.tokens)
    assert engine.first_difference(ours, theirs) is None, (ours.tokens, theirs.tokens)
    assert ours.tokens[0] != ours.tokens[-1]  # the first token alone changed the output: reads reach back
    assert ours.decode_steps > 0 and theirs.retracted == ours.retracted  # both retract at the same points


@pytest.mark.parametrize("stack", sorted(engine.STACKS))
def test_each_stack_relocates_and_retracts(stack, tmp):
    """What makes kvarena different ran: in at least one run of each stack
    its relief moved bytes and SGLang retracted requests."""
    runs = [_run(s, ps, "kvarena", tmp) for s, ps in CASES if s == stack]
    assert all(r.error == "" for r in runs), [r.error for r in runs]
    assert any(r.bytes_moved > 0 and r.retracted > 0 for r in runs), [(r.bytes_moved, r.retracted) for r in runs]


# the planted drop-in bug each stack's A/B must catch: on the sliding-window stack relief relocates live pages,
# so a relocation that moves the tables and not the bytes changes tokens; on the mamba stack at this budget the
# pages relief moves are not read again (the same plant leaves every token as it was), so the plant there is a
# translation one page off
PLANTED = {"swa": "relocation-skips-the-bytes", "mamba": "translation-one-page-off"}


@pytest.mark.parametrize("stack", sorted(engine.STACKS))
def test_a_planted_drop_in_bug_changes_tokens(stack, tmp):
    planted = _run(stack, 1, "kvarena", tmp, plant=PLANTED[stack])
    assert planted.error == "" and planted.kvarena, planted.error
    assert engine.first_difference(planted, _run(stack, 1, "sglang", tmp)) is not None


def test_the_check_command_runs_the_ab_on_a_users_checkpoint(tmp, tmp_path, capsys):
    """``kvarena sglang check --engine MODEL_PATH``: the table per allocator,
    its JSON, exit status 0 when the tokens are equal."""
    import json

    from kvarena.cli import main

    out = tmp_path / "ab.json"
    argv = ["sglang", "check", "--engine", _model("mamba", tmp), "--page-sizes", "1", "--requests", "4"]
    argv += ["--new-tokens", "6", "--max-total-tokens", "128", "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "equal" in printed and "kvarena sglang check --engine: ok" in printed
    runs = json.loads(out.read_text())
    assert [r["allocator"] for r in runs] == ["sglang", "kvarena"] and all(r["decode_steps"] > 0 for r in runs)
    assert all(r["same_tokens_as_sglang"] for r in runs) and runs[0]["tokens"] == runs[1]["tokens"]
