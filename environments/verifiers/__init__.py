"""verifiers: a verifiers v1 environment (`Env` over a `Taskset`, played by a `Harness`) as a gym_bridge rollout.

verifiers pins openai<3 and mcp==2.0.0, so its side runs in its own virtualenv (`make verifiers-venv` makes
`.venv-verifiers`): `worker.py` loads the v1 env a row names, points its model client at the rollout's capture
endpoint (so every token is gym_bridge's) and runs one episode; the reward is the episode's own scoring (the
trainable trace's `trace.rewards`), read back from the worker's last stdout line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from gym_bridge import FailRollout, HarnessEnvironment, MissingExtraError, RowProblem, Task, VerifyResult

HERE = Path(__file__).parent
WORKER = HERE / "worker.py"
VENV = HERE.parent.parent / ".venv-verifiers"
"""The verifiers virtualenv `make verifiers-venv` creates at the repository root (the `venv_dir` setting's default)."""


def install_hint(venv: Path) -> str:
    return (f"the verifiers environment needs verifiers 0.4.0 in its own virtualenv {venv}: run `make verifiers-venv` "
            f"(or point --env-setting verifiers.venv_dir=PATH at one with verifiers==0.4.0 and uv)")
RESULT_MARKER = "GYM_BRIDGE_VERIFIERS_RESULT"
"""Starts the worker's result line (worker.py's constant of the same name)."""


def venv_python(venv: Path | None = None) -> Path:
    return (VENV if venv is None else venv) / "bin" / "python"


def worker_result(stdout: str) -> dict[str, Any] | None:
    """The worker's result (its last `RESULT_MARKER` line), or None when it printed none."""
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARKER + " ")]
    return json.loads(lines[-1][len(RESULT_MARKER) + 1:]) if lines else None


def episode_result(result: dict[str, Any]) -> VerifyResult:
    """gym_bridge's verify result from a v1 episode: the reward of its trainable trace (a user simulator's is
    not), with each named v1 reward (score times weight) as a component; masked from training when more than one
    seat called the model. Raises FailRollout when the episode failed (v1's `episode.ok` is false): `timeout` when
    one of verifiers' own deadlines passed, else `env` (a hook or the harness raised)."""
    if not result["ok"]:
        errors = [*result["errors"], *(error for trace in result["traces"] for error in trace["errors"])]
        timed_out = result["is_timeout"] or any(trace["is_timeout"] for trace in result["traces"])
        raise FailRollout("timeout" if timed_out else "env",
                          f"the verifiers episode {result['env_id']} failed: {'; '.join(errors[-3:]) or 'no error recorded'}")
    trained = [trace for trace in result["traces"] if trace["trainable"]]
    if len(trained) != 1:
        raise FailRollout("env", f"the verifiers episode {result['env_id']} has {len(trained)} trainable traces; gym_bridge trains one")
    trace = trained[0]
    components = {name: r["score"] * r["weight"] for name, r in trace["rewards"].items() if r is not None}
    seats = sum(1 for other in result["traces"] if other["turns"])
    metrics = {"verifiers_env": result["env_id"], "verifiers_task": result["task_name"], "verifiers_turns": trace["turns"],
               "verifiers_seats_calling_the_model": seats, **{f"verifiers_metric_{name}": value for name, value in trace["metrics"].items()}}
    # Several seats (user-sim's simulated user) share the rollout's capture session, whose calls interleave: the segment
    # gym_bridge would train may be another seat's, so such an episode is scored but kept out of the loss.
    return VerifyResult(reward=float(trace["reward"]), reward_components=components, metrics=metrics, mask_sample=seats > 1)


def describe(python: Path) -> str:
    """The environment's one-line description, with the install command when `python` (the venv's) is missing."""
    text = "A verifiers v1 environment (load_environment / Env, its harness) run against the capture endpoint, scored by its own rewards"
    return text if python.exists() else f"{text} (not installed: {install_hint(python.parent.parent)})"


def pinned_harnesses(env: dict[str, Any]) -> list[tuple[str, Any]]:
    """(seat, harness id) for every seat of a row's EnvConfig data that pins a harness."""
    return [(seat, value["harness"].get("id") if isinstance(value["harness"], dict) else value["harness"])
            for seat, value in env.items() if isinstance(value, dict) and "harness" in value]


class VerifiersEnvironment(HarnessEnvironment):
    name = "verifiers"
    description = describe(venv_python())
    example_data = HERE / "data" / "example.jsonl"
    venv_dir: ClassVar[str | None] = None
    """The virtualenv with verifiers 0.4.0 and uv (None: the repository's `.venv-verifiers`)."""
    harness_timeout_s = 300.0
    tail_chars = 16000  # the worker's result line is the last of its stdout
    resume = "restart"  # the v1 episode's own loop cannot be picked up mid-run (HarnessEnvironment's kind)
    allowed_harnesses: ClassVar[tuple[str, ...]] = ("null",)
    """v1 harness ids a row may pin. The seats run on the local `subprocess` runtime, and harnesses such as `bash`
    give the model a shell on this machine: allow them only for data you trust."""
    settings = (*HarnessEnvironment.settings, "allowed_harnesses", "venv_dir")
    harness_row_fields = (*(HarnessEnvironment.harness_row_fields or ()), "verifiers")
    """The worker reads the row's `verifiers` spec (the v1 env and task index) beside the default fields; verifier
    fields of the row stay out of the harness's reach."""

    @classmethod
    def venv(cls) -> Path:
        return VENV if cls.venv_dir is None else Path(cls.venv_dir)

    @classmethod
    def check_ready(cls) -> None:
        super().check_ready()
        if not venv_python(cls.venv()).exists():
            raise MissingExtraError(install_hint(cls.venv()))

    def harness_command(self, task: Task) -> tuple[str, ...]:
        """The worker, run by the virtualenv's python (rows may not name their own command)."""
        return (str(venv_python(type(self).venv())), str(WORKER))

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        problems = super().validate_row(row)
        spec = row.get("verifiers")
        if not isinstance(spec, dict) or not isinstance(spec.get("env"), dict):
            return [*problems, RowProblem("verifiers", "must be an object {\"env\": {verifiers EnvConfig data}, \"task_idx\": N}")]
        taskset = spec["env"].get("taskset")
        if not isinstance(taskset, dict) or not taskset.get("id"):
            problems.append(RowProblem("verifiers.env.taskset.id", "names the v1 taskset, e.g. \"gb_arithmetic\""))
        for seat, harness in pinned_harnesses(spec["env"]):
            if harness not in cls.allowed_harnesses:
                problems.append(RowProblem(f"verifiers.env.{seat}.harness", (
                    f"harness {harness!r} is not allowed (allowed: {list(cls.allowed_harnesses)}); it runs on this machine: "
                    f"--env-setting {cls.name}.allowed_harnesses='[\"null\", \"{harness}\"]' for data you trust")))
        index = spec.get("task_idx", 0)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            problems.append(RowProblem("verifiers.task_idx", f"must be a task's position in the taskset (0 or more), got {index!r}"))
        return problems

    def score(self, task: Task, answer: str) -> VerifyResult:
        outcome = self.outcome
        result = worker_result(outcome.stdout_tail if outcome is not None else "")
        if result is None:
            raise FailRollout("env", "the verifiers worker printed no result")
        return episode_result(result)


__all__ = ["VerifiersEnvironment", "describe", "episode_result", "worker_result"]
