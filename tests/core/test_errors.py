"""The error tree (every error under GymBridgeError, on one branch, only leaves raised) and the boundary's classification table."""

import ast
import builtins
import importlib
import pathlib

import pytest

import gym_bridge
from gym_bridge.core.errors import (
    FAILURE_KINDS,
    AbortedCall,
    BackendError,
    ContextOverflowError,
    ConfigError,
    DataError,
    ErrorAnswer,
    GymBridgeError,
    RolloutError,
    FailRollout,
    UserError,
    classify,
)

ROOT = pathlib.Path(gym_bridge.__file__).parent.parent
BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)}


OTHER_VENV_FILES = {"environments/bfcl/worker.py", "environments/verifiers/worker.py"}
"""Workers that run in an ecosystem's own virtualenv (no gym_bridge there), as subprocesses: their exceptions never
reach gym_bridge's code, only their JSON answers do."""


def exception_classes() -> dict[str, tuple[str, str]]:
    """`module:Class` -> (module, class) of every class in gym_bridge/ and environments/ that derives from
    an exception, read from the source (a class is one when a base is a builtin exception or such a class)."""
    defined: list[tuple[str, str, set[str]]] = []
    for folder in ("gym_bridge", "environments"):
        for path in (ROOT / folder).rglob("*.py"):
            if "tests" in path.relative_to(ROOT).parts or path.relative_to(ROOT).as_posix() in OTHER_VENV_FILES:
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases = {base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
                             if isinstance(base, (ast.Name, ast.Attribute))}
                    defined.append((module, node.name, bases))
    names, found = set(BUILTIN_EXCEPTIONS), {}
    while True:
        new = {f"{module}:{name}": (module, name) for module, name, bases in defined if bases & names}
        if new.keys() == found.keys():
            return found
        found = new
        names |= {name for _, name in found.values()}


def test_the_source_scan_finds_errors_of_every_kind():
    found = exception_classes()
    # a builtin base, a base from another module, a base from the same module
    assert {"gym_bridge.core.errors:UserError", "gym_bridge.policies.http:ServerUnreachableError",
            "gym_bridge.core.errors:ContextOverflowError", "environments.llm_judge:JudgeFailure"} <= found.keys()


def test_every_error_derives_from_gym_bridge_error_on_exactly_one_branch():
    """Private exceptions (`_Name`) are signals caught inside their module and may stay outside the tree."""
    off_tree, two_branches, private = [], [], []
    for key, (module, name) in exception_classes().items():
        cls = getattr(importlib.import_module(module), name)
        if cls is GymBridgeError:
            continue
        if name.startswith("_"):
            private.append(key)
        elif not issubclass(cls, GymBridgeError):
            off_tree.append(key)
        elif sum(issubclass(cls, branch) for branch in (UserError, RolloutError, ErrorAnswer)) != 1:
            two_branches.append(key)
        if issubclass(cls, RolloutError):
            assert cls.failure_kind in FAILURE_KINDS, key
    assert off_tree == [] and two_branches == []
    assert len(private) <= 4  # remote.py's retry signal, offload's stale worker: the few that never leave their module


def test_the_user_errors_and_rollout_errors_are_the_tree_s():
    """Each imports from its home only (issue 37: the old places no longer re-export them; tests/test_imports_lint.py)."""
    from gym_bridge.core.environment import ToolError
    from gym_bridge.core.errors import FailureKind, TokenPolicyRequiredError
    from gym_bridge.policies.embedded import EmbeddedModelUnavailableError

    assert FailureKind is gym_bridge.FailureKind and gym_bridge.BackendError is BackendError
    assert issubclass(ToolError, RolloutError) and ToolError.failure_kind == "env"
    assert issubclass(TokenPolicyRequiredError, UserError) and issubclass(TokenPolicyRequiredError, TypeError)
    assert issubclass(EmbeddedModelUnavailableError, UserError)  # a missing extra: the CLI exits 2 with the hint
    assert issubclass(DataError, ValueError)  # old `except ValueError` still catch it


def test_user_mistakes_the_adapters_raised_as_value_error_are_user_errors_that_still_are_value_errors():
    from gym_bridge.serve.agent_server import AgentServer, AgentServerSettings
    from gym_bridge.core.dialects.chat import ApiError

    with pytest.raises(ConfigError, match="--env NAME") as raised:
        AgentServer(AgentServerSettings(envs=()), policy=object())
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, UserError)
    assert issubclass(ApiError, ErrorAnswer) and not issubclass(ApiError, UserError)  # an HTTP answer, not a CLI exit


