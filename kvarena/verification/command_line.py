"""What the verification commands (``verify``, ``vectors``, ``fuzz``,
``planted``) share on the command line: the options they declare alike,
the ``--device`` check, and the console they print on.

Standard library and rich only, so a command's arguments are declared
without importing torch.
"""

import argparse
import functools
import shutil


@functools.cache
def console():
    """The console the commands print on: at least 120 columns, so a piped table keeps its rows whole."""
    from rich.console import Console

    return Console(width=max(120, shutil.get_terminal_size().columns))


def no_device(command: str, device: str) -> bool:
    """True (after saying why) when ``--device`` names a device that is not usable here."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            console().print(f"[red]kvarena {command}: --device cuda: no CUDA device is available here[/red]")
            return True
    return False


def add_device(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help=help)


def add_json(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--json", metavar="PATH", help=help)


def add_failures_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--failures", default="fuzz-failures", metavar="DIR", help="where failing cases are saved as vectors"
    )
