"""The rollout engine: many rollouts at once, each bounded, each ending as a record.

asyncio throughout. A global semaphore and per-environment semaphores bound concurrency; each
rollout has a deadline (verify included; not the calls of a policy the trainer may park, which have their own
bound: `gym_bridge.core.bounded.deadline`), each tool call and verify a timeout. `Engine.rollout` is the one error
boundary: whatever fails there becomes a record with a failure kind (`gym_bridge.core.errors.classify`
decides which), masked from training, and its siblings go on. Repeats of a task form a group and `run_groups` keeps them together;
`stream` yields records as they finish. An engine made with a journal (`open_journal`) commits the turns of each rollout
given a key there, through the resume wrappers of `gym_bridge.core.resume`.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import time
import warnings
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

from gym_bridge.core.agent_loop import AgentLoop, Limits, RolloutContext, ToolCallingLoop
from gym_bridge.core.bounded.deadline import RolloutDeadline, parks_calls
from gym_bridge.core.environment import Environment, VerifyResult
from gym_bridge.core.errors import FailRollout, classify
from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal
from gym_bridge.core.policy import ChatPolicy, Policy, SamplingParams, is_token_policy
from gym_bridge.core.record import RolloutFinish, RolloutRecord
from gym_bridge.core.registry import TaskSet, resolve_tasks
from gym_bridge.core.resume import resume_rollout
from gym_bridge.core.session import PLAIN, EnvironmentSession, RolloutSeams, Session
from gym_bridge.core.task import Task
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.check import TemplateCheck, check_append_only, template_report
from gym_bridge.core.trajectory import TokenView, Trajectory
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings
from gym_bridge.core.transcript import Transcript, transcript_starter


_TOOL_CALLING = ToolCallingLoop()
"""The loop of an environment that names none (it keeps no state: one serves every rollout)."""
_NO_BOUND: AbstractAsyncContextManager[object] = nullcontext()
"""The per-environment bound of an engine without one (one shared no-op)."""


@dataclass(frozen=True)
class EngineConfig:
    """Settings of a run; every bound has a finite default."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    limits: Limits = field(default_factory=Limits)
    max_concurrency: int = 64
    per_env_concurrency: int | None = None
    """Rollouts of one environment at once (None: only the global bound)."""
    deadline_s: float = 600.0
    """Wall time of one rollout (setup, generation, tools, verify), after it starts running; `close` runs after it.
    The calls of a policy that the trainer may park (`parks_calls = True`) are not counted: see `generation_timeout_s`."""
    generation_timeout_s: float = 3600.0
    """Bound of one model call of a policy whose calls the trainer may park mid-generation for a train step and
    a weight update (`parks_calls = True`: verl's agent loop, async workers). Such a call's time, parked time
    included, does not count against `deadline_s`; this bounds it instead. Unused for other policies."""
    model_name: str = ""
    template_check: TemplateCheck = "error"
    """`error`: refuse a template that is not append-only; `warn`: warn and use the streamed
    rendering; `off`: skip the check (a template already checked elsewhere)."""
    tool_parser: str | None = None
    """Tool-call parser by vLLM's name (`hermes`, `llama3_json`, `mistral`, ...); None: picked from the template."""
    reasoning_parser: str | None = None
    """Reasoning parser (`qwen3`, `deepseek_r1`, `openai_gptoss`, `none`); None: picked from the template."""
    chat_template_kwargs: Mapping[str, Any] | None = None
    """Extra arguments for every render of the chat template (e.g. `{"enable_thinking": False}`); None: the template's own."""


