"""The ``kvarena`` command: one registry of subcommands, each job in its own module.

- ``kvarena verify``: self-checks, proofs, vectors and differential fuzz, every check run to the end
- ``kvarena prove``: z3 obligations and CrossHair runs
- ``kvarena vectors``: conformance vectors: generate from the spec, replay on a target
- ``kvarena fuzz``: the differential machines as a campaign over processes
- ``kvarena planted``: apply each named planted bug and report which suite catches it
- ``kvarena simulate``: serving simulator: unified arena against static splits
- ``kvarena bench``: side-by-side benchmarks (ratios, one run)
- ``kvarena policies``: anchor policy vs chain planner on the same random traces
- ``kvarena conform``: differential campaign against the anchor's allocator (sglang 0.5.23)
- ``kvarena sglang``: SGLang's own unified-memory stacks on kvarena: check them on this install

``kvarena COMMAND --help`` lists a command's options.  Each prints a table
or a summary and exits non-zero on any failure.
"""

import argparse
import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A subcommand: ``module`` has ``add_arguments(parser)`` and ``run(args) -> int``."""

    name: str
    help: str  # the one line ``kvarena --help`` shows, repeated in this module's docstring
    module: str
    value_error_is_usage: bool = False  # run raises ValueError on a bad argument: printed, exit code 2
    # it runs the Triton kernels, on the CPU under Triton's interpreter where no CUDA device is
    # visible (``kvarena.impl.kernels.interpret_without_cuda``; docs/design.md §14)
    triton: bool = False


COMMANDS = (
    Command(
        "verify",
        "self-checks, proofs, vectors and differential fuzz, every check run to the end",
        "kvarena.verification.verify",
        triton=True,
    ),
    Command("prove", "z3 obligations and CrossHair runs", "kvarena.proofs.cli"),
    Command(
        "vectors", "conformance vectors: generate from the spec, replay on a target", "kvarena.verification.vectors"
    ),
    Command("fuzz", "the differential machines as a campaign over processes", "kvarena.verification.fuzz", triton=True),
    Command(
        "planted", "apply each named planted bug and report which suite catches it", "kvarena.verification.planted"
    ),
    Command(
        "simulate",
        "serving simulator: unified arena against static splits",
        "kvarena.sim.simulate",
        value_error_is_usage=True,
    ),
    Command(
        "bench",
        "side-by-side benchmarks (ratios, one run)",
        "kvarena.sim.bench",
        value_error_is_usage=True,
        triton=True,
    ),
    Command("policies", "anchor policy vs chain planner on the same random traces", "kvarena.sim.policies"),
    Command("conform", "differential campaign against the anchor's allocator (sglang 0.5.23)", "kvarena.anchor.cli"),
    Command(
        "sglang",
        "SGLang's own unified-memory stacks on kvarena: check them on this install",
        "kvarena.sglang.cli",
        value_error_is_usage=True,
    ),
)


def parser(chosen: Command | None = None) -> argparse.ArgumentParser:
    """The ``kvarena`` parser.  Only ``chosen``'s module is imported to add its
    arguments: the others (torch, z3, Hypothesis behind them) stay unloaded,
    so ``kvarena --help`` answers at once."""
    p = argparse.ArgumentParser(
        prog="kvarena", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    for command in COMMANDS:
        command_parser = sub.add_parser(command.name, help=command.help)
        if command is chosen:
            importlib.import_module(command.module).add_arguments(command_parser)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the command is the first word that is not an option (``kvarena`` itself takes only -h)
    name = next((a for a in argv if not a.startswith("-")), None)
    chosen = next((c for c in COMMANDS if c.name == name), None)
    if chosen is not None and chosen.triton:  # before anything imports triton
        from kvarena.impl.kernels import interpret_without_cuda

        interpret_without_cuda()
    args = parser(chosen).parse_args(argv)
    assert chosen is not None and args.cmd == chosen.name  # argparse exits on any other command line
    try:
        return int(importlib.import_module(chosen.module).run(args))
    except ValueError as e:
        if not chosen.value_error_is_usage:
            raise
        print(f"kvarena {chosen.name}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
