"""The public API is pinned, and importing gym_bridge stays light."""

import subprocess
import sys

import gym_bridge

PUBLIC = {
    "AgentLoop", "BackendError", "ChatTemplate", "ContextOverflowError", "DataError", "Engine", "EngineConfig",
    "Environment", "FailureKind", "Generation", "GenerationRequest", "GymBridgeError", "HelperModel", "Item", "Limits",
    "MissingDependencyError", "Policy", "RolloutContext", "RolloutFailure", "RolloutRecord", "SamplingParams",
    "ScriptedPolicy", "Task", "TemplateError", "ToolCallingLoop", "ToolError", "UnknownEnvironmentError",
    "VerifyResult", "configure", "final_text", "get_environment", "known_environments", "load_tasks", "parse_task", "register",
    "run_in_process", "summarize", "tool",
    "RowProblem", "last_boxed", "last_tagged", "output_text",
}


def test_public_names_are_pinned():
    assert set(gym_bridge.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(gym_bridge, name) is not None


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
    offenders = [path.name for path in core.glob("*.py") if banned.search(path.read_text())]
    assert offenders == []
