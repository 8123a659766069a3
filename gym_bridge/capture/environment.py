"""The `harness` environment kind: an existing agent program is the rollout.

A `HarnessEnvironment` names an agent (a command line, or an async callable `agent(client, task)`);
its loop, `HarnessLoop`, opens a capture session for the rollout, runs the agent against it with
limits, assembles the captured calls into token segments and leaves them on the trajectory: the
flat `tokens` view is the last segment, and when the harness rewrote its history every segment
is kept under `tokens.segments`. The environment's `score(task, answer)` grades the agent's final
answer (what a callable returned, else the content of its last model answer); `verify` adds the
capture's metrics (calls, segments, rewrites, endpoint errors, output tails). A command gets a
minimal environment (`harness_environment`) and only the row fields `harness_row_fields` names (the
verifier's stay out of the agent's reach); a row names its own command only where `allow_row_commands` or the run's `TrustSettings` say.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from gym_bridge.capture.assembly import assemble
from gym_bridge.capture.harness import (DEFAULT_CPU_LIMIT_S, DEFAULT_MEMORY_LIMIT_MB, AgentCallable, AgentOutcome, HarnessLimits,
                                        run_callable, run_command)
from gym_bridge.capture.server import capture_server
from gym_bridge.capture.chat_session import ChatCaptureSession
from gym_bridge.capture.ledger import SessionLedger, StopKind
from gym_bridge.capture.session import CaptureSession, SessionState
from gym_bridge.core.agent_loop import RolloutContext
from gym_bridge.core.errors import FailRollout, ConfigError
from gym_bridge.core.record import LoopFinish
from gym_bridge.core.bounded.deadline import HeldPolicy
from gym_bridge.core.environment import Environment, RowProblem, VerifyResult, to_verify_result
from gym_bridge.core.journal import ResumeKind
from gym_bridge.core.items import Item
from gym_bridge.core.policy import Policy, by_policy_kind
from gym_bridge.core.trust import TrustSettings
from gym_bridge.core.task import ROUTING_KEYS, Task
from gym_bridge.core.dialects.chat import to_chat_tool

REASON_TAIL_CHARS = 800
"""Characters of stdout and stderr quoted in a failure reason."""
DEFAULT_HARNESS_ROW_FIELDS = ("responses_create_params", "messages", "prompt", *ROUTING_KEYS)
"""The row fields a harness gets by default: its input (and tools) and its routing, not the verifier's fields
(`expected_answer`, `ground_truth`, ...), which an agent the model drives (a shell tool) could read and copy."""


class HarnessLoop:
    """Runs the environment's agent against a capture session; returns `answer`, `length` (its last call hit
    its token limit), `max_turns` or `budget`.

    Raises FailRollout: `timeout` (wall limit), `context_overflow`, `infra` (backend), `env`
    (the agent could not start, crashed, or called no model).
    """

    async def run(self, ctx: RolloutContext) -> LoopFinish:
        env = ctx.env
        if not isinstance(env, HarnessEnvironment):
            raise FailRollout("env", f"HarnessLoop needs a HarnessEnvironment, got {type(env).__name__}")
        session = _session(ctx, type(env).model_name, type(env).max_parallel_calls)
        payload = {"messages": list(ctx.task.messages), "tools": [to_chat_tool(schema) for schema in ctx.tools],
                   "model": session.ledger.model_name, "row": type(env).harness_row(ctx.task.row)}
        try:
            async with capture_server().session(session) as base_url:
                outcome = await self._run_agent(env, ctx.task, session.ledger, base_url, payload, ctx.trust)
        finally:
            _fill_trajectory(ctx, session.ledger)
        env.session, env.outcome = session, outcome
        return _finish(env, session.ledger, outcome)

    async def _run_agent(self, env: HarnessEnvironment, task: Task, ledger: SessionLedger, base_url: str,
                         payload: dict[str, Any], trust: TrustSettings) -> AgentOutcome:
        env_class = type(env)
        agent = env_class.agent
        if agent is not None:
            import openai

            client = openai.AsyncOpenAI(base_url=base_url, api_key=ledger.token, max_retries=0, timeout=env_class.harness_timeout_s)
            try:
                return await run_callable(agent, client, payload, timeout_s=env_class.harness_timeout_s,
                                          stop=ledger.stopped, tail_chars=env_class.tail_chars)
            finally:
                await client.close()
        refused = env_class.trust_problems(task.row, trust)  # rows are checked before a run; this holds for rows that were not
        if refused:
            raise FailRollout("env", f"{refused[0].field}: {refused[0].message}")
        argv = env.harness_command(task)
        text = json.dumps(payload)
        with tempfile.TemporaryDirectory(prefix="gym_bridge_harness_") as folder:
            task_file = Path(folder) / "task.json"
            task_file.write_text(text)
            variables = harness_environment(env_class.harness_env_vars, {
                "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": ledger.token, "OPENAI_MODEL": ledger.model_name,
                "GYM_BRIDGE_TASK_FILE": str(task_file)})
            try:
                return await run_command(argv, env=variables, stdin=text.encode(), timeout_s=env_class.harness_timeout_s,
                                         stop=ledger.stopped, tail_chars=env_class.tail_chars, limits=env_class.harness_limits())
            except OSError as error:
                raise FailRollout("env", f"cannot start the harness {list(argv)}: {error}") from None


def _session(ctx: RolloutContext, model_name: str, max_parallel_calls: int) -> CaptureSession | ChatCaptureSession:
    """A token session in front of a token policy; a chat session in front of a chat policy (it must return token ids)."""
    ledger = SessionLedger(sampling=ctx.sampling, limits=ctx.limits, model_name=model_name, label=ctx.session_id,
                           max_parallel_calls=max_parallel_calls)

    def tokens(policy: Policy) -> CaptureSession:
        if ctx.template is None:
            raise FailRollout("infra", "a harness environment over a token policy needs the run's chat template")
        if ctx.deadline is not None and ctx.deadline.parked:  # time a trainer parks a call is not the rollout's
            policy = HeldPolicy(policy, ctx.deadline)
        return CaptureSession(policy=policy, template=ctx.template, ledger=ledger)

    return by_policy_kind(ctx.policy, token=tokens, chat=lambda policy: ChatCaptureSession(policy=policy, ledger=ledger))


def _fill_trajectory(ctx: RolloutContext, ledger: SessionLedger) -> None:
    """The captured calls as the trajectory: items, the last segment as the flat view, every segment when there are several."""
    trajectory = ctx.trajectory
    trajectory.output = list(ledger.output)
    trajectory.model_calls = len(ledger.calls)
    trajectory.tool_calls = sum(1 for item in ledger.output if item["type"] == "function_call")
    assembly = assemble(ledger.calls)
    last = assembly.last
    if last is None:
        return
    trajectory.prompt_ids, trajectory.completion_ids = list(last.prompt_ids), list(last.completion_ids)
    trajectory.completion_mask, trajectory.completion_logprobs = list(last.completion_mask), list(last.completion_logprobs)
    trajectory.segments = list(assembly.segments) if len(assembly.segments) > 1 else []


_SCORED_STOPS: dict[StopKind, LoopFinish] = {"max_turns": "max_turns", "budget": "budget"}
"""The session stops that end the rollout as a scored one (the others are failures)."""


def _finish(env: HarnessEnvironment, ledger: SessionLedger, outcome: AgentOutcome) -> LoopFinish:
    stop = ledger.stop
    if stop is not None and stop.kind in ("context_overflow", "infra"):
        raise FailRollout(stop.kind, stop.reason)
    limit = type(env).harness_timeout_s
    if outcome.timed_out:
        raise FailRollout("timeout", f"the harness did not finish within {limit:g} s{_tails(outcome)}")
    if stop is not None:
        return _SCORED_STOPS[stop.kind]  # a spent budget is scored, like the default loop's `max_turns` / `budget`
    if outcome.exit_code != 0:
        errors = "".join(f"; the endpoint answered {e.status}: {e.message}" for e in ledger.errors[-3:])
        raise FailRollout("env", f"{_limit_reason(env, outcome)}the harness exited with status {outcome.exit_code}{errors}{_tails(outcome)}")
    if not ledger.calls:
        raise FailRollout("env", f"the harness finished without calling the model{_tails(outcome)}")
    return "length" if ledger.last_finish_reason == "length" else "answer"


def _limit_reason(env: HarnessEnvironment, outcome: AgentOutcome) -> str:
    """What a failure reason says first when the harness hit a resource limit ('' when it did not)."""
    env_class = type(env)
    if outcome.limit == "cpu":
        return f"the harness hit its CPU limit of {env_class.harness_cpu_limit_s} s per process (RLIMIT_CPU, harness_cpu_limit_s); "
    if outcome.limit == "memory":
        return (f"the harness ran out of memory under its limit of {env_class.harness_memory_limit_mb} MiB per process "
                f"(RLIMIT_DATA, harness_memory_limit_mb); ")
    return ""


def _tails(outcome: AgentOutcome) -> str:
    parts = [f"; {name} ends with: {text[-REASON_TAIL_CHARS:]!r}" for name, text in
             (("stdout", outcome.stdout_tail), ("stderr", outcome.stderr_tail)) if text.strip()]
    return "".join(parts)


BASE_ENV_VARS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM")
"""The trainer's variables every harness command gets (when set); others only by `harness_env_vars`."""


