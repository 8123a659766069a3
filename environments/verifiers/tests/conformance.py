"""What the tests compare against: one v1 episode run by verifiers' own runner (`vf-eval`, in `.venv-verifiers`)
with its client pointed at a capture session over a scripted policy, and the same task through gym_bridge's engine."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from environments.verifiers import HERE, VENV, VerifiersEnvironment
from gym_bridge.capture.server import capture_server
from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import Generation, SamplingParams, ScriptedPolicy
from gym_bridge.core.task import Task, parse_task
from gym_bridge.core.template.chat_template import ChatTemplate

MODEL = VerifiersEnvironment.model_name
EVAL_TOML = """model = "{model}"
push = false
output_dir = "{out}"
max_concurrent = 1
num_rollouts = {repeats}
[client]
type = "eval"
base_url = "{url}"
api_key_var = "OPENAI_API_KEY"
[select.include]
idx = ["{idx}:{end}"]
[env]
id = "{env_id}"
[env.taskset]
id = "{taskset}"
[env.{seat}.harness]
id = "null"
[env.{seat}.runtime]
type = "subprocess"
"""
SEATS = {"user-sim": ("assistant", "user"), "gb_guess": ("player",)}
"""The seats of the v1 envs (by env id, else taskset id) the tests run, where not the single `agent`; each seat runs on
the null harness and the subprocess runtime."""


def task(taskset: str, task_idx: int, *, env_id: str = "", index: int = 0) -> Task:
    """A gym_bridge task row naming v1 taskset `taskset` (and env `env_id`), task `task_idx`."""
    env = {"taskset": {"id": taskset}, **({"id": env_id} if env_id else {})}
    row = {"responses_create_params": {"input": "(the v1 task's own prompt)"}, "agent_ref": {"name": "verifiers"},
           "verifiers": {"env": env, "task_idx": task_idx}}
    return parse_task(row, index=index)


async def gym_bridge_rollout(template: ChatTemplate, script: list[Generation], row: Task,
                             env_class: type[VerifiersEnvironment] = VerifiersEnvironment) -> dict[str, Any]:
    """`row` through the real engine and capture path, the policy answering with `script`: its record."""
    engine = Engine(ScriptedPolicy({"": list(script)}), template,
                    EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(), template_check="off"))
    return (await engine.rollout(row, env_class=env_class)).to_dict()


async def own_runner(template: ChatTemplate, script: list[Generation], taskset: str, tasks: range, folder: Path, *,
                     env_id: str = "", repeats: int = 1) -> list[dict[str, Any]]:
    """The episodes verifiers' own `vf-eval` records for `tasks` of `taskset` (`repeats` each, in task order), played one
    at a time, its model answering with `script` in that order."""
    session = CaptureSession(policy=ScriptedPolicy({"": list(script)}), template=template,
                             ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=64),
                             limits=Limits(), model_name=MODEL, label="vf-eval"))
    async with capture_server().session(session) as url:
        folder.mkdir(parents=True, exist_ok=True)
        config = folder / "eval.toml"
        head, _, seat_block = EVAL_TOML.partition("[env.{seat}.harness]")
        text = head + "".join(("[env.{seat}.harness]" + seat_block).replace("{seat}", seat) for seat in SEATS.get(env_id or taskset, ("agent",)))
        config.write_text(text.format(model=MODEL, out=folder / "out", url=url, idx=tasks.start, end=tasks.stop, taskset=taskset, env_id=env_id,
                                     repeats=repeats))
        variables = {**os.environ, "OPENAI_API_KEY": session.ledger.token, "PYTHONPATH": str(HERE / "v1_tasksets"),
                     "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ['PATH']}", "UV_NATIVE_TLS": "1"}
        process = await asyncio.create_subprocess_exec(str(VENV / "bin" / "vf-eval"), "@", str(config), env=variables, cwd=folder,
                                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode == 0, (stdout.decode()[-2000:], stderr.decode()[-2000:])
    (traces,) = list((folder / "out").rglob("traces.jsonl"))
    episodes = [json.loads(line) for line in traces.read_text().splitlines()]
    return sorted(episodes, key=lambda episode: int(episode["task"]["data"]["idx"]))


def episode_reward(episode: dict[str, Any]) -> float:
    """The reward verifiers' own record gives the trainable trace: the sum of its rewards' score times weight."""
    (trace,) = [trace for trace in episode["traces"] if trace["agent"]["trainable"]]
    return sum(r["score"] * r["weight"] for r in trace["rewards"].values() if r is not None)
