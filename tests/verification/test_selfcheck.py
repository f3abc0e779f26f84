"""``kvarena verify``, the self-checks and the run-time contract checker."""

import pytest

from kvarena import cli
from kvarena.spec import Arena, SubPool, arena, arith, bands
from kvarena.spec.contracts import ContractError, checking, conditions
from kvarena.verification import selfcheck, verify


def test_verify_spec_part_passes(capsys):
    rc = cli.main(["verify", "--walks", "2", "--steps", "60", "--skip-proofs", "--skip-fuzz", "--skip-vectors"])
    out = capsys.readouterr().out
    # every check run passed; the parts skipped make the verdict incomplete, not a pass
    assert rc == verify.EXIT_INCOMPLETE
    assert "passed, 0 failed" in out and "INCOMPLETE" in out


def test_verify_fails_on_a_failing_check(monkeypatch, capsys):
    def broken():
        raise AssertionError("planted")

    monkeypatch.setitem(selfcheck.SCENARIOS, "planted", broken)
    rc = cli.main(["verify", "--walks", "0", "--skip-proofs", "--skip-fuzz", "--skip-vectors"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "1 failed" in out


def test_verify_writes_json(tmp_path):
    path = tmp_path / "r.json"
    assert (
        cli.main(
            [
                "verify",
                "--walks",
                "1",
                "--steps",
                "20",
                "--skip-proofs",
                "--skip-fuzz",
                "--skip-vectors",
                "--json",
                str(path),
            ]
        )
        == verify.EXIT_INCOMPLETE
    )
    import json

    rows = json.loads(path.read_text())["rows"]
    assert rows and all(r["ok"] for r in rows)
    assert any(r["name"].startswith("random walk") for r in rows)


def test_every_scenario_passes_with_contracts():
    results = selfcheck.run_scenarios()
    assert len(results) == len(selfcheck.SCENARIOS) >= 9
    assert [r.detail for r in results if not r.ok] == []


@pytest.mark.parametrize("seed", range(6))
def test_random_walk(seed):
    assert "steps" in selfcheck.random_walk(seed, steps=150)


def test_random_walk_catches_a_planted_content_bug(monkeypatch):
    """A move that forgets to carry the bytes must be caught by the walk."""
    real_move = bands.Band.move

    def lossy(self, dst, src):
        keep = dict(self.content)
        n = real_move(self, dst, src)
        self.content = keep  # the page tables moved, the bytes did not
        return n

    monkeypatch.setattr(bands.Band, "move", lossy)
    with pytest.raises(Exception, match=r"content|bytes"):
        for seed in range(30):
            selfcheck.random_walk(seed, steps=300)


@pytest.mark.mutation
def test_conditions_parser():
    doc = """Text.

    pre: x > 0
    post: __return__ >= x
    inv: self.ok
    raises: ValueError
    """
    assert conditions(doc) == {"pre": ["x > 0"], "post": ["__return__ >= x"], "inv": ["self.ok"]}


@pytest.mark.mutation
def test_checker_catches_a_broken_postcondition(monkeypatch):
    """Plant a wrong ``min_page`` (floor for ceil): its own post must fail."""

    def wrong(sink_bytes, epp):
        """pre: sink_bytes >= 0 and epp > 0
        post: __return__ * epp >= sink_bytes
        """
        return sink_bytes // epp

    wrong.__module__ = arith.__name__  # checking() wraps the spec's own functions
    monkeypatch.setattr(arith, "min_page", wrong)
    with checking(), pytest.raises(ContractError, match="wrong: post failed"):
        Arena(1000, [SubPool("a", 12, 1, "up"), SubPool("b", 5, 1, "down")])


def test_checker_catches_a_broken_invariant(monkeypatch):
    """A band that forgets to count its new pages breaks the class invariant."""
    import dataclasses

    real_install = bands.Band.install

    def forgetful(self, counts, holes):
        real_install(self, dataclasses.replace(counts, live=self.live), holes)

    a = Arena(4096, [SubPool("a", 16, 1, "up"), SubPool("b", 16, 1, "down")])
    monkeypatch.setattr(bands.Band, "install", forgetful)
    with checking(), pytest.raises(AssertionError, match="live"):
        a.alloc("a", 3)


@pytest.mark.mutation
def test_checker_restores_the_spec():
    before = arena.Arena.alloc
    with checking():
        assert arena.Arena.alloc is not before
    assert arena.Arena.alloc is before


@pytest.mark.mutation
def test_checker_checks_the_layout_contract(monkeypatch):
    """A grid one page too long (planted in an unchecked helper) is caught by
    ``make_layout``'s own postcondition."""
    real = arith.num_pages

    def one_too_many(total_bytes, entry_bytes, page_size):
        return real(total_bytes, entry_bytes, page_size) + 1

    monkeypatch.setattr(arith, "num_pages", one_too_many)  # no contract of its own
    with checking(), pytest.raises(ContractError, match=r"make_layout: post failed: .*num_pages"):
        Arena(1000, [SubPool("a", 12, 1, "up"), SubPool("b", 5, 1, "down")])
