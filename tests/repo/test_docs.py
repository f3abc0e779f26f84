"""The documentation: built with warnings as errors, every citation resolved,
every command and public module in the reference, a README that fits on a few
screens, and each measured figure in one place.

Each check is first shown to catch a planted violation.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvarena.cli import COMMANDS
from tests.support import ROOT

DOCS = ROOT / "docs"
TEXT = (".py", ".md", ".json", ".sh", ".toml", ".yml", ".yaml", ".cfg", ".txt")
README_MAX_LINES = 300


def tracked_text_files() -> list[Path]:
    """The repository's text files: tracked, or new and not ignored."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / f for f in sorted(set(out)) if f.endswith(TEXT) and (ROOT / f).is_file()]


# ------------------------------------------------------------------ citations

_ID = re.compile(r"\{\s*#([\w-]+)\s*\}\s*$")
_CITE = re.compile(
    r"(?<![\w/])(?P<path>docs/[\w/.-]+?\.md)"
    r"(?P<sections>(?:[\s#,]*(?:and|to)?[\s#]*§\w+)*)"
    r"(?:(?:,[ \t]*|[ \t]+)(?P<q>[\"'])(?P<title>[^\"'\n]+)(?P=q))?"
)
_README_CITE = re.compile(r"\bREADME,? \"(?P<title>[^\"\n]+)\"")
_LEGACY = re.compile(r"\b(?:DESIGN|ANCHOR)\b")


def anchors(markdown: str) -> tuple[set[str], set[str]]:
    """``(ids, titles)`` of a page: the explicit ``{ #id }`` heading ids, and the
    titles a citation may quote (headings and bold paragraph lead-ins)."""
    ids, titles = set(), set()
    for line in markdown.splitlines():
        if re.match(r"#{1,6} ", line):
            m = _ID.search(line)
            if m:
                ids.add(m.group(1))
            title = _ID.sub("", line.lstrip("#")).strip()
            titles.add(re.sub(r"^\d+[a-z]?\.\s+", "", title))
            titles.add(title)
    titles |= {t.strip().rstrip(".") for t in re.findall(r"\*\*([^*\n]+?)\*\*", markdown)}
    return ids, titles


def citation_problems(text: str, where: str, root: Path = ROOT) -> list[str]:
    """Every citation in ``text`` that names no file, section or heading of the repository."""
    problems = []
    for m in _LEGACY.finditer(text):
        problems.append(f"{where}: '{text[m.start() : m.start() + 30]}...' cites a design outside the repository")
    for m in _CITE.finditer(text):
        page = root / m.group("path")
        if not page.is_file():
            problems.append(f"{where}: {m.group('path')} does not exist")
            continue
        ids, titles = anchors(page.read_text())
        for section in re.findall(r"§(\w+)", m.group("sections")):
            if section not in ids and section != "N":  # §N: the placeholder of the convention itself
                problems.append(f"{where}: {m.group('path')} has no section §{section}")
        title = m.group("title")
        if title and not any(t.lower().startswith(title.rstrip(".").lower()) for t in titles):
            problems.append(f'{where}: {m.group("path")} has no heading "{m.group("title")}"')
    _, readme_titles = anchors((root / "README.md").read_text())
    for m in _README_CITE.finditer(text):
        if m.group("title") not in readme_titles:
            problems.append(f'{where}: README has no heading "{m.group("title")}"')
    return problems


