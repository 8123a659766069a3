"""The moves are finished and stay so (issue 37 item 4), checked on the source alone (AST, no import).

Every `from gym_bridge.<module> import name` points at the module that defines the name (a package `__init__.py`
may re-export); no `X as X` re-export outside an `__init__.py`; the names renamed in issues 29 and 37 are gone; no
module of gym_bridge/core/ reads a private attribute or imports a private name that another module defines; and
"segment" means a harness's token view only, in the modules and pages that deal in it.
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
             "HELPER_APIS": "TEXT_MODEL_APIS", "ParsedTurn": "Turn", "ParsedCall": "ToolCall", "ChatTurn": "Turn",
             "ChatToolCall": "ToolCall", "ProbeTurn": "Turn", "ModelServers": "RoutedChatPolicy",
             "answer_message": "answer_turn", "last_text": "final_text"}
"""Names renamed in issue 29 or replaced in issue 37 and removed (0.1.0 promises no deprecation period), with their new
names."""
OLD_NAMES_PAGE = ROOT / "docs" / "development" / "layout.md"
OLD_NAMES_BEGIN, OLD_NAMES_END = "<!-- old names: begin -->", "<!-- old names: end -->"
"""The one place old names may stand: the "before" picture of a model turn's path, between these two lines of this page."""
SEGMENT_ALLOWED = {
    "gym_bridge/capture/__init__.py", "gym_bridge/capture/assembly.py", "gym_bridge/capture/environment.py",
    "gym_bridge/core/trajectory.py", "gym_bridge/core/training_row.py", "gym_bridge/core/dialects/nemo_gym.py",
    "gym_bridge/trl/_async/rows.py", "gym_bridge/trl/_rollout.py", "gym_bridge/trl/_rewards.py",
    "gym_bridge/verl/_agent_loop.py", "environments/verifiers/__init__.py", "environments/verifiers/README.md",
    "environments/verifiers/tests/test_verifiers_env.py", "docs/harness.md", "docs/training/async.md",
    "docs/environments-from-elsewhere.md",
}
"""Where "segment" may appear: it means a harness's token view (`TokenView.segments`, the record key `segments`: the
calls of a harness whose prompts extend one token stream; a rewritten history starts the next), and these modules and
pages deal in it. A journal's files are journal files, the view's runs of model and environment tokens are token runs,
a packed micro-batch holds packed sequences."""
SEGMENT_FOLDERS = ("gym_bridge", "environments", "recipes", "benchmarks", "docs")
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


def text_files(folders: tuple[str, ...]) -> list[Path]:
    """The code, docs and config files under `folders`, and the README."""
    return [*(path for folder in folders for path in sorted((ROOT / folder).rglob("*"))
              if path.suffix in {".py", ".md", ".yaml", ".yml", ".toml", ".txt"} and "__pycache__" not in path.parts),
            ROOT / "README.md"]


def old_names_in(path: Path, text: str) -> list[str]:
    """The lines of `text` that name an old name, but for those between the markers of `OLD_NAMES_PAGE`."""
    word = re.compile(r"\b(%s)\b" % "|".join(OLD_NAMES))
    found, exempt = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if path == OLD_NAMES_PAGE and line.strip() in (OLD_NAMES_BEGIN, OLD_NAMES_END):
            exempt = line.strip() == OLD_NAMES_BEGIN
        elif word.search(line) and not exempt:
            found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_old_name_is_left():
    """Not as code, not in a docstring, not on a docs page (only this file names them, to forbid them, and the marked
    "before" picture of docs/development/layout.md shows them)."""
    found = [line for path in text_files((*CODE_FOLDERS, "docs")) if path != Path(__file__).resolve()
             for line in old_names_in(path, path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_old_name_rule_sees_an_old_name_and_exempts_only_the_marked_picture():
    """The check above can fail: `ChatTurn` in a module is found, markers elsewhere exempt nothing, and the layout
    page's own picture holds old names between its markers (so the exemption is still needed, and still narrow)."""
    module = PACKAGE / "core" / "turn.py"
    marked = f"{OLD_NAMES_BEGIN}\nChatTurn\n{OLD_NAMES_END}\nlast_text\n"
    assert old_names_in(module, "from x import ChatTurn\n") == ["gym_bridge/core/turn.py:1: from x import ChatTurn"]
    assert old_names_in(module, marked) == ["gym_bridge/core/turn.py:2: ChatTurn", "gym_bridge/core/turn.py:4: last_text"]
    assert old_names_in(OLD_NAMES_PAGE, marked) == ["docs/development/layout.md:4: last_text"]
    page = OLD_NAMES_PAGE.read_text(encoding="utf-8")
    assert page.count(OLD_NAMES_BEGIN) == page.count(OLD_NAMES_END) == 1
    assert old_names_in(ROOT / "x.md", page) != []


def segment_lines(path: Path, text: str) -> list[str]:
    """The lines of `text` that say "segment" (any case, alone or in an identifier) when `path` is not allowed to."""
    if path.relative_to(ROOT).as_posix() in SEGMENT_ALLOWED:
        return []
    return [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for number, line in enumerate(text.splitlines(), 1)
            if "segment" in line.lower()]


def test_segment_means_a_harness_token_view_only_where_that_is_dealt_in():
    found = [line for path in text_files(SEGMENT_FOLDERS) for line in segment_lines(path, path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_segment_rule_sees_the_word_outside_the_allowed_modules():
    """The check above can fail: a journal's `_SEGMENT_NAME` or a view's `segments(record)` is found; the harness
    assembly's own use is not; and every allowed file still exists and uses the word (no stale entry)."""
    assert segment_lines(PACKAGE / "core" / "journal.py", "x = 1\n_SEGMENT_NAME = 2\n") == ["gym_bridge/core/journal.py:2: _SEGMENT_NAME = 2"]
    assert segment_lines(PACKAGE / "view" / "reading.py", "def segments(record): ...\n") != []
    assert segment_lines(PACKAGE / "capture" / "assembly.py", "segments: tuple[TokenView, ...]\n") == []
    stale = [name for name in sorted(SEGMENT_ALLOWED) if not (ROOT / name).is_file()
             or "segment" not in (ROOT / name).read_text(encoding="utf-8").lower()]
    assert stale == []


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
