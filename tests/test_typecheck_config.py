"""The type check's escape hatches stay few and explained (issue 21).

Every `# type: ignore` in gym_bridge/ names its error code and, in a comment on the same line, the
library that forces it; pyproject's [tool.mypy] overrides relax only third-party modules, never ours.
`make typecheck` itself runs mypy (a minute or more, so not here).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")
REASON = re.compile(r"^\s*#\s*\S.{9,}")
"""A comment of at least ten characters after the ignore."""

OUR_PACKAGES = ("gym_bridge", "environments", "recipes", "tests", "benchmarks", "tools")


def _ignores() -> list[tuple[str, int, re.Match[str]]]:
    found = []
    for path in sorted((ROOT / "gym_bridge").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            match = IGNORE.search(line)
            if match:
                found.append((path.relative_to(ROOT).as_posix(), number, match))
    return found


def test_every_type_ignore_names_its_error_code() -> None:
    bare = [f"{path}:{number}" for path, number, match in _ignores() if not match["codes"]]
    assert not bare, f"a bare `# type: ignore` hides every error on its line; name the code: {bare}"


def test_every_type_ignore_says_why() -> None:
    unexplained: dict[str, list[int]] = {}
    for path, number, match in _ignores():
        if not REASON.match(match["rest"]):
            unexplained.setdefault(path, []).append(number)
    assert not unexplained, f"say on the same line which library forces each ignore (`# type: ignore[code]  # reason`): {unexplained}"


def test_mypy_overrides_relax_only_third_party_modules() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    modules = [module for override in config.get("overrides", []) for module in
               ([override["module"]] if isinstance(override["module"], str) else override["module"])]
    modules += config.get("untyped_calls_exclude", [])
    ours = [module for module in modules if module.split(".")[0] in OUR_PACKAGES]
    assert modules and not ours, f"[tool.mypy] relaxes checks on our own code: {ours}"
