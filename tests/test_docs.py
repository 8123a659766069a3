"""The documentation (issue 29 item 11): the README is a front door of at most ~150 lines whose links resolve, the
site in docs/ builds with `mkdocs build --strict`, its generated CLI reference holds every command's --help, and the
Python examples on its pages run (each one that cannot run on a CPU says why, in a `<!-- not run: ... -->` line)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])
NOT_RUN = re.compile(r"<!-- not run: (\S.*?) -->")
FENCE = re.compile(r"^```python\n(.*?)^```$", re.S | re.M)


def generated_pages():
    return load_script(DOCS / "hooks" / "generated_pages.py")


def python_blocks(page: Path) -> list[tuple[str, str | None]]:
    """(code, why it is not run or None) for every ```python block of a page, in order."""
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.fullmatch(before.strip())
        blocks.append((match.group(1), marker.group(1) if marker else None))
    return blocks


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    # the two commands, exactly as the Quick start has always given them (a fresh machine's first step)
    assert "make demo   # creates .venv with what the demo needs, evaluates 3 environments on the embedded model\n" in text
    assert "make test   # adds everything the tests need to .venv, then runs the fast test suite (CPU only)\n" in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which is not in the tree"


def test_every_page_is_in_the_sites_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages and not {p for p in pages if f": {p}\n" not in nav}, "a page of docs/ is missing from mkdocs.yml's nav"


def test_the_python_examples_on_the_pages_run(tmp_path):
    """Each page's runnable blocks run in order as one script, in a fresh interpreter (as a reader pastes them)."""
    ran = 0
    for page in PAGES:
        runnable = [code for code, why in python_blocks(page) if why is None]
        if not runnable:
            continue
        script = tmp_path / (page.stem + "_examples.py")
        script.write_text("\n\n".join(runnable), encoding="utf-8")
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, f"{os.path.relpath(page, ROOT)}'s examples failed:\n{done.stderr}"
        ran += len(runnable)
    assert ran >= 2, "the 'Writing an environment' examples are no longer found"


def test_an_example_that_is_not_run_says_why_and_still_parses():
    not_run = [(page, code) for page in PAGES for code, why in python_blocks(page) if why is not None]
    assert not_run, "expected the GPU-only TRL example to be marked"
    for page, code in not_run:
        ast.parse(code, filename=str(page))


def test_a_page_example_that_fails_fails_the_test(tmp_path, monkeypatch):
    """The runner above is not vacuous: a page whose block raises is reported."""
    page = tmp_path / "broken.md"
    page.write_text("# broken\n\n```python\nraise SystemExit(3)\n```\n\n<!-- not run: needs a GPU -->\n```python\nimport nothing\n```\n")
    assert python_blocks(page) == [("raise SystemExit(3)\n", None), ("import nothing\n", "needs a GPU")]
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    with pytest.raises(AssertionError, match="broken.md's examples failed"):
        test_the_python_examples_on_the_pages_run(tmp_path)


def test_the_cli_reference_holds_every_commands_help():
    from gym_bridge.cli import build_parser

    hook = generated_pages()
    page = hook.fill("reference/cli.md", (DOCS / "reference" / "cli.md").read_text(encoding="utf-8"))
    lines = [line for line, _, _ in hook.commands()]
    top = build_parser()
    subcommands = next(a for a in top._actions if a.__class__.__name__ == "_SubParsersAction").choices
    assert {f"gym-bridge {name}" for name in subcommands} <= set(lines)
    assert {"gym-bridge eval", "gym-bridge data prepare", "gym-bridge env check"} <= set(lines)
    for line, parser, _ in hook.commands():
        assert f"## `{line}`\n" in page
        assert hook.help_text(parser).rstrip() in page, f"{line}: its --help is not on the page as the parser prints it"
    assert "<!-- generated" not in page


def test_a_page_that_lost_its_marker_is_an_error():
    with pytest.raises(ValueError, match="lost its marker"):
        generated_pages().fill("reference/cli.md", "# CLI reference\n")


def test_make_docs_builds_the_site_strictly_and_ci_runs_it(tmp_path):
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^docs: .*\n\t.*mkdocs build --strict", makefile, re.M)
    assert "docs$(VLLM_EXTRA)]'" in makefile  # `make install` installs the docs extra
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.index("make typecheck") < ci.index("make docs") < ci.index("make test")
    assert "/site/" in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_the_site_builds_with_strict_links(tmp_path):
    pytest.importorskip("mkdocs", reason="the `docs` extra (mkdocs, mkdocs-material) is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the `docs` extra (mkdocs, mkdocs-material) is not installed: pip install -e '.[docs]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "gym-bridge env check" in cli and "--max-failure-fraction" in cli
    layout = (tmp_path / "site" / "development" / "layout" / "index.html").read_text(encoding="utf-8")
    assert "engine.py" in layout and "generated:" not in layout