class Engine:
    """Runs rollouts of tasks against one policy and chat template.

    A `ChatPolicy` (hosted chat APIs, evaluation only) needs no template: its rollouts keep the
    conversation as messages and their records carry no tokens. `journal` (`gym_bridge.core.journal.open_journal`):
    where rollouts run with a key commit their turns, so a killed run resumes them mid-episode; None: nothing is
    journaled. `trust`: what the run's data may run (module paths its rows name, a harness row's own command).
    """

    def __init__(self, policy: Policy | ChatPolicy, template: ChatTemplate | None, config: EngineConfig | None = None,
                 journal: RunJournal | None = None, *, trust: TrustSettings = DEFAULT_TRUST) -> None:
        self.policy = policy
        self.trust = trust
        self.template = template
        self.config = config or EngineConfig()
        if template is not None and is_token_policy(policy):
            if self.config.tool_parser or self.config.reasoning_parser or self.config.chat_template_kwargs is not None:
                template = self.template = template.with_options(
                    tool_parser=self.config.tool_parser, reasoning_parser=self.config.reasoning_parser,
                    chat_template_kwargs=self.config.chat_template_kwargs)
            self._check_template(template)
        transcript_starter(policy, template)  # raises TypeError / ValueError for a policy and template that cannot run
        self._global: asyncio.Semaphore | None = None
        self._per_env: dict[str, asyncio.Semaphore] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tools_by_class: dict[type[Environment], tuple[dict[str, Any], ...]] = {}
        self._journal = journal

    @property
    def journal(self) -> RunJournal | None:
        """Where rollouts given a key commit their turns (None: nothing is journaled)."""
        return self._journal

    def with_journal(self, journal: RunJournal | None) -> Engine:
        """An engine of the same policy, template and settings that commits to `journal` (None: to none), sharing this
        one's concurrency bounds; the template is not checked again."""
        engine = copy.copy(self)
        engine._journal = journal
        return engine

    def journal_fingerprint(self, tasks: TaskSet, *, repeats: int) -> RunFingerprint:
        """What a journal of a run of `repeats` rollouts of each of `tasks` depends on (`RunFingerprint.of_engine`)."""
        return RunFingerprint.of_engine(self.config, tasks.tasks, repeats=repeats, env_classes=tasks.env_classes.values())

    def replica_stats(self) -> dict[str, Any]:
        """Per-replica calls, errors and load where the policy routes over model servers (its `router`); else {}."""
        router = getattr(self.policy, "router", None)
        return dict(router.stats()) if router is not None else {}

    def _check_template(self, template: ChatTemplate) -> None:
        template.profile  # picks parsers and turn style once; raises TemplateError for an unusable template
        if self.config.template_check == "error":
            check_append_only(template)
        elif self.config.template_check == "warn":
            report = template_report(template)
            if not report.append_only:
                warnings.warn(f"{report.message()} (continuing with the streamed rendering: template_check='warn')", stacklevel=3)
        elif self.config.template_check != "off":
            raise ValueError(f"template_check must be 'error', 'warn' or 'off', got {self.config.template_check!r}")

    def _semaphores(self, env_name: str) -> tuple[asyncio.Semaphore, AbstractAsyncContextManager[object]]:
        """The global bound and the bound of `env_name`'s rollouts (`_NO_BOUND` without `per_env_concurrency`)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._per_env = loop, {}
            self._global = asyncio.Semaphore(self.config.max_concurrency)
        per_env: AbstractAsyncContextManager[object] = _NO_BOUND
        if self.config.per_env_concurrency:
            per_env = self._per_env.setdefault(env_name, asyncio.Semaphore(self.config.per_env_concurrency))
        assert self._global is not None
        return self._global, per_env

    async def rollout(self, task: Task, repeat_index: int = 0, *, env_class: type[Environment] | None = None,
                      sampling: SamplingParams | None = None, key: RolloutKey | None = None) -> RolloutRecord:
        """Run one rollout of `task` to a record, sampled with `sampling` (None: the config's). `key`: the rollout's
        identity in the engine's journal (`RolloutKey.of_task(task.index, repeat_index)` for an eval run); None: not
        journaled. Never raises for a failed rollout."""
        sampling = sampling or self.config.sampling
        if env_class is None:
            env_class = resolve_tasks([task], self.trust)[task.env_name]
        global_slot, env_slot = self._semaphores(task.env_name)
        async with global_slot, env_slot:
            if self._journal is None or key is None:  # the fast path: nothing to journal
                return await self._attempt(task, repeat_index, env_class, sampling, PLAIN)
            return await resume_rollout(self._journal, key, env_class,
                                        partial(self._attempt, task, repeat_index, env_class, sampling))

    async def _attempt(self, task: Task, repeat_index: int, env_class: type[Environment], sampling: SamplingParams,
                       seams: RolloutSeams) -> RolloutRecord:
        """One attempt of a rollout, its policy and environment session wrapped by `seams`."""
        started = time.perf_counter()
        limits = self.config.limits
        tools = task.tools if task.tools is not None else self._env_tools(env_class)
        trajectory = Trajectory(prompt_ids=[])
        finish: RolloutFinish = "failed"
        failure: FailRollout | None = None
        verify_result: VerifyResult | None = None
        session: Session | None = None
        transcript: Transcript | None = None
        deadline = RolloutDeadline(deadline_s=self.config.deadline_s - seams.spent_s,
                                   generation_timeout_s=self.config.generation_timeout_s, parked=parks_calls(self.policy))
        try:
            session_id = f"{task.index}-{repeat_index}"
            transcript = transcript_starter(seams.wrap_policy(self.policy), self.template)(
                task=task, tools=tools, trajectory=trajectory, session_id=session_id, max_tokens=limits.max_completion_tokens)
            session = seams.wrap_session(EnvironmentSession(env_class, tools=tools, max_tool_output_chars=limits.max_tool_output_chars),
                                         trajectory)
            ctx = RolloutContext(
                task=task, env=session.env, policy=self.policy, template=self.template, sampling=sampling, limits=limits,
                trajectory=trajectory, session_id=session_id, tools=tools, transcript=transcript, session=session,
                deadline=deadline, trust=self.trust,
            )
            loop: AgentLoop = getattr(env_class, "agent_loop", None) or _TOOL_CALLING
            async with deadline.running():
                await session.setup(task)
                finish = await loop.run(ctx)
                verify_result = await session.verify(task, trajectory.output)
            if verify_result.failure_kind is not None:
                failure = FailRollout(verify_result.failure_kind, verify_result.failure_reason or "verifier reported a failure")
        except Exception as error:  # the one boundary: a bad rollout is data, not a crash
            failure = classify(error, timeout_s=self.config.deadline_s)
        finally:
            if session is not None:
                closed = await session.close()  # always: a failed rollout's session is closed too
                failure = failure or closed
        tokens = transcript.finish() if transcript is not None else trajectory.tokens()
        return self._record(task, repeat_index, env_class, trajectory, tokens, finish, failure, verify_result,
                            time.perf_counter() - started)

    def _env_tools(self, env_class: type[Environment]) -> tuple[dict[str, Any], ...]:
        """The schemas of `env_class`'s own tools (its `tool_specs`, derived once per class), as a tuple made once."""
        tools = self._tools_by_class.get(env_class)
        if tools is None:
            tools = self._tools_by_class[env_class] = tuple(spec.schema for spec in env_class.tool_specs().values())
        return tools

    def _record(self, task: Task, repeat_index: int, env_class: type[Environment], trajectory: Trajectory, tokens: TokenView, finish: RolloutFinish,
                failure: FailRollout | None, verify_result: VerifyResult | None, latency_s: float) -> RolloutRecord:
        components: dict[str, float]
        if failure is not None:
            reward, components, mask = 0.0, {}, True
            kind, reason, finish = failure.kind, failure.reason, "failed"
        else:
            assert verify_result is not None
            reward, mask = verify_result.reward, verify_result.mask_sample
            components = verify_result.reward_components or {"reward": verify_result.reward}
            kind, reason = None, None
        return RolloutRecord(
            task=task, repeat_index=repeat_index, env=env_class.name if env_class else task.env_name,
            output=trajectory.output, tokens=tokens, reward=reward, reward_components=components,
            mask_sample=mask, failure_kind=kind, failure_reason=reason, finish_reason=finish,
            turns=trajectory.model_calls, tool_calls=trajectory.tool_calls, latency_s=latency_s,
            model=self.config.model_name, verify_metrics=dict(verify_result.metrics) if verify_result else {},
            api_usage=dict(trajectory.api_usage) or None,
            parse_errors=trajectory.parse_errors, unparsed_tool_calls=trajectory.unparsed_tool_calls,
            env_path=f"{env_class.__module__}:{env_class.__qualname__}" if env_class else "",
            policy_versions=tuple(trajectory.policy_versions),
        )

    async def stream(
        self, tasks: Sequence[Task] | TaskSet, *, repeats: int = 1, skip: Iterable[tuple[int, int]] = ()
    ) -> AsyncIterator[RolloutRecord]:
        """Yield a record for each (task, repeat) not in `skip`, as each finishes.

        Routing and tool schemas are checked for all tasks before the first rollout starts (not
        again for a `TaskSet`: its run checked them).
        """
        ready = ready_tasks(tasks, self.trust)
        done = set(skip)
        pending = {
            asyncio.ensure_future(self.rollout(task, repeat, env_class=ready.env_classes[task.env_name],
                                               key=RolloutKey.of_task(task.index, repeat)))
            for task in ready.tasks for repeat in range(repeats) if (task.index, repeat) not in done
        }
        try:
            for next_done in asyncio.as_completed(pending):
                yield await next_done
        finally:
            for future in pending:
                future.cancel()

    async def run_groups(self, tasks: Sequence[Task] | TaskSet, *, group_size: int,
                         sampling: SamplingParams | None = None) -> list[list[RolloutRecord]]:
        """All `group_size` repeats of each task, grouped and in task order, sampled with `sampling` (None: the config's)."""
        ready = ready_tasks(tasks, self.trust)
        groups = [
            asyncio.gather(*(self.rollout(task, repeat, env_class=ready.env_classes[task.env_name], sampling=sampling,
                                          key=RolloutKey.of_task(task.index, repeat))
                             for repeat in range(group_size)))
            for task in ready.tasks
        ]
        return [list(group) for group in await asyncio.gather(*groups)]


def ready_tasks(tasks: Iterable[Task] | TaskSet, trust: TrustSettings = DEFAULT_TRUST) -> TaskSet:
    """`tasks` routed and checked (`resolve_tasks`, module paths only where `trust` allows them) with each environment
    ready (`ensure_ready`): what a run does once before its first rollout. A `TaskSet` is returned as it is: its run
    checked it."""
    if isinstance(tasks, TaskSet):
        return tasks
    checked = tuple(tasks)
    env_classes = resolve_tasks(checked, trust)
    ensure_ready(env_classes.values())
    return TaskSet(checked, env_classes)


def ensure_ready(env_classes: Iterable[type[Environment]]) -> None:
    """Let each environment refuse to run (a missing sandbox, a bad setting) before its rollouts start.

    `check_ready` is meant to be cheap (the code environment caches its sandbox probe), so adapters
    that start rollouts one at a time call this where they resolve a row's environment.
    """
    for env_class in set(env_classes):
        env_class.check_ready()


def freeze_startup_objects() -> None:
    """Collect garbage once, then exempt every object alive now (imported modules, the tokenizer, the
    model) from later garbage collections, which otherwise rescan them while rollouts allocate. Called
    by `gym-bridge eval` after loading and before the rollouts (`gc.unfreeze()` after them); not inside a
    trainer's process, whose collector is the trainer's business."""
    gc.collect()
    gc.freeze()
