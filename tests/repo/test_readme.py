"""The README's composite decode loop runs as written, on the implementation
and, with the import swapped, on the spec."""

import re

import pytest

from tests.support import ROOT

README = ROOT / "README.md"


@pytest.mark.parametrize("package", ["kvarena.impl", "kvarena.spec"])
def test_readme_decode_loop_runs(package):
    block = re.search(r"```python\n(from kvarena\.impl import TriPool.*?)```", README.read_text(), re.S)
    assert block, "README lost its decode-loop example"
    code = block.group(1).replace("from kvarena.impl", f"from {package}")
    if package == "kvarena.spec":  # the spec returns lists where the impl returns tensors
        code = code.replace(".tolist()", "")
    env = {}
    exec(code, env)
    c, toks, slot, freed = env["c"], env["toks"], env["slot"], env["freed"]
    assert len(toks) == 164 and len(set(toks)) == 164
    assert freed == 16  # the window has started to slide
    c.free(toks)
    c.free_state(slot)
    c.verify()
    assert all(c.arena.live_pages(p) == 0 for p in c.arena.chain)  # nothing leaked
