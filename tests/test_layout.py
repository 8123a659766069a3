"""The tree is what the docs' Layout page says it is, and every module opens with what it owns (issue 21).

The page (docs/development/layout.md) holds the repository's top level as a hand-written block, and the package part
generated from the module docstrings when the site is built (docs/hooks/generated_pages.py, issue 29)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gym_bridge"
LAYOUT_PAGE = ROOT / "docs" / "development" / "layout.md"


def generated_pages():
    return load_script(ROOT / "docs" / "hooks" / "generated_pages.py")


def built_layout_page() -> str:
    """The Layout page as the site shows it: the hand-written block plus the generated package tables."""
    return generated_pages().fill("development/layout.md", LAYOUT_PAGE.read_text(encoding="utf-8"))


def generated_paths(page: str) -> set[str]:
    """Repository paths the generated part names: each `### `folder/`` heading, and the modules of its table."""
    named: set[str] = set()
    folder = ""
    for line in page.splitlines():
        heading = re.fullmatch(r"### `(\S+/)`", line)
        row = re.match(r"\| `([^`]+\.py)` \|", line)
        if heading:
            folder = heading.group(1)
            named.add(folder)
        elif row and folder:
            named.add(folder + row.group(1))
    return named


def modules() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def layout_block(page: str) -> str:
    match = re.search(r"```\n(.*?)```", page, re.S)
    assert match, "the Layout page has no code block"
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
    page = built_layout_page()
    named = named_paths(layout_block(page)) | generated_paths(page)
    expected = {str(path.parent.relative_to(ROOT)) + "/" if path.name == "__init__.py"
                else str(path.relative_to(ROOT)) for path in modules()}
    assert not expected - named, f"the docs' Layout page does not name {sorted(expected - named)}"


def test_the_layout_gives_every_module_what_its_docstring_says():
    page = built_layout_page()
    for path in modules():
        summary = generated_pages().docstring_summary(path)
        assert summary and summary.replace("|", "\\|") in page, f"{path.relative_to(ROOT)}: its docstring's first paragraph is not on the page"


def test_the_layout_names_nothing_that_does_not_exist():
    page = built_layout_page()
    named = named_paths(layout_block(page)) | generated_paths(page)
    stale = sorted(path for path in named if "<" not in path and not (ROOT / path).exists())
    assert not stale, f"the docs' Layout page names what is not in the tree: {stale}"


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