def harness_environment(passed: Iterable[str], session: Mapping[str, str]) -> dict[str, str]:
    """A command's whole environment: `BASE_ENV_VARS` and the `passed` names taken from this process's
    (when set), then the session's own variables. Nothing else of the trainer's (API keys, tokens)."""
    names = (*BASE_ENV_VARS, *([passed] if isinstance(passed, str) else passed))
    return {**{name: os.environ[name] for name in names if name in os.environ}, **session}


def row_command(row: Mapping[str, Any]) -> Any:
    """The command a row names for its harness (`harness.command`), or None."""
    spec = row.get("harness")
    return spec.get("command") if isinstance(spec, dict) else None


class HarnessEnvironment(Environment):
    """An environment whose rollouts are runs of an agent program; subclasses set `command` or
    `agent` and implement `score`. A row may give its own command as `harness: {"command": [...]}`
    only where `allow_row_commands` lets it (the command runs with your permissions)."""

    command: ClassVar[tuple[str, ...]] = ()
    """The agent's command line (run under a reaper that kills whatever it leaves behind)."""
    allow_row_commands: ClassVar[bool] = False
    """Let a row's `harness.command` replace `command`. Off: such a row is refused before any rollout (a data
    file naming commands carries code). Never allowed with limited module paths, nor behind `/run`."""
    harness_env_vars: ClassVar[tuple[str, ...]] = ()
    """Names of the trainer's environment variables a command also gets, beside `BASE_ENV_VARS` and its
    session's (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`, `GYM_BRIDGE_TASK_FILE`)."""
    harness_row_fields: ClassVar[tuple[str, ...] | None] = DEFAULT_HARNESS_ROW_FIELDS
    """The fields of its row a harness gets (the task's `row`); the verifier's stay with `score`. Add the fields
    an agent needs (`("responses_create_params", "my_field")`); None gives it the whole row."""
    agent: ClassVar[AgentCallable | None] = None
    """Or an async callable `agent(client, task)`; it wins over `command`."""
    harness_timeout_s: ClassVar[float] = 300.0
    """Wall limit of one agent run; the engine's rollout deadline also applies."""
    harness_memory_limit_mb: ClassVar[int | None] = DEFAULT_MEMORY_LIMIT_MB
    """Data size (RLIMIT_DATA: heap and private writable mappings) of each process of a command, MiB; past it
    allocations fail. None: no limit. Not for `agent` callables, which run in the trainer's process."""
    harness_cpu_limit_s: ClassVar[int | None] = DEFAULT_CPU_LIMIT_S
    """CPU seconds (RLIMIT_CPU) of each process of a command: SIGXCPU then, SIGKILL a second later. None: no limit."""
    tail_chars: ClassVar[int] = 4000
    """Characters of stdout and stderr kept."""
    model_name: ClassVar[str] = "gym-bridge-policy"
    """The model name the endpoint serves (given to commands as `OPENAI_MODEL`); other names get a 404."""
    max_parallel_calls: ClassVar[int] = 1
    """Model calls of one rollout generating at once; the harness's other calls wait their turn. One
    keeps the engine's concurrency bound (one generation per rollout in flight); raise it for an
    agent that fans out sub-agents (it then puts up to this many generations per rollout on the policy)."""
    agent_loop: ClassVar[HarnessLoop] = HarnessLoop()
    settings: ClassVar[tuple[str, ...]] = ("harness_timeout_s", "tail_chars", "max_parallel_calls", "allow_row_commands", "harness_env_vars",
                                           "harness_memory_limit_mb", "harness_cpu_limit_s", "harness_row_fields")
    tools_from_row = True  # the agent runs its own tools; a row's tool schemas are passed to it as they are
    resume: ClassVar[ResumeKind] = "restart"
    """An agent program's run cannot be picked up mid-way (its own loop and tools live in its process): a rollout in
    flight when a run is killed starts again from turn 0."""

    session: SessionState | None = None
    outcome: AgentOutcome | None = None

    def harness_command(self, task: Task) -> tuple[str, ...]:
        """The command line for `task`: the row's `harness.command` when it names one (whether it may run is
        `trust_problems`, which `HarnessLoop` checks first), else the class's `command`.

        Raises FailRollout (`env`) for a malformed command.
        """
        command = row_command(task.row)
        if command is None:
            command = self.command
        if isinstance(command, str) or not command or not all(isinstance(part, str) for part in command):
            raise FailRollout("env", f"{type(self).__name__} needs `command` (a list of strings) or `agent`; got {command!r}")
        return tuple(command)

    @classmethod
    def row_command_refusal(cls, trust: TrustSettings) -> str | None:
        """Why rows may not name their own command here under `trust`, saying what would allow it; None when they may."""
        if trust.module_paths_limited:
            return ("rows may not name their own command while module paths are limited (--no-module-paths, "
                    "--allow-module: the settings for shared data); set the command on the environment class")
        if trust.row_commands or cls.allow_row_commands:
            return None
        return (f"rows may not name their own command: it runs with your permissions, so a data file that does "
                f"carries code; only for data you trust: set `allow_row_commands = True` on {cls.__name__} "
                f"(--env-setting {cls.name}.allow_row_commands=true), or pass `gym-bridge eval --allow-row-commands`")

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        """The row's own problems, and a malformed `harness` or `harness.command` (whether it may run: `trust_problems`)."""
        problems = super().validate_row(row)
        spec = row.get("harness")
        if spec is not None and not isinstance(spec, dict):
            return [*problems, RowProblem("harness", f"must be an object such as {{\"command\": [...]}}, got {type(spec).__name__}")]
        command = row_command(row)
        if command is None:
            return problems
        if isinstance(command, str) or not isinstance(command, list) or not command or not all(isinstance(part, str) for part in command):
            problems.append(RowProblem("harness.command", f"must be a non-empty list of strings, got {command!r}"))
        return problems

    @classmethod
    def trust_problems(cls, row: dict[str, Any], trust: TrustSettings) -> list[RowProblem]:
        """A row's own `harness.command` where neither the class nor the run's `trust` allows one (`row_command_refusal`)."""
        refusal = cls.row_command_refusal(trust) if row_command(row) is not None else None
        return [] if refusal is None else [RowProblem("harness.command", refusal)]

    @classmethod
    def harness_row(cls, row: Mapping[str, Any]) -> dict[str, Any]:
        """The part of `row` its harness gets: the fields `harness_row_fields` names (all of them when None)."""
        fields = cls.harness_row_fields
        return dict(row) if fields is None else {name: row[name] for name in fields if name in row}

    @classmethod
    def harness_limits(cls) -> HarnessLimits:
        """The resource limits of this environment's commands."""
        return HarnessLimits(memory_mb=cls.harness_memory_limit_mb, cpu_s=cls.harness_cpu_limit_s)

    @classmethod
    def check_ready(cls) -> None:
        """Refuse malformed `allow_row_commands` / `harness_env_vars` / limit settings before any rollout."""
        super().check_ready()
        if not isinstance(cls.allow_row_commands, bool):
            raise ConfigError(f"{cls.name}.allow_row_commands must be true or false, got {cls.allow_row_commands!r}")
        names = cls.harness_env_vars
        if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(
                isinstance(name, str) and name and "=" not in name for name in names):
            raise ConfigError(f"{cls.name}.harness_env_vars must be a list of variable names, e.g. [\"MY_TOKEN\"], got {names!r}")
        fields = cls.harness_row_fields
        if fields is not None and (isinstance(fields, str) or not isinstance(fields, (list, tuple)) or not all(
                isinstance(name, str) and name for name in fields)):
            raise ConfigError(f"{cls.name}.harness_row_fields must be a list of row field names, e.g. "
                              f"[\"responses_create_params\", \"my_field\"], or null for the whole row, got {fields!r}")
        for key, unit in (("harness_memory_limit_mb", "MiB"), ("harness_cpu_limit_s", "seconds")):
            value = getattr(cls, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{cls.name}.{key} must be a whole number of {unit} (at least 1) or null for no limit, got {value!r}")

    @property
    def final_answer(self) -> str:
        """What a callable agent returned, else the content of the last model answer ('' when none)."""
        if self.outcome is not None and self.outcome.answer is not None:
            return self.outcome.answer
        return (self.session.ledger.final_answer if self.session is not None else None) or ""

    def score(self, task: Task, answer: str) -> VerifyResult | float:
        """The reward of `answer` for `task`; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement score(task, answer)")

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        result = to_verify_result(self.score(task, self.final_answer))
        return replace(result, metrics={**result.metrics, **self.capture_metrics()})

    def capture_metrics(self) -> dict[str, Any]:
        """Calls, segments, rewrites, token-in calls, endpoint errors (the first and latest kept, the others counted:
        see `gym_bridge.capture.ledger.MAX_KEPT_ERRORS`) and the output tails of this rollout."""
        if self.session is None:
            return {}
        ledger, outcome = self.session.ledger, self.outcome
        assembly = assemble(ledger.calls)
        metrics: dict[str, Any] = {"model_calls": len(ledger.calls), "segments": len(assembly.segments),
                                   "rewrites": assembly.rewrites, "token_in_calls": ledger.token_in_calls,
                                   "endpoint_errors": [f"{e.status}: {e.message}" for e in ledger.errors],
                                   "endpoint_errors_dropped": ledger.errors_dropped}
        if outcome is not None:
            metrics.update(harness_exit_code=outcome.exit_code, stdout_tail=outcome.stdout_tail, stderr_tail=outcome.stderr_tail)
        return metrics
