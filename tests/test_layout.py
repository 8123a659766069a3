"""The tree is what the README's Layout section says it is, and every module opens with what it owns (issue 21)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gym_bridge"


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def layout_block(readme: str) -> str:
    section = readme.split("\n## Layout\n", 1)[1]
    match = re.search(r"```\n(.*?)```", section, re.S)
    assert match, "the Layout section has no code block"
    return match.group(1)


def named_paths(block: str) -> set[str]:
    """Repository paths the Layout block names: a line at column 0 names paths (the first in full, the rest beside
    it in its folder); a line indented by two names files in the last folder named; deeper lines continue a text."""
    named: set[str] = set()
    folder = ""
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        names = re.split(r" {3,}", line.strip(), maxsplit=1)[0].split() if line.strip() else []
        if not names or indent > 2:
            continue
        if indent == 0:
            first, *rest = names
            folder = first if first.endswith("/") else first.rsplit("/", 1)[0] + "/"
            named.add(first)
            named.update(folder + name for name in rest)
        else:
            named.update(folder + name for name in names)
    return named


def test_every_module_opens_with_a_docstring():
    missing = [str(path.relative_to(ROOT)) for path in modules() if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))]
    assert not missing, f"modules without a docstring saying what they own: {missing}"


def test_the_layout_names_every_module_of_the_package():
    named = named_paths(layout_block((ROOT / "README.md").read_text(encoding="utf-8")))
    expected = {str(path.parent.relative_to(ROOT)) + "/" if path.name == "__init__.py" and path.parent != PACKAGE
                else str(path.relative_to(ROOT)) for path in modules()}
    assert not expected - named, f"README's Layout does not name {sorted(expected - named)} (add a line: what it owns)"


def test_the_layout_names_nothing_that_does_not_exist():
    named = named_paths(layout_block((ROOT / "README.md").read_text(encoding="utf-8")))
    stale = sorted(path for path in named if "<" not in path and not (ROOT / path).exists())
    assert not stale, f"README's Layout names what is not in the tree: {stale}"


def test_the_layout_parser_reads_folders_files_and_continuations():
    block = ("pkg/a.py b.py   two modules\npkg/sub/         a package\n  c.py d.py      two files in it\n"
             "                 a continued text naming e.py\ndocs/            images\n")
    assert named_paths(block) == {"pkg/a.py", "pkg/b.py", "pkg/sub/", "pkg/sub/c.py", "pkg/sub/d.py", "docs/"}


def test_the_package_top_level_holds_packages_only():
    """Issue 29 item 5: besides `__init__`, `__main__` and one private helper (`_lazy`), gym_bridge/ holds packages."""
    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in {"__init__.py", "__main__.py", "_lazy.py"})
    assert loose == [], f"modules at gym_bridge/'s top level (put each in the package it belongs to): {loose}"
    folders = [path for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"]
    assert all((path / "__init__.py").exists() for path in folders), "a folder under gym_bridge/ without __init__.py"
