"""`pip install gym-bridge` is light (issue 29 item 10): torch, transformers, gguf, safetensors and math-verify
come with extras (`local`, `environments`), and without them gym_bridge still imports, serves `/run` and runs the
agent loop, and asking for the embedded model names `pip install 'gym-bridge[local]'`. (A fresh virtualenv
is too slow for the default suite: the test reads pyproject's requirements and blocks the modules instead.)"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import textwrap
import tomllib

ROOT = pathlib.Path(__file__).parent.parent
MODEL_STACK = {"torch", "transformers", "gguf", "safetensors"}


def names(requirements: list[str]) -> set[str]:
    """The distribution names of requirement strings (`torch>=2.4; ...` -> `torch`)."""
    return {re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_the_core_requirements_hold_no_model_stack_and_the_extras_do():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = names(project["dependencies"])
    assert not core & (MODEL_STACK | {"math-verify"}), core
    assert MODEL_STACK <= names(project["optional-dependencies"]["local"])
    assert "math-verify" in names(project["optional-dependencies"]["environments"])  # the math environment's verifier


BLOCKED = ("torch", "transformers", "gguf", "safetensors", "math_verify")
SCRIPT = textwrap.dedent('''
    import asyncio, importlib.abc, sys

    class Uninstalled(importlib.abc.MetaPathFinder):
        """One of Python's finders, blind to the BLOCKED packages: they look not installed."""
        def __init__(self, finder):
            self.finder = finder
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                return None
            return self.finder.find_spec(name, path, target)
        def find_distributions(self, *args, **kwargs):  # installed distributions (entry points) as before
            return getattr(self.finder, "find_distributions", lambda *a, **k: ())(*args, **kwargs)

    sys.meta_path[:] = [Uninstalled(finder) for finder in sys.meta_path]

    import gym_bridge
    import gym_bridge.cli  # the command line
    from gym_bridge.serve.agent_server import AgentServer, AgentServerSettings  # the /run server
    from gym_bridge.core.engine import Engine, EngineConfig
    from gym_bridge.core.task import parse_task
    from gym_bridge.policies.factory import PolicySpec, build_policy

    # the agent loop, for real: a weather rollout driven by the shipped chat double
    policy = gym_bridge.ScriptedChatPolicy({"": ['<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>', "Cold."]})
    AgentServer(AgentServerSettings(envs=("weather",)), policy=policy)
    row = {"responses_create_params": {"input": "Weather in Oslo?"}, "environment": "weather"}
    record = asyncio.run(Engine(policy, None, EngineConfig()).rollout(parse_task(row, index=0)))
    print("rollout", record.failure_kind, record.reward)
    for kind in ("embedded", "transformers"):
        try:
            build_policy(PolicySpec(kind=kind))
        except gym_bridge.MissingDependencyError as error:
            print(kind, "->", error)
    try:
        gym_bridge.get_environment("math").check_ready()
    except gym_bridge.MissingDependencyError as error:
        print("math ->", error)
    print("loaded", sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED))
''')


def test_without_the_model_stack_gym_bridge_serves_runs_rollouts_and_names_the_extra():
    done = subprocess.run([sys.executable, "-c", f"BLOCKED = {BLOCKED!r}\n{SCRIPT}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "rollout None 1.0" in lines
    assert "embedded -> the embedded model needs torch and transformers (No module named 'torch'): pip install 'gym-bridge[local]'" in lines
    assert "transformers -> a transformers policy needs torch and transformers (No module named 'torch'): pip install 'gym-bridge[local]'" in lines
    assert "math -> the math environment checks answers with math-verify: pip install 'gym-bridge[environments]'" in lines
    assert lines[-1] == "loaded []"