def test_every_citation_resolves_in_the_repository():
    problems = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        problems += citation_problems(path.read_text(errors="replace"), str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("the ladder (docs/design.md §4b) and views (docs/design.md §5)", None),
        ("see docs/design.md §4 and §6, and docs/anchor.md §1", None),
        ('docs/guides/integrating.md "SGLang on kvarena"', None),
        ('README "Quick start"', None),
        ("the ladder (docs/design.md §15)", "no section §15"),
        ("docs/design.md §4, §16", "no section §16"),
        ("the old form: DESIGN section 4", "outside the repository"),
        ("ANCHOR §2", "outside the repository"),
        ("docs/nowhere.md §1", "does not exist"),
        ('docs/guides/integrating.md "A heading that is not there"', "no heading"),
        ('README "Nowhere"', "README has no heading"),
    ],
)
def test_the_citation_check_catches_what_does_not_resolve(text, found):
    problems = citation_problems(text, "planted")
    if found is None:
        assert problems == []
    else:
        assert any(found in p for p in problems), problems


def test_design_sections_have_stable_ids():
    ids, _ = anchors((DOCS / "design.md").read_text())
    assert {"1", "3", "4", "4b", "5", "6", "7", "9", "9b", "9c", "10", "11", "12", "13", "14"} <= ids
    ids, _ = anchors((DOCS / "anchor.md").read_text())
    assert {"1", "2", "3", "4", "5"} <= ids


# ------------------------------------------------------------------- the site


