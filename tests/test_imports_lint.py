"""The moves are finished and stay so (issue 37 item 4), checked on the source alone (AST, no import).

Every `from gym_bridge.<module> import name` points at the module that defines the name (a package `__init__.py`
may re-export); no `X as X` re-export outside an `__init__.py`; the four names renamed in issue 29 are gone; and no
module of gym_bridge/core/ reads a private attribute or imports a private name that another module defines.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gym_bridge"
CODE_FOLDERS = ("gym_bridge", "tests", "environments", "recipes", "benchmarks")
OLD_NAMES = {"RolloutFailure": "FailRollout", "HelperModel": "TextModel", "load_helper_model": "load_text_model",
             "HELPER_APIS": "TEXT_MODEL_APIS"}
"""Names renamed in issue 29 and removed in issue 37 (0.1.0 promises no deprecation period), with their new names."""
PRIVATE_READS_ALLOWED = {
    "bounded/offload.py": {
        "_exit",  # os._exit: the standard library's documented way to end a forked worker without cleanup
        "_processes",  # a ProcessPoolExecutor's worker processes: the standard library has no public accessor
        "_register_atexit",  # threading's hook run before the executor's own shutdown; atexit.register where absent
    },
}
"""Private attributes of the standard library that core/ reads (no gym_bridge module's private is allowed)."""


def python_files(folder: str) -> list[Path]:
    return sorted(path for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts)


def docs_code_blocks() -> list[tuple[Path, str]]:
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    return [(page, block) for page in pages for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)]


def sources() -> list[tuple[Path, str]]:
    code = [(path, path.read_text(encoding="utf-8")) for folder in CODE_FOLDERS for path in python_files(folder)]
    return code + docs_code_blocks()


def module_file(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The module's statements, with those under a top-level `if`/`try` (TYPE_CHECKING, optional imports) inlined."""
    statements: list[ast.stmt] = []
    for node in body:
        statements.append(node)
        if isinstance(node, ast.If):
            statements += _top_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            statements += _top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
    return statements


@cache
def bindings(module: str) -> tuple[frozenset[str], dict[str, tuple[str, str]]]:
    """(names the module defines, {name it imports: (from module, as named there)}) at its top level."""
    path = module_file(module)
    defined: set[str] = set()
    imported: dict[str, tuple[str, str]] = {}
    if path is None:
        return frozenset(), imported
    for node in _top_level(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported |= {alias.asname or alias.name: (node.module, alias.name) for alias in node.names}
    return frozenset(defined), imported


def home(module: str, name: str) -> str:
    """The module that defines `name`, following imports from `module` (or `module` where it is not found)."""
    for _ in range(20):
        defined, imported = bindings(module)
        if name in defined or module_file(f"{module}.{name}") or name not in imported:
            return module
        module, name = imported[name]
        if not module.startswith("gym_bridge"):
            return module
    return module


def misdirected_imports(path: Path, text: str) -> list[str]:
    """`from gym_bridge.<module> import name` where the module (not a package) only imports the name itself."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("gym_bridge")):
            continue
        source = module_file(node.module or "")
        if source is None or source.name == "__init__.py":
            continue
        for alias in node.names:
            if (where := home(node.module or "", alias.name)) != node.module:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: import {alias.name} from {where}, not {node.module}")
    return found


def test_every_import_points_at_the_name_s_home():
    found = [line for path, text in sources() for line in misdirected_imports(path, text)]
    assert found == []


def test_the_home_rule_sees_an_import_through_a_module_that_only_imports_the_name():
    """The check above can fail: a name a module imports (to use it) is found when imported from that module."""
    user = next(path for path in python_files("gym_bridge/core") if path.name != "__init__.py"
                and any(source.startswith("gym_bridge.core.") for source, _ in bindings(_module_name(path))[1].values()))
    module = _module_name(user)
    name, (source, defined_as) = next((name, where) for name, where in bindings(module)[1].items()
                                      if where[0].startswith("gym_bridge.core.") and where[1] == name)
    assert misdirected_imports(ROOT / "x.py", f"from {module} import {name}\n") == [
        f"x.py:1: import {name} from {home(source, defined_as)}, not {module}"]
    assert misdirected_imports(ROOT / "x.py", f"from {home(source, defined_as)} import {name}\nfrom gym_bridge import core\n") == []


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def reexports(path: Path) -> list[str]:
    """`X as X` imports, and names in `__all__` the module imports rather than defines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} as {alias.asname}" for node in ast.walk(tree)
             if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names if alias.asname == alias.name]
    defined, imported = bindings(_module_name(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets):
            listed = [element.value for element in ast.walk(node.value) if isinstance(element, ast.Constant)]
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: __all__ lists {name}, imported from {imported[name][0]}"
                      for name in listed if name in imported and name not in defined]
    return found


def test_no_re_export_outside_a_package_init():
    found = [line for path in python_files("gym_bridge") if path.name != "__init__.py" for line in reexports(path)]
    assert found == []


def test_no_old_name_is_left():
    """Not as code, not in a docstring, not on a docs page (only this file names them, to forbid them)."""
    word = re.compile(r"\b(%s)\b" % "|".join(OLD_NAMES))
    paths = [*(path for folder in (*CODE_FOLDERS, "docs") for path in (ROOT / folder).rglob("*")
               if path.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".txt"} and "__pycache__" not in path.parts),
             ROOT / "README.md"]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in paths if path != Path(__file__).resolve()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if word.search(line)]
    assert found == []


def private_reads(relative: str, text: str) -> list[str]:
    """`obj._name` (obj not self/cls), `getattr(obj, "_name"...)` and `from m import _name` in core/`relative`, where
    the module defines no `_name` of its own (a function, class, variable or `self._name`)."""
    tree = ast.parse(text)
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            own.add(node.attr)
    read: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            read.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                read.append((node.lineno, node.args[1].value))
        elif isinstance(node, ast.ImportFrom):
            read += [(node.lineno, alias.name) for alias in node.names]
    allowed = PRIVATE_READS_ALLOWED.get(relative, set())
    return [f"gym_bridge/core/{relative}:{line}: {name}" for line, name in read
            if name.startswith("_") and not name.startswith("__") and name not in own and name not in allowed]


def test_core_reads_no_private_attribute_of_another_module():
    core = PACKAGE / "core"
    found = [line for path in python_files("gym_bridge/core")
             for line in private_reads(path.relative_to(core).as_posix(), path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_private_rule_sees_a_read_across_modules():
    """The check above can fail: a rollout's `_env` read where no `_env` is defined is found; a class's own is not."""
    across = "def resume(rollout):\n    return rollout._env, getattr(rollout, '_trajectory')\n"
    assert private_reads("resume.py", across) == ["gym_bridge/core/resume.py:2: _env", "gym_bridge/core/resume.py:2: _trajectory"]
    assert private_reads("engine.py", "from gym_bridge.core.rollout import _step\n") == ["gym_bridge/core/engine.py:1: _step"]
    own = "class Rollout:\n    def __init__(self):\n        self._env = None\n    def same(self, other):\n        return other._env\n"
    assert private_reads("rollout.py", own) == []
