"""`make lint` runs ruff on the whole tree, recipes/ and tools/ included (issue 19 item 18), and the tree passes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_make_lint_checks_every_python_folder():
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "no lint target"
    [command] = [line.strip() for line in recipe.group(1).splitlines() if "ruff" in line]
    paths = command.split("ruff check", 1)[1].split()
    folders = {Path(p).relative_to(ROOT).parts[0] for p in ROOT.rglob("*.py") if not Path(p).relative_to(ROOT).parts[0].startswith(".")}
    assert paths == ["."] or folders <= set(paths), f"{command} skips {sorted(folders - set(paths))}"


def test_the_whole_tree_passes_ruff():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed")
    done = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:]
