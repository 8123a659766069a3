"""The public API is pinned, and importing gym_bridge stays light."""

import ast
import pathlib
import subprocess
import sys
import tomllib

import gym_bridge

PUBLIC = {
    # writing an environment
    "Environment", "FailureKind", "Item", "RowProblem", "TOKEN_FIELDS", "Task", "ToolError", "Toolset", "VerifyResult",
    "draw_split", "final_text", "last_boxed", "last_tagged", "output_text", "remote_url", "run_in_process",
    "schema_problems", "tool", "without_titles",
    # an environment's own agent loop, text models
    "AgentLoop", "FailRollout", "Limits", "RolloutContext", "TextModel", "ToolCallingLoop", "generate_turn",
    # routing and running
    "ChatTemplate", "Engine", "EngineConfig", "RolloutRecord", "configure", "get_environment", "known_environments",
    "load_tasks", "parse_task", "register", "summarize",
    # policies
    "ChatPolicy", "Generation", "GenerationRequest", "Policy", "SamplingParams", "ScriptedChatPolicy", "ScriptedPolicy",
    # errors
    "BackendError", "ConfigError", "ContextOverflowError", "DataError", "GymBridgeError", "MissingDependencyError", "MissingExtraError",
    "RolloutError", "SetupError", "TemplateError", "UnknownEnvironmentError", "UserError",
}
LAZY = {"TransformersPolicy", "load_text_model", "HarnessEnvironment", "trl", "verl", "nemo_rl"}
"""Public names resolved on first use (not in `__all__`, so a star import stays light)."""
ROOT = pathlib.Path(gym_bridge.__file__).parent.parent


def test_public_names_are_pinned():
    assert set(gym_bridge.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(gym_bridge, name) is not None


def test_lazy_public_names_resolve_and_stay_out_of_a_star_import():
    assert set(gym_bridge._LAZY) == LAZY
    assert not LAZY & set(gym_bridge.__all__)
    assert callable(gym_bridge.load_text_model)


def _gym_bridge_imports(path: pathlib.Path) -> list[str]:
    """What `path` imports from gym_bridge, anywhere in the module: `gym_bridge.x.y` for a
    submodule, `gym_bridge:Name` for a name taken from the package itself."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "gym_bridge"]
        elif isinstance(node, ast.ImportFrom) and node.module == "gym_bridge":
            found += [f"gym_bridge:{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gym_bridge."):
            found.append(node.module)
    return found


def test_environments_import_only_public_names():
    """environments/ (not their tests) take gym_bridge's public names, never a submodule."""
    allowed = {"gym_bridge"} | {f"gym_bridge:{name}" for name in PUBLIC | LAZY}
    code = [path for path in (ROOT / "environments").rglob("*.py") if "tests" not in path.relative_to(ROOT).parts]
    assert len(code) > 20
    offenders = {str(path.relative_to(ROOT)): sorted(set(_gym_bridge_imports(path)) - allowed) for path in code}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_import_check_sees_submodules_and_private_names(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from gym_bridge import Environment, _LAZY_ATTRS\ndef f():\n    from gym_bridge.core.split import draw_split\n")
    assert _gym_bridge_imports(probe) == ["gym_bridge:Environment", "gym_bridge:_LAZY_ATTRS", "gym_bridge.core.split"]


def test_the_environments_ruff_config_keeps_every_root_ban_and_bans_the_submodules():
    """environments/ruff.toml extends the root config, whose banned-api it replaces: it must repeat every entry."""
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-api"]
    nested = tomllib.loads((ROOT / "environments" / "ruff.toml").read_text())
    assert nested["extend"] == "../pyproject.toml"
    banned = nested["lint"]["flake8-tidy-imports"]["banned-api"]
    assert set(root) <= set(banned)
    submodules = {f"gym_bridge.{path.stem}" for path in (ROOT / "gym_bridge").iterdir()
                  if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").exists()}
    assert submodules <= set(banned)


def test_import_loads_no_torch_trainer_vllm_or_ray():
    heavy = ["torch", "transformers", "trl", "verl", "vllm", "ray", "nemo_rl", "accelerate", "datasets", "numpy"]
    code = (
        "import sys, gym_bridge, gym_bridge.core.engine, gym_bridge.cli\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_core_imports_no_adapter_policy_or_trainer_code():
    import pathlib
    import re

    core = pathlib.Path(gym_bridge.__file__).parent / "core"
    banned = re.compile(r"^\s*(from|import)\s+(torch|transformers|trl|verl|vllm|ray|nemo_rl|gym_bridge\.adapters|gym_bridge\.policies)\b", re.M)
    offenders = [str(path.relative_to(core)) for path in core.rglob("*.py") if banned.search(path.read_text())]
    assert offenders == []


def test_text_model_s_old_names_are_gone():
    """`TextModel`, `load_text_model` and `TEXT_MODEL_APIS` were renamed in issue 29 item 7; their old names went in
    issue 37 (0.1.0 promises no deprecation period), from the package and from both text_model modules."""
    import gym_bridge.policies
    from gym_bridge.core import text_model
    from gym_bridge.policies import text_model as policies_text_model
    from tests.test_imports_lint import OLD_NAMES

    old = [name for name, new in OLD_NAMES.items() if new in ("TextModel", "TEXT_MODEL_APIS", "load_text_model")]
    assert len(old) == 3
    for module in (gym_bridge, gym_bridge.policies, text_model, policies_text_model):
        assert [name for name in old if hasattr(module, name)] == [], module.__name__
    assert gym_bridge.TextModel is text_model.TextModel and "load_text_model" in dir(gym_bridge)
    assert policies_text_model.TEXT_MODEL_APIS == ("completions", "chat", "responses")


def test_no_old_helper_model_wording_is_left_in_the_package_or_the_docs():
    """What is now `TextModel` is called so in the package and on the site (the old names themselves are pinned gone
    by tests/test_imports_lint.py)."""
    import re

    old = re.compile(r"helper.models?\b|HELPER_API", re.I)
    paths = [*(ROOT / "gym_bridge").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in paths
             for number, line in enumerate(path.read_text().splitlines(), 1) if old.search(line)]
    assert found == []
