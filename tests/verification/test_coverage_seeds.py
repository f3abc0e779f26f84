"""Issue 57: the machines' required coverage does not hang on Hypothesis's draws.

On a GPU image with another Hypothesis (6.168.3), the same seeds drew other
examples and each machine missed one required event.  Now each machine's
explicit examples (``EXAMPLES``: fixed boots and steps, each rule with its
draws, replayed by ``differential.replay`` before Hypothesis's own examples in
every ``run_machine``) reach every event its test requires.  Shown here: a
short run reaches them all, derandomized and from two other seeds; the
explicit examples alone reach them all, with the kernels drawn or fixed to
either choice for every call; and each explicit example is needed (planted:
without it, an event is missed), so this file fails when one goes missing.
"""

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from kvarena.spec.contracts import checking
from kvarena.verification import differential, differential_composites

MACHINES = {"core": differential, "composites": differential_composites}


def wanted(mod, device="cpu"):
    """Every event the machine's own test requires on ``device`` (tests/verification/test_differential*.py)."""
    return mod.REQUIRED + differential.kernel_events(device) + mod.IN_FLIGHT + mod.HOLDS


def reached(mod, examples, kernels=None):
    """The events ``examples`` reach on the CPU, replayed alone (``kernels``: every call's, else drawn)."""
    mod.CASES.clear()
    with checking():
        for boot, steps in examples:
            differential.replay(mod.machine_for("cpu", host_transfers=True), boot, steps, kernels)
    return {e for e, n in mod.CASES.items() if n}


@pytest.mark.parametrize("how", [{"derandomize": True}, {"seed": 1}, {"seed": 57}], ids=["derandomized", "1", "57"])
@pytest.mark.parametrize("label", MACHINES)
def test_a_short_run_reaches_every_required_event_whatever_hypothesis_draws(device, label, how):
    mod = MACHINES[label]
    mod.CASES.clear()
    mod.run_machine(device, database=None, max_examples=3, stateful_step_count=10, **how)
    missing = [e for e in wanted(mod, device) if mod.CASES[e] == 0]
    assert not missing, f"{label} ({how}): never reached: {missing}"


@pytest.mark.parametrize("fixed", [None, "torch", "triton"])
@pytest.mark.parametrize("label", MACHINES)
def test_the_explicit_examples_alone_reach_every_required_event(label, fixed):
    """With the kernels drawn (a call on each choice) or fixed to one choice
    for every call: the events do not hang on the kernels either (the
    faulted calls' operation is the first, or past the last, or mid-window)."""
    if fixed is not None and fixed not in differential.kernel_choices("cpu"):
        pytest.skip(f"{fixed} does not run on the CPU here")
    want = set(wanted(MACHINES[label]))
    if fixed is not None:
        want -= set(differential.kernel_events("cpu")) - {f"kernels {fixed}"}
    missing = want - reached(MACHINES[label], MACHINES[label].EXAMPLES, fixed)
    assert not missing, f"{label}: the explicit examples never reach {sorted(missing)}"


@pytest.mark.parametrize("label", MACHINES)
def test_without_any_one_explicit_example_an_event_is_missed(label):
    """Planted: drop each explicit example in turn, and the rest miss an
    event (the one its comment names), so the tests above can fail."""
    examples = MACHINES[label].EXAMPLES
    for i in range(len(examples)):
        rest = examples[:i] + examples[i + 1 :]
        assert set(wanted(MACHINES[label])) - reached(MACHINES[label], rest), f"{label}: example {i} is not needed"


def test_the_test_extra_pins_one_hypothesis_that_the_fuzz_extra_excludes():
    """The [test] extra pins Hypothesis; the [fuzz] extra's range (HypoFuzz's)
    excludes that version, so the two are never installed together
    (tools/hypofuzz_check.sh installs [fuzz] alone), and the package's own
    range admits both."""
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]

    def hypothesis(reqs):
        (req,) = [Requirement(r) for r in reqs if Requirement(r).name == "hypothesis"]
        return req.specifier

    extras = project["optional-dependencies"]
    test, fuzz, package = hypothesis(extras["test"]), hypothesis(extras["fuzz"]), hypothesis(project["dependencies"])
    (pin,) = list(test)
    assert pin.operator == "==", test
    assert pin.version not in fuzz and pin.version in package, (test, fuzz, package)
