"""The simulator's pictures in the docs are what their documented commands draw.

Each picture on docs/results/simulator.md sits beside the ``kvarena simulate``
command that draws it; this runs that command as written (the plot path moved
to a scratch folder) and requires the same bytes as the checked-in file, so a
change to the simulator that moves a picture fails here until the picture is
redrawn by the same command.  The band picture is simulated again (about a
minute).
"""

import re
import shlex

import pytest

from kvarena import cli
from tests.support import ROOT

PAGE = ROOT / "docs" / "results" / "simulator.md"
PICTURES = [  # (picture, the --plot argument of the command that draws it)
    ("sim-phase-bands.png", "docs/results/sim-phase-bands.png"),
]


def documented_command(plot: str) -> list[str]:
    """The page's ``kvarena simulate ... --plot PLOT`` command, as argv."""
    text = " ".join(PAGE.read_text().split())  # a command may wrap across lines
    m = re.search(rf"`(kvarena simulate [^`]*--plot {re.escape(plot)})`", text)
    assert m, f"{PAGE.name} shows no command with --plot {plot}"
    return shlex.split(m.group(1))[1:]


@pytest.mark.parametrize(("picture", "plot"), PICTURES)
def test_the_picture_is_what_its_command_draws(picture, plot, tmp_path, capsys):
    assert f"]({picture})" in PAGE.read_text(), f"{PAGE.name} does not show {picture}"
    argv = documented_command(plot)
    argv[argv.index("--plot") + 1] = str(tmp_path / plot.rsplit("/", 1)[1])
    assert cli.main(argv) == 0
    capsys.readouterr()
    drawn = (tmp_path / picture).read_bytes()
    assert drawn == (ROOT / "docs" / "results" / picture).read_bytes(), (
        f"docs/results/{picture} is not what its command draws now: rerun {' '.join(documented_command(plot))}"
    )
