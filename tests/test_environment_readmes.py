"""Every environment README's commands run in a fresh shell from the repository root (issue 19 item 18:
seven READMEs said `PYTHONPATH=. python -m pytest ...`, and a fresh shell's `python` has no gym_bridge)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READMES = sorted(ROOT.glob("environments/*/README.md"))
COMMAND = re.compile(r"^(?:.*\s)?(?:\S*python3?)\s+-m\s+(\S+)(.*)$")


def _commands() -> list[tuple[Path, str]]:
    """(README, line) for every line of a ```bash block that runs Python."""
    found = []
    for readme in READMES:
        for block in re.findall(r"```bash\n(.*?)```", readme.read_text(encoding="utf-8"), re.S):
            found += [(readme, line.strip()) for line in block.splitlines() if re.search(r"\bpython3?\b", line)]
    return found


def test_every_python_command_uses_the_project_venv_without_pythonpath():
    commands = _commands()
    assert len(commands) >= 12  # the scan finds the Tests sections
    wrong = [f"{readme.parent.name}: {line}" for readme, line in commands
             if not line.startswith(".venv/bin/python -m ") or "PYTHONPATH" in line]
    assert wrong == []


def test_the_readme_test_commands_collect_in_a_fresh_shell():
    """Each `.venv/bin/python -m pytest environments/NAME` run as written (this interpreter standing in for
    .venv/bin/python), with no PYTHONPATH, from the repository root; collection only, to stay fast."""
    paths = []
    for _, line in _commands():
        match = re.match(r"\.venv/bin/python -m pytest (environments/\w+)", line)
        if match:
            paths.append(match.group(1))
    assert len(set(paths)) >= 10
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *sorted(set(paths))],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "error" not in done.stdout.lower().split("\n")[-2]