class Boom(Exception):
    pass


def failure(error: BaseException, **kwargs) -> tuple[str, str]:
    made = classify(error, **kwargs)
    return made.kind, made.reason


@pytest.mark.parametrize(("error", "step", "expected"), [
    # the agent loop and model calls: a RolloutError keeps its kind, the deadline is a timeout, the rest infra
    (FailRollout("env", "no server"), "rollout", ("env", "no server")),
    (BackendError("connection refused"), "rollout", ("infra", "generation backend: connection refused")),
    (ContextOverflowError("9000 > 8192"), "rollout", ("context_overflow", "9000 > 8192")),
    (AbortedCall(SystemExit(3)), "rollout", ("env", "SystemExit(3)")),
    (TimeoutError(), "rollout", ("timeout", "rollout exceeded its deadline of 600 s")),
    (Boom("a bug"), "rollout", ("infra", "Boom: a bug")),
    # environment code: the step decides the kind, whatever the type (a FailRollout raised on purpose excepted)
    (FailRollout("env", "no server"), "setup", ("env", "no server")),
    (Boom("x"), "setup", ("env", "setup raised Boom: x")),
    (TimeoutError(), "setup", ("env", "setup did not return within 600 s")),
    (Boom("x"), "close", ("env", "close raised Boom: x")),
    (Boom("x"), "tool", ("env", "tool raised Boom: x")),
    (BackendError("judge down"), "verify", ("verifier", "verify raised BackendError: judge down")),
    (AbortedCall(KeyboardInterrupt("pressed")), "verify", ("verifier", "verify raised KeyboardInterrupt: pressed")),
    (TimeoutError(), "verify", ("verifier", "verify did not return within 600 s")),
    (FailRollout("verifier", "no verdict"), "verify", ("verifier", "no verdict")),
])
def test_the_boundary_classifies_each_escape(error, step, expected):
    assert failure(error, step=step, timeout_s=600.0) == expected


def test_the_boundary_names_the_call_and_works_without_a_bound():
    assert failure(TimeoutError(), step="tool", what="tool 'measure'", timeout_s=0.5) == ("env", "tool 'measure' did not return within 0.5 s")
    assert failure(TimeoutError(), step="setup") == ("env", "setup did not return in time")
    original = FailRollout("infra", "x")
    assert classify(original, step="verify") is original


def raised_names(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, class name) of every `raise Name(...)` / `raise module.Name(...)` / `raise Name` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                found.append((node.lineno, target.id))
            elif isinstance(target, ast.Attribute):
                found.append((node.lineno, target.attr))
    return found


def branch_names() -> set[str]:
    """gym_bridge's error classes that another error class derives from, and the root: the ones never raised."""
    found = exception_classes()
    ours = {name for _, name in found.values()}
    bases: set[str] = set()
    for folder in ("gym_bridge", "environments"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and node.name in ours:
                    bases |= {base.id if isinstance(base, ast.Name) else base.attr for base in node.bases
                              if isinstance(base, (ast.Name, ast.Attribute))}
    return (bases & ours) | {"GymBridgeError"}


def test_the_branch_scan_sees_the_tree_s_branches_and_not_its_leaves():
    branches = branch_names()
    assert {"GymBridgeError", "UserError", "RolloutError", "BackendError", "MissingDependencyError"} <= branches
    assert not {"DataError", "ContextOverflowError", "ServerUnreachableError"} & branches


def test_only_leaf_error_classes_are_raised():
    """A raise names the concept (DataError, ConfigError, ...), never a branch (UserError, RolloutError, BackendError,
    ...) or the root: a caller can catch exactly what it handles, and the tree says what can happen."""
    branches = branch_names()
    raised = [f"{path.relative_to(ROOT)}:{line} raises {name}" for folder in ("gym_bridge", "environments")
              for path in sorted((ROOT / folder).rglob("*.py")) for line, name in raised_names(path) if name in branches]
    assert raised == []


def test_fail_rollout_s_old_name_is_gone():
    """`FailRollout` was renamed in issue 29 item 7 (one name beside the `RolloutError` family); its old name went in
    issue 37 (0.1.0 promises no deprecation period), from the package, core.errors and core.agent_loop."""
    from gym_bridge.core import agent_loop, errors
    from tests.test_imports_lint import OLD_NAMES

    [old] = [name for name, new in OLD_NAMES.items() if new == "FailRollout"]
    assert [module.__name__ for module in (gym_bridge, errors, agent_loop) if hasattr(module, old)] == []
    assert gym_bridge.FailRollout is FailRollout and "FailRollout" in gym_bridge.__all__