def build(project: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the project folder ``project`` into ``site``."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with warnings as errors (``strict: true`` in mkdocs.yml, and ``--strict``)."""
    out = tmp_path_factory.mktemp("site")
    run = build(ROOT, out)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    assert (site / "index.html").is_file()
    for page in ("design", "anchor", "guides/verifying", "reference/spec", "results/simulator", "findings"):
        assert (site / page / "index.html").is_file(), page


def test_a_broken_link_fails_the_build(tmp_path):
    """The strict build is what catches a broken link: planted in a copy of the docs."""
    shutil.copytree(DOCS, tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "findings.md"
    page.write_text(page.read_text() + "\nSee [nothing](no-such-page.md).\n")
    config = (tmp_path / "mkdocs.yml").read_text().replace("paths: [.]", f"paths: [{ROOT}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    run = build(tmp_path, tmp_path / "site")
    assert run.returncode != 0
    assert "no-such-page.md" in run.stdout + run.stderr


def test_every_command_has_its_generated_help(site):
    page = (site / "reference" / "cli" / "index.html").read_text()
    for command in COMMANDS:
        assert f"usage: kvarena {command.name}" in page, command.name


@pytest.mark.parametrize("package", ["spec", "impl"])
def test_every_public_module_is_in_the_reference(package, site):
    listed = re.findall(rf"^::: {package}\.(\w+)$", (DOCS / "reference" / f"{package}.md").read_text(), re.M)
    modules = sorted(p.stem for p in (ROOT / package).glob("*.py") if not p.name.startswith("_"))
    assert sorted(listed) == modules
    page = (site / "reference" / package / "index.html").read_text()
    for module in modules:
        assert f"{package}.{module}" in page, module


def test_the_figures_are_drawn_into_the_site(site):
    for name in ("bands.svg", "relief.svg"):
        svg = (site / "figures" / name).read_text()
        assert svg.startswith("<?xml") and "<svg" in svg, name


def test_the_figure_command_writes_the_same_figures_twice(tmp_path):
    for out in (tmp_path / "a", tmp_path / "b"):
        run = subprocess.run([sys.executable, "-m", "kvarena.figures", str(out)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    for name in ("bands.svg", "relief.svg"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_relief_figure_pictures_a_real_slide():
    """The figure's arena state is the spec's: the float sits lower after the relief."""
    from kvarena import figures

    a = figures.serving_arena()
    before = a.frontiers("swa")
    need = a.gap_bytes("full") // a.geometry("full").epp + len(a.holes("full")) + 2
    assert a.alloc("full", need) is None and a.relieve("full", need)
    assert a.frontiers("swa")[1] < before[1]


# ------------------------------------------------------------------- the README


def test_the_readme_fits_on_a_few_screens():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_the_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert links, "the README links nowhere"
    missing = [link for link in links if not link.startswith("http") and not (ROOT / link).exists()]
    assert not missing, missing


def test_every_kvarena_command_in_the_readme_parses():
    """Each ``kvarena ...`` line of the README's bash blocks parses with the real parser."""
    import shlex

    from kvarena.cli import parser

    text = (ROOT / "README.md").read_text()
    lines = [
        line.split("#")[0].strip()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S)
        for line in block.splitlines()
        if line.strip().startswith("kvarena ")
    ]
    assert len(lines) >= 6
    for line in lines:
        argv = shlex.split(line)[1:]
        chosen = next(c for c in COMMANDS if c.name == argv[0])
        parser(chosen).parse_args(argv)  # SystemExit on an unknown option


# ------------------------------------------------------- one place per figure

# A measured figure: a ratio with decimals (1.20x, or with the multiplication
# sign), or a time or a rate with its unit (407 µs, 5.46 GB/s, 51,990 ops/s).
TIMES = "\N{MULTIPLICATION SIGN}"
_FIGURE = re.compile(
    rf"(?<![\w.])(?:\d[\d,]*\.\d+ ?[{TIMES}x](?!\w)|\d[\d,]*(?:\.\d+)? ?(?:µs|ms|GB/s|ops/s|MiB/s)(?!\w))"
)
# Pages that state facts or history, not measurements of this code: the
# design, the anchor's published facts, and the changelog (each entry is its day's).
_NOT_RESULTS = {"design.md", "anchor.md", "changelog.md"}


def figures_by_page(pages: dict[str, str]) -> dict[str, set[str]]:
    """Each page's measured figures."""
    return {name: set(_FIGURE.findall(text)) for name, text in pages.items()}


def _links(text: str, other: str) -> bool:
    """Whether a page's text links to the page ``other`` (by its file name)."""
    return re.search(rf"\]\((?:[\w./-]*/)?{re.escape(Path(other).name)}(?:#[^)]*)?\)", text) is not None


def repeated_figures(pages: dict[str, str]) -> list[str]:
    """Figures quoted on two pages where neither links to the other: the
    second place should link to the first (where they link, the quote is
    the summary of the page it points at)."""
    found = figures_by_page(pages)
    problems = []
    names = sorted(found)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if _links(pages[a], b) or _links(pages[b], a):
                continue
            problems += [f"{figure!r} appears in {a} and in {b}" for figure in sorted(found[a] & found[b])]
    return problems


def doc_pages() -> dict[str, str]:
    pages = {str(p.relative_to(DOCS)): p.read_text() for p in DOCS.rglob("*.md")}
    pages = {k: v for k, v in pages.items() if Path(k).name not in _NOT_RESULTS}
    pages["README.md"] = (ROOT / "README.md").read_text()
    return pages


def test_no_measured_figure_is_quoted_on_two_pages():
    problems = repeated_figures(doc_pages())
    assert not problems, "\n".join(problems)


def test_the_figure_check_catches_a_copied_number():
    pages = {"results/bench.md": f"decode 1.20{TIMES} a free list, 407 µs", "guide.md": "see the results"}
    assert repeated_figures(pages) == []
    pages["guide.md"] = f"decode is 1.20{TIMES} a free list"
    assert repeated_figures(pages) == [f"'1.20{TIMES}' appears in guide.md and in results/bench.md"]
    pages["guide.md"] = f"decode is 1.20{TIMES} a free list ([bench](../results/bench.md))"
    assert repeated_figures(pages) == []


@pytest.mark.parametrize("page", sorted(p.name for p in (DOCS / "results").glob("*.md")))
def test_each_results_page_says_how_to_regenerate_and_where_it_ran(page):
    text = (DOCS / "results" / page).read_text()
    assert re.search(r"```bash\n.*\b(kvarena|pytest|tools/)", text, re.S) or "`kvarena " in text, "no command"
    assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), "no date"
    assert re.search(r"2-core|two cores|2 cores|H200|GPU", text), "no machine"
