"""The docs pages written from the code, at build time (an mkdocs hook, `hooks:` in mkdocs.yml).

`reference/cli.md` gets every `gym-bridge` command's `--help`, read from the argparse parsers themselves
(`gym_bridge.cli.build_parser`), and `development/layout.md` gets the package's modules, each with the first
paragraph of its docstring. A page holds a marker line where its generated part goes, so neither can go stale:
nothing generated is committed. `python docs/hooks/generated_pages.py cli|layout` prints a part.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gym_bridge"
HELP_COLUMNS = 100
"""The width `--help` is wrapped to on the page (argparse reads it from $COLUMNS)."""


def commands() -> Iterator[tuple[str, argparse.ArgumentParser, list[str]]]:
    """(command line, its parser, its aliases) for `gym-bridge` and every subcommand, depth first, in --help's order."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gym_bridge.cli import build_parser

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> Iterator[tuple[str, argparse.ArgumentParser, list[str]]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                names: dict[int, list[str]] = {}
                for name, sub in action.choices.items():
                    names.setdefault(id(sub), []).append(name)
                for name, sub in action.choices.items():
                    if names[id(sub)][0] == name:
                        yield " ".join([*words, name]), sub, names[id(sub)][1:]
                        yield from walk(sub, [*words, name])

    root = build_parser()
    yield "gym-bridge", root, []
    yield from walk(root, ["gym-bridge"])


def help_text(parser: argparse.ArgumentParser) -> str:
    """The parser's --help as a terminal HELP_COLUMNS wide shows it."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        return parser.format_help()
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def cli_reference() -> str:
    """One section per command: its name, aliases, and its --help verbatim."""
    sections = []
    for line, parser, aliases in commands():
        alias_note = f"Also spelt: {', '.join(f'`{a}`' for a in aliases)}.\n\n" if aliases else ""
        sections.append(f"## `{line}`\n\n{alias_note}```text\n{help_text(parser).rstrip()}\n```\n")
    return "\n".join(sections)


def docstring_summary(path: Path) -> str:
    """The first paragraph of a module's docstring on one line ('' when it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def layout() -> str:
    """A table per package folder of gym_bridge: the folder's own docstring (its `__init__.py`), then each other
    module and what it owns."""
    folders = sorted({p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts})
    parts = []
    for folder in folders:
        rel = folder.relative_to(ROOT).as_posix() + "/"
        init = folder / "__init__.py"
        rows = ["| module | what it owns |", "|---|---|"]
        for path in sorted(p for p in folder.glob("*.py") if p.name != "__init__.py"):
            rows.append(f"| `{path.name}` | {_cell(docstring_summary(path))} |")
        data = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix in {".yaml", ".html", ".json"})
        if data:
            rows.append(f"| {', '.join(f'`{name}`' for name in data)} | data files shipped with the package |")
        intro = _cell(docstring_summary(init)) if init.exists() else ""
        parts.append(f"### `{rel}`\n\n{intro}\n\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "**(no docstring)**"


GENERATED: dict[str, tuple[str, Callable[[], str]]] = {
    "reference/cli.md": ("<!-- generated: cli-reference -->", cli_reference),
    "development/layout.md": ("<!-- generated: package-layout -->", layout),
}
"""Page (under docs/) -> (its marker line, what replaces it)."""


def fill(src_uri: str, markdown: str) -> str:
    """The page's markdown with its marker replaced by the generated part; other pages unchanged."""
    if src_uri not in GENERATED:
        return markdown
    marker, generate = GENERATED[src_uri]
    if marker not in markdown:
        raise ValueError(f"docs/{src_uri} lost its marker line {marker!r}: the generated part has nowhere to go")
    return markdown.replace(marker, generate())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: fill the generated pages."""
    return fill(page.file.src_uri, markdown)


if __name__ == "__main__":
    print({"cli": cli_reference, "layout": layout}[sys.argv[1]]())
