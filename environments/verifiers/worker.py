"""Runs one verifiers v1 episode against gym_bridge's capture endpoint; run in `.venv-verifiers`, never imports gym_bridge.

It reads the gym_bridge task (`GYM_BRIDGE_TASK_FILE`, else stdin); the row's `verifiers` field names the v1
environment (`env`: verifiers' own `EnvConfig` data, e.g. `{"id": "user-sim", "taskset": {"id": "gb_arithmetic"}}`)
and the task (`task_idx`, its position in the taskset). Verifiers' loader builds the env, its harness talks to
`OPENAI_BASE_URL` (the capture session) through verifiers' interception, and the episode's rewards are printed
on the last stdout line as `RESULT_MARKER {json}`; verifiers' logs go to stderr. Exit 2: the row or env is bad.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

RESULT_MARKER = "GYM_BRIDGE_VERIFIERS_RESULT"
TASKSETS_DIR = Path(__file__).with_name("v1_tasksets")
LOCAL_RUNTIME = {"type": "subprocess"}
ERROR_CHARS = 600
"""Characters kept of each error verifiers recorded."""


def read_task() -> dict[str, Any]:
    path = os.environ.get("GYM_BRIDGE_TASK_FILE")
    return json.loads(Path(path).read_text() if path else sys.stdin.read())


def env_data(spec: dict[str, Any]) -> dict[str, Any]:
    """The row's EnvConfig data with every seat on the local `subprocess` runtime (verifiers defaults to a
    remote sandbox) and the `null` harness where the row pins none."""
    from verifiers.v1 import resolve_env_config
    from verifiers.v1.configs.agent import agent_config_fields

    data = dict(spec)
    seats = agent_config_fields(resolve_env_config(data))
    for name in seats:
        seat = dict(data.get(name) or {})
        seat.setdefault("runtime", LOCAL_RUNTIME)
        seat.setdefault("harness", {"id": "null"})
        data[name] = seat
    return data


def nth_task(taskset: Any, index: int) -> Any:
    task = next(itertools.islice(taskset, index, index + 1), None)
    if task is None:
        raise LookupError(f"the taskset has no task at index {index}")
    return task


def error_texts(errors: Any) -> list[str]:
    """verifiers' recorded errors as short lines (the result line must stay inside the stdout gym_bridge keeps)."""
    return [f"{error.type}: {error.message}"[:ERROR_CHARS] for error in errors]


def trace_result(trace: Any) -> dict[str, Any]:
    return {"agent": trace.agent.name, "trainable": trace.agent.trainable, "reward": trace.reward, "ok": trace.ok,
            "rewards": {name: (None if r is None else {"score": r.score, "weight": r.weight}) for name, r in trace.rewards.items()},
            "metrics": trace.metrics, "errors": error_texts(trace.errors), "turns": trace.num_turns,
            "stop_condition": trace.stop_condition, "is_timeout": trace.is_timeout}


async def run_episode(spec: dict[str, Any]) -> dict[str, Any]:
    import verifiers.v1 as vf

    config = vf.resolve_env_config(env_data(spec["env"]))
    env = vf.load_environment(config)
    task = nth_task(env.taskset, int(spec.get("task_idx", 0)))
    client = vf.EvalClientConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key_var="OPENAI_API_KEY")
    ctx = vf.ModelContext(model=os.environ["OPENAI_MODEL"], client=client)
    async with env.serving():
        episode = await env.run_episode(task, ctx)
    traces = [trace_result(trace) for trace in episode.traces]
    return {"env_id": config.env_id, "task_name": task.data.name, "ok": episode.ok, "is_timeout": episode.is_timeout,
            "errors": error_texts(episode.errors), "traces": traces}


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    sys.path.insert(0, str(TASKSETS_DIR))
    bin_dir = str(Path(sys.executable).parent)  # verifiers' harness programs need `uv`, installed beside this python
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ.setdefault("UV_NATIVE_TLS", "1")  # uv trusts the system's certificates, as pip does
    spec = read_task()["row"].get("verifiers")
    if not isinstance(spec, dict) or not isinstance(spec.get("env"), dict):
        print("the row needs `verifiers: {\"env\": {...verifiers EnvConfig...}, \"task_idx\": N}`", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run_episode(spec))
    except (ImportError, LookupError, ValueError, TypeError, AttributeError) as error:
        print(f"cannot load the verifiers environment {json.dumps(spec['env'])}: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(f"{RESULT_MARKER} {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the episode and everything it started are closed; tearing down verifiers' modules takes seconds
