"""MkDocs hooks: pages generated at build time, from the code.

- ``reference/cli.md``'s ``<!-- kvarena-help -->`` marker becomes every
  ``kvarena`` command's ``--help``, read from the parser itself;
- the figures of ``kvarena.figures`` are drawn from real arena states
  into the site (``figures/*.svg``).
"""

from mkdocs.structure.files import File, Files

from kvarena import figures
from kvarena.cli import COMMANDS, parser

MARKER = "<!-- kvarena-help -->"


def cli_help() -> str:
    """``kvarena --help`` and each command's ``--help``, as Markdown sections."""
    parts = ["## kvarena", "", "```text", parser().format_help().rstrip(), "```", ""]
    for command in COMMANDS:
        top = parser(command)
        sub = next(a for a in top._subparsers._group_actions if a.dest == "cmd")
        parts += [
            f"## kvarena {command.name}",
            "",
            "```text",
            sub.choices[command.name].format_help().rstrip(),
            "```",
            "",
        ]
    return "\n".join(parts)


def on_page_markdown(markdown, page, config, files):
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_help())
    return markdown


def on_files(files: Files, config) -> Files:
    for name, svg in figures.draw_all().items():
        files.append(File.generated(config, f"figures/{name}", content=svg))
    return files
