"""`gym-bridge serve`: gym_bridge environments as NeMo Gym agent servers, the way NeMo RL uses them.

NeMo RL POSTs each row to `/run` of the server its `agent_ref.name` names; each `/run` is one core
rollout whose model calls go to NeMo RL's `/v1/chat/completions` as NeMo Gym's model servers make
them (`ChatAPIPolicy(token_ids=True)`). A malformed row answers 422 naming the field; a failed
rollout answers 200 with `mask_sample: true` (see `to_run_result` for what NeMo RL reads), its
failure kind in NeMo Gym's shared vocabulary (`nemo_gym_failure_kind`). After collecting, NeMo Gym
0.7.0's rollout collection POSTs the stripped results to `/aggregate_metrics` (`aggregate_metrics`).
A client that disconnects from `/run` cancels its rollout; with a journal (`journal_dir`; `serve` keeps one by
default), a row that names its rollout (`_ng_task_index`, `_ng_rollout_index`) and is sent again continues from its
last turn, unless the model behind the server changed (its fingerprint: `served_model_identity`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
import os
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gym_bridge.capture.environment import HarnessEnvironment, row_command
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.environment import Environment
from gym_bridge.core.errors import BackendAnswerError, ConfigError, DataError, MissingExtraError, UserError
from gym_bridge.core.items import TOKEN_FIELDS
from gym_bridge.core.journal import RunFingerprint, RunJournal, environment_settings
from gym_bridge.core.policy import ChatPolicy, ChatRequest, SamplingParams
from gym_bridge.core.turn import Turn
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import get_environment, resolve_tasks, routing_names
from gym_bridge.core.rollout_file import dump_line
from gym_bridge.core.task import MAX_ROW_DEPTH, Task, parse_task
from gym_bridge.policies.router import ReplicaRouter
from gym_bridge.serve.disconnect import ClientDisconnected, unless_disconnected

if TYPE_CHECKING:
    from gym_bridge.policies.chat_api import ChatAPIPolicy

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class AgentServerSettings:
    """What `gym-bridge serve` runs with."""

    envs: tuple[str, ...]
    """Environment names served; a row's `agent_ref.name` (or other routing key) must be one of them."""
    model_base_urls: tuple[str, ...] = ()
    """OpenAI-compatible base URLs (`http://host:port/v1`); each rollout stays on one."""
    model: str | None = None
    """The served model's name (None: the first entry of the first server's `/v1/models`)."""
    max_turns: int = 8
    max_new_tokens: int = 1024
    """Tokens per model call when the row has no `max_output_tokens`."""
    max_completion_tokens: int = 16384
    """Model and environment tokens after the prompt, over all turns of one rollout."""
    deadline_s: float = 600.0
    """Wall time of one rollout, verify included (the `/run` request's deadline)."""
    max_concurrency: int = 1024
    """Rollouts in flight at once; more `/run` requests wait for a slot."""
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    request_timeout_s: float = 600.0
    """Timeout of one model call (long generations are normal in training)."""
    max_retries: int = 2
    api_key: str | None = None
    journal_dir: str | None = None
    """Where rows that name their rollout (`_ng_task_index`, `_ng_rollout_index`) commit each finished turn, so a
    client that sends the same rollout again (after a disconnect or a server restart) continues it; None: no journal."""


class ModelServers:
    """The chat policy of `/run`: NeMo RL's chat endpoints with token ids, every call of one
    rollout on the same server (its prefix cache), new rollouts on the least busy one: the
    project's one routing rule, `gym_bridge.policies.router.ReplicaRouter`."""

    def __init__(self, settings: AgentServerSettings) -> None:
        if not settings.model_base_urls:
            raise ConfigError("give at least one model base URL (--model-base-url)")
        self.settings = settings
        self.model_name = settings.model
        """The served model's name (once asked from the server when not given)."""
        self._policies: list[ChatAPIPolicy] | None = None
        self.router: ReplicaRouter | None = None
        """Which server each call goes to (set with the servers, on the first call)."""
        self._lock = asyncio.Lock()

    async def _servers(self) -> list[ChatAPIPolicy]:
        if self._policies is None:
            async with self._lock:
                if self._policies is None:
                    from gym_bridge.policies.chat_api import ChatAPIPolicy
                    from gym_bridge.policies.discovery import served_models
                    from gym_bridge.policies.http import normalize_base_url

                    settings = self.settings
                    urls = [normalize_base_url(url) for url in settings.model_base_urls]
                    model = settings.model
                    if model is None:
                        models = await served_models(urls[0], api_key=settings.api_key, timeout_s=min(settings.request_timeout_s, 30.0))
                        if not models:
                            raise BackendAnswerError(f"{urls[0]} serves no model")
                        model = str(models[0]["id"])
                    self.model_name = model
                    self._policies = [
                        ChatAPIPolicy(model=model, base_url=url, api="chat", api_key=settings.api_key, token_ids=True,
                                      request_timeout_s=settings.request_timeout_s, max_retries=settings.max_retries)
                        for url in urls
                    ]
                    self.router = ReplicaRouter(urls)
        return self._policies

    async def chat(self, request: ChatRequest) -> Turn:
        servers = await self._servers()
        router = self.router
        assert router is not None  # set with the servers
        server = router.choose(request.session_id)
        router.started(server)
        ok = False
        try:
            turn = await servers[server].chat(request)
            ok = True
        finally:
            router.finished(server, ok=ok)
        return turn

    async def aclose(self) -> None:
        for policy in self._policies or []:
            await policy.aclose()


class RowError(UserError):
    """A `/run` body that is not a usable row; answered with 422 naming `field`."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field


class AgentServer:
    """Turns `/run` rows into core rollouts and their records into NeMo Gym results."""

    def __init__(self, settings: AgentServerSettings, policy: ChatPolicy | None = None, *,
                 model_identity: str | None = None) -> None:
        """`model_identity`: what generates, for the journal's fingerprint (`served_model_identity`; default the
        `model` setting)."""
        if not settings.envs:
            raise ConfigError("serve at least one environment (--env NAME)")
        self.settings = settings
        self.env_classes: dict[str, type[Environment]] = {}
        for name in settings.envs:
            self.env_classes[name] = get_environment(name)  # raises UnknownEnvironmentError listing the known ones
        self.routes = {route: env_class for name, env_class in self.env_classes.items()
                       for route in (name, *routing_names(env_class))}
        """The routing names a `/run` row may give (served names, their aliases and module paths), fixed at start:
        a row is routed only among these, so no body makes the server import a module."""
        ensure_ready(self.env_classes.values())  # a missing sandbox stops the server at start, not each /run
        self.policy: Any = policy if policy is not None else ModelServers(settings)
        self.engine = Engine(self.policy, None, EngineConfig(
            limits=Limits(max_turns=settings.max_turns, max_completion_tokens=settings.max_completion_tokens),
            max_concurrency=settings.max_concurrency, deadline_s=settings.deadline_s, model_name=settings.model or "",
        ))
        """The one engine of every `/run`: its concurrency bound holds across them; each row brings its own sampling."""
        self._counter = itertools.count()
        self.journal = open_journal(settings, self.env_classes.values(), model_identity=model_identity) if settings.journal_dir else None
        self.engine.journal = self.journal
        self._tried: set[tuple[int, int]] = set()
        """Rollout ids this process started and has not finished: one sent again reads its committed turns."""
        self._running: set[tuple[int, int]] = set()
        self.in_flight = 0
        """`/run` requests being answered (running, or waiting for one of the engine's slots)."""
        self.completed = 0

    def check_row(self, row: Any) -> tuple[Task, type[Environment], SamplingParams]:
        """The task, its environment class and sampling of a `/run` body; raises RowError."""
        try:
            task = parse_task(row, index=next(self._counter), source="/run")
        except DataError as error:
            raise RowError(str(error).removeprefix("/run: ").removeprefix(f"{error.field}: "), field=error.field) from None
        env_class = self.routes.get(task.env_name)
        if env_class is None:
            raise RowError(f"environment {task.env_name!r} is not served here; this server serves {sorted(set(self.settings.envs))}",
                           field="agent_ref.name")
        try:
            resolve_tasks([task])  # the row's tool schemas must match the environment's tools
        except DataError as error:
            raise RowError(str(error).removeprefix("/run: ").removeprefix(f"{error.field}: "), field=error.field) from None
        if issubclass(env_class, HarnessEnvironment) and row_command(task.row) is not None:
            raise RowError("a /run body may not name the command its harness runs (it would run with this server's "
                           "permissions, whatever the environment allows elsewhere); the environment's own command runs",
                           field="harness.command")
        check_verifier_fields(task, env_class)
        return task, env_class, self.sampling(task)

    def sampling(self, task: Task) -> SamplingParams:
        """The row's sampling: NeMo RL stamps `temperature`, `top_p` and `max_output_tokens` on every row,
        and its server refuses a call whose temperature and top_p differ from the trainer's."""
        params = task.create_params
        values: dict[str, float] = {}
        for name, default, low, high in (("temperature", 1.0, 0.0, 100.0), ("top_p", 1.0, 1e-9, 1.0)):
            value = params.get(name, default)
            if value is None:
                value = default
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
                raise RowError(f"must be a number in [{low:g}, {high:g}], got {value!r}", field=f"responses_create_params.{name}")
            values[name] = float(value)
        max_tokens = params.get("max_output_tokens")
        if max_tokens is None:
            max_tokens = self.settings.max_new_tokens
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RowError(f"must be a positive integer, got {max_tokens!r}", field="responses_create_params.max_output_tokens")
        return SamplingParams(temperature=values["temperature"], top_p=values["top_p"], max_new_tokens=max_tokens)

    async def run(self, row: Any) -> dict[str, Any]:
        """One `/run`: the NeMo Gym result of a rollout of `row`. Raises RowError before running."""
        task, env_class, sampling = self.check_row(row)
        key = rollout_id(row) if self.journal is not None else None
        if key in self._running:
            raise RolloutInFlight(f"rollout (_ng_task_index {key[0]}, _ng_rollout_index {key[1]}) is running already; "
                                  "send it again once that request has ended")
        self.in_flight += 1
        try:
            record = await self._rollout(task, env_class, sampling, key)
        finally:
            self.in_flight -= 1
        self.completed += 1
        result = to_run_result(record)
        result["response"]["model"] = result["response"]["model"] or getattr(self.policy, "model_name", None) or ""
        return result


    async def _rollout(self, task: Task, env_class: type[Environment], sampling: SamplingParams,
                       key: tuple[int, int] | None) -> RolloutRecord:
        """One rollout; one with an id is journaled under it and, sent again, continues from its committed turns."""
        if key is None or self.journal is None:
            return await self.engine.rollout(task, 0, env_class=env_class, sampling=sampling, journaled=False)
        if key in self._tried:
            self.journal.load([key])  # cut off earlier in this process (a client that disconnected)
        self._tried.add(key)
        self._running.add(key)
        try:
            record = await self.engine.rollout(dataclasses.replace(task, index=key[0]), key[1], env_class=env_class,
                                               sampling=sampling)
        finally:
            self._running.discard(key)
        self.journal.finish(key)
        self._tried.discard(key)
        return record


def check_verifier_fields(task: Task, env_class: type[Environment]) -> None:
    """Raise RowError for the problems `env_class.validate_row` finds in the row's verifier fields (the check
    `gym-bridge data validate` runs), naming the first problem's field and listing every problem."""
    problems = env_class.validate_row(task.row)
    if problems:
        first, *others = problems
        also = "".join(f"; {problem.field}: {problem.message}" for problem in others)
        raise RowError(f"{first.message} (environment {env_class.name!r}){also}", field=first.field)


class RolloutInFlight(UserError):
    """A `/run` for a rollout id whose earlier request is still running; answered with 409."""


def rollout_id(row: Any) -> tuple[int, int] | None:
    """The rollout a `/run` row names, as NeMo Gym's rollout collection stamps it (`_ng_task_index`,
    `_ng_rollout_index`: the key it resumes on); None when it names none. Raises RowError for a half or bad id."""
    values = [row.get(name) for name in ("_ng_task_index", "_ng_rollout_index")] if isinstance(row, Mapping) else [None, None]
    if values == [None, None]:
        return None
    checked: list[int] = []
    for name, value in zip(("_ng_task_index", "_ng_rollout_index"), values):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise RowError(f"must be a non-negative integer with the other half of the rollout id, got {value!r}", field=name)
        checked.append(value)
    return checked[0], checked[1]


def open_journal(settings: AgentServerSettings, env_classes: Iterable[type[Environment]], *,
                 model_identity: str | None = None) -> RunJournal:
    """The server's journal in `settings.journal_dir`, continuing what a killed server left there. Raises JournalError
    when it was written by a server with other settings (environments and their settings, limits) or another model
    (`model_identity`, else the `model` setting)."""
    assert settings.journal_dir is not None
    fingerprint = RunFingerprint(model=model_identity or settings.model or "", tasks="rows of /run", settings={
        "envs": sorted(settings.envs), "max_turns": settings.max_turns, "max_completion_tokens": settings.max_completion_tokens,
        "max_new_tokens": settings.max_new_tokens, "deadline_s": settings.deadline_s, **environment_settings(env_classes)})
    return RunJournal.prepare(settings.journal_dir, fingerprint, resume=True)


def default_journal_dir(port: int) -> str | None:
    """Where `serve` journals when not told: `<cache>/serve_journal/port-<port>` (a server restarted on its port finds
    it; `$GYM_BRIDGE_CACHE`, else `~/.cache/gym_bridge`); None for port 0, a new port at every start."""
    if port == 0:
        return None
    from gym_bridge.policies.embedded import cache_root

    return str(cache_root() / "serve_journal" / f"port-{port}")


NEMO_GYM_FAILURE_KINDS = {"timeout": "agent_timeout", "verifier": "verifier_error"}
"""gym_bridge failure kinds that have a name in NeMo Gym's shared vocabulary (`nemo_gym/failure_kinds.py`
of NeMo Gym 0.7.0: a rollout past its deadline inside the agent server, a verifier that raised)."""
NEMO_GYM_REGISTERED_KINDS = frozenset({
    "transport_unreachable", "transport_peer_drop", "transport_timeout", "transport_local_resource", "agent_run_error",
    "agent_request_failed", "agent_timeout", "agent_command_not_allowed", "judge_failed", "judge_unparseable", "verifier_error",
    "provider_unavailable", "provider_quota_exhausted", "provider_oom_killed", "session_lost", "session_expired",
    "session_release_failed", "cancelled", "kill_shaped", "shutdown", "persistence_failed", "cohort_incomplete",
})
"""NeMo Gym 0.7.0's registered failure kinds; an environment's own kind that is one of them passes as is."""
_KIND = re.compile(r"[a-z][a-z0-9_]*")


def nemo_gym_failure_kind(kind: str | None) -> str | None:
    """A gym_bridge failure kind as NeMo Gym names it: its shared name where one means the same
    (`timeout` -> `agent_timeout`, `verifier` -> `verifier_error`), a registered or already
    namespaced kind unchanged, anything else in NeMo Gym's `<server>:<kind>` form for kinds outside
    its vocabulary (`infra` -> `gym_bridge:infra`, `env`, `context_overflow`, an environment's own)."""
    if kind is None or kind in NEMO_GYM_REGISTERED_KINDS:
        return kind
    if kind in NEMO_GYM_FAILURE_KINDS:
        return NEMO_GYM_FAILURE_KINDS[kind]
    server, _, name = kind.rpartition(":")
    if server and _KIND.fullmatch(server) and _KIND.fullmatch(name):
        return kind
    name = re.sub(r"[^a-z0-9_]+", "_", kind.lower()).strip("_") or "unknown"
    return f"gym_bridge:{name if name[0].isalpha() else 'kind_' + name}"


def to_run_result(record: RolloutRecord) -> dict[str, Any]:
    """A record as `/run` answers it: the row, `response`, `reward`, `reward_components`, `mask_sample`,
    `failure_kind` (NeMo Gym's name, `nemo_gym_failure_kind`)/`failure_reason` and `metrics`, without
    the flat `tokens` view (NeMo RL rebuilds it from the output items). `mask_sample` is also set in
    `instance_config`, where NeMo RL reads it (`nemo_rl/experience/rollouts.py::_extract_mask_sample_flags`).
    A harness that rewrote its history left calls whose ids do not continue each other, which NeMo RL
    refuses ("Non-contiguous messages found!"); only the calls of its last segment keep their token
    ids, so NeMo RL trains that segment, as TRL and verl do (`metrics.verify.rewrites` counts the rest)."""
    result = record.to_dict()
    del result["tokens"]
    if record.tokens.segments:
        result["response"] = {**result["response"], "output": _last_segment_only(result["response"]["output"])}
    result["failure_kind"] = nemo_gym_failure_kind(record.failure_kind)
    instance_config = result.get("instance_config")
    if instance_config is None or isinstance(instance_config, Mapping):
        result["instance_config"] = {**(instance_config or {}), "mask_sample": record.mask_sample}
    return result


def _last_segment_only(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`output` with the token fields dropped from the calls before a harness's last segment (see
    `gym_bridge.capture.assembly`); the record's own items are left as they are."""
    from gym_bridge.capture.assembly import CapturedCall, assemble

    carrying = [item for item in output if item.get("generation_token_ids") is not None]
    calls = [CapturedCall(prompt_ids=list(item.get("prompt_token_ids") or []), completion_ids=list(item["generation_token_ids"]),
                          logprobs=list(item.get("generation_log_probs") or [])) for item in carrying]
    kept = assemble(calls).calls_per_segment[-1] if calls else 0
    earlier = {id(item) for item in carrying[: len(carrying) - kept]}
    return [{key: value for key, value in item.items() if key not in TOKEN_FIELDS} if id(item) in earlier else item
            for item in output]


TASK_INDEX_KEY = "_ng_task_index"
ROLLOUT_INDEX_KEY = "_ng_rollout_index"
"""Where NeMo Gym's rollout collection numbers each result (its task and its repeat)."""


def aggregate_metrics(verify_responses: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """NeMo Gym 0.7.0's `/aggregate_metrics` answer for the stripped `/run` results it collected
    (`AggregateMetricsRequest.verify_responses`): `AggregateMetrics` with `agent_metrics` (mean, max,
    min, median, sample std of `reward` and of every other top-level number over the measured rollouts),
    `key_metrics` (the means, as NeMo Gym's default), `group_level_metrics` (the same per `_ng_task_index`) and
    `repeat_level_metrics` (mean reward per `_ng_rollout_index`). Rollouts with `mask_sample` are
    left out of the quality numbers and counted under `coverage/...`, as NeMo Gym does; when every
    rollout was masked only the coverage is reported."""
    scored = [response for response in verify_responses if not response.get("mask_sample")]
    masked = len(verify_responses) - len(scored)
    coverage: dict[str, Any] = {}
    if masked:
        tasks = {response.get(TASK_INDEX_KEY, 0) for response in verify_responses}
        measured = {response.get(TASK_INDEX_KEY, 0) for response in scored}
        coverage = {"coverage/measured_rollouts": len(scored), "coverage/masked_rollouts": masked,
                    "coverage/measured_tasks": len(measured), "coverage/fully_masked_tasks": len(tasks - measured)}
    empty: dict[str, Any] = {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}, "repeat_level_metrics": []}
    if not verify_responses:
        return empty
    if not scored:
        return {**empty, "agent_metrics": dict(coverage), "key_metrics": dict(coverage)}
    agent_metrics = {**_number_stats(scored), **coverage}
    groups: dict[Any, list[Mapping[str, Any]]] = {}
    repeats: dict[Any, list[Mapping[str, Any]]] = {}
    for response in scored:
        groups.setdefault(response.get(TASK_INDEX_KEY, 0), []).append(response)
        repeats.setdefault(response.get(ROLLOUT_INDEX_KEY, 0), []).append(response)
    group_level = [{TASK_INDEX_KEY: task, **_number_stats(rows)} for task, rows in sorted(groups.items(), key=lambda item: str(item[0]))]
    repeat_level = [{ROLLOUT_INDEX_KEY: repeat, "mean/reward": _mean([_number(row.get("reward")) or 0.0 for row in rows])}
                    for repeat, rows in sorted(repeats.items(), key=lambda item: str(item[0]))]
    key_metrics = {name: value for name, value in agent_metrics.items() if name.startswith(("mean/", "coverage/"))}
    return {"group_level_metrics": group_level, "agent_metrics": agent_metrics, "key_metrics": key_metrics,
            "repeat_level_metrics": repeat_level}


_NOT_METRICS = frozenset({TASK_INDEX_KEY, ROLLOUT_INDEX_KEY, "task_index", "repeat_index", "mask_sample"})


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _number_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """`mean/`, `max/`, `min/`, `median/`, `std/` of each top-level number of the rows (`reward` first)."""
    names = ["reward"] + sorted({key for row in rows for key, value in row.items()
                                 if key != "reward" and key not in _NOT_METRICS and not key.startswith("_") and _number(value) is not None})
    stats: dict[str, float] = {}
    for name in names:
        values = [number for number in (_number(row.get(name)) for row in rows) if number is not None]
        if not values:
            continue
        mean = _mean(values)
        ordered = sorted(values)
        middle = len(ordered) // 2
        stats.update({
            f"mean/{name}": mean, f"max/{name}": ordered[-1], f"min/{name}": ordered[0],
            f"median/{name}": ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2,
            f"std/{name}": math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1)) if len(values) > 1 else 0.0,
        })
    return stats


def build_app(settings: AgentServerSettings, *, policy: ChatPolicy | None = None, model_identity: str | None = None) -> Any:
    """The FastAPI app: `POST /run`, `POST /aggregate_metrics`, `GET /health`. `policy` replaces the
    model servers (tests); `model_identity` is what the journal fingerprints (`AgentServer`)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    server = AgentServer(settings, policy, model_identity=model_identity)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        aclose = getattr(server.policy, "aclose", None)
        if aclose is not None:
            await aclose()
        if server.journal is not None:
            await server.journal.close()  # kept while a rollout is left in flight, for its client's retry

    app = FastAPI(title="gym-bridge serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.agent_server = server

    def unprocessable(message: str, field: str) -> JSONResponse:
        return JSONResponse({"detail": message, "field": field}, status_code=422)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "envs": sorted(set(settings.envs)), "in_flight": server.in_flight, "completed": server.completed})

    async def run(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > settings.max_request_bytes):
            return JSONResponse({"detail": f"request body is larger than {settings.max_request_bytes} bytes"}, status_code=413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_request_bytes:
                return JSONResponse({"detail": f"request body is larger than {settings.max_request_bytes} bytes"}, status_code=413)
        try:
            row = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return unprocessable(f"request body is not valid JSON: {error}", "body")
        except RecursionError:
            return unprocessable(f"request body is nested too deeply (a row may nest at most {MAX_ROW_DEPTH} levels)", "body")
        try:  # written as records are: a NaN of the row (JSON has none) as null
            return Response(dump_line(await unless_disconnected(server.run(row), request.receive)), media_type="application/json")
        except ClientDisconnected:
            return JSONResponse({"detail": "the client disconnected; its rollout was cancelled"}, status_code=499)
        except RowError as error:
            return unprocessable(str(error), error.field)
        except RolloutInFlight as error:
            return JSONResponse({"detail": str(error)}, status_code=409)
        except Exception as error:  # a bug outside the rollout's own boundary: this request only
            return JSONResponse({"detail": f"{type(error).__name__}: {error}"}, status_code=500)

    async def aggregate(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            return unprocessable(f"request body is not valid JSON: {error}", "body")
        responses = body.get("verify_responses") if isinstance(body, Mapping) else None
        if not isinstance(responses, list) or not all(isinstance(response, Mapping) for response in responses):
            return unprocessable("must be a list of objects (NeMo Gym's AggregateMetricsRequest)", "verify_responses")
        return JSONResponse(aggregate_metrics(responses))

    app.add_route("/health", health, methods=["GET"])
    app.add_route("/run", run, methods=["POST"])
    app.add_route("/aggregate_metrics", aggregate, methods=["POST"])
    return app


def serve(settings: AgentServerSettings, *, host: str = "127.0.0.1", port: int = 9000,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted; `on_ready` gets `http://host:port` once bound. Past `max_concurrency`
    `/run`s in flight, a new one gets a 503 with `Retry-After` (NeMo Gym's client retries); `/health`
    and `/aggregate_metrics` are always answered, however busy the server is. With a journal, the model servers are
    asked first what they serve (`served_model_identity`): a journal of another model is refused (JournalError)."""
    try:
        import uvicorn
    except ImportError:
        raise MissingExtraError("gym-bridge serve needs FastAPI and uvicorn: pip install 'gym-bridge[serve]'") from None
    from gym_bridge.serve.request_limit import RequestLimit
    from gym_bridge.serve.model_server import bind_socket

    sock = bind_socket(host, port)  # a busy port fails first, before the model servers are asked
    try:
        identity = None
        if settings.journal_dir:
            from gym_bridge.policies.discovery import served_model_identity

            identity = asyncio.run(served_model_identity(settings.model_base_urls, model=settings.model, api_key=settings.api_key))
        app = RequestLimit(build_app(settings, model_identity=identity), limit=settings.max_concurrency,
                           limited=lambda path: path == "/run", refusal=_busy)
    except BaseException:
        sock.close()
        raise
    bound_host, bound_port = sock.getsockname()[:2]
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=120)
    if on_ready is not None:
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        on_ready(f"http://{shown}:{bound_port}")
    uvicorn.Server(config).run(sockets=[sock])


def _busy(limit: int) -> dict[str, Any]:
    return {"detail": f"the server is running its limit of {limit} rollouts (--max-concurrency); retry later"}


@dataclass(frozen=True)
class NemoGymLaunch:
    """Where and what to serve when NeMo Gym starts this server (see `from_nemo_gym_environ`)."""

    settings: AgentServerSettings
    host: str
    port: int
    extra: dict[str, Any] = field(default_factory=dict)


_SETTING_KEYS = {
    "max_turns": int, "max_new_tokens": int, "max_completion_tokens": int, "deadline_s": float,
    "max_concurrency": int, "max_request_bytes": int, "request_timeout_s": float, "max_retries": int,
}


def from_nemo_gym_environ(environ: Mapping[str, str] | None = None) -> NemoGymLaunch:
    """Settings from the environment NeMo Gym starts a server in: `NEMO_GYM_CONFIG_DICT` (the global
    config as YAML) and `NEMO_GYM_CONFIG_PATH` (this server's top-level name). The server's own
    entry (`<name>.responses_api_agents.<any>`) gives `host`, `port`, optional `envs` (default: the
    name) and any `AgentServerSettings` number; `policy_base_url` and `policy_model_name`, which NeMo
    RL puts in the global config (`nemo_rl/environments/nemo_gym.py::NemoGym._spinup`), give the
    model servers. Raises GymBridgeError naming what is missing."""
    import yaml

    environ = os.environ if environ is None else environ
    raw, name = environ.get("NEMO_GYM_CONFIG_DICT"), environ.get("NEMO_GYM_CONFIG_PATH")
    if not raw or not name:
        raise ConfigError("NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH are not set: this entry point is started by NeMo Gym")
    config = yaml.safe_load(raw)
    try:
        entry = next(iter(next(iter(config[name].values())).values()))
    except (KeyError, StopIteration, AttributeError, TypeError):
        raise ConfigError(f"NeMo Gym's config has no server entry {name}.<server type>.<server name>") from None
    urls = config.get("policy_base_url")
    urls = [urls] if isinstance(urls, str) else list(urls or [])
    if not urls:
        raise ConfigError("NeMo Gym's config has no policy_base_url (NeMo RL sets it to its vLLM servers' URLs)")
    if entry.get("host") is None or entry.get("port") is None:
        raise ConfigError(f"the server entry {name} has no host and port")
    envs = entry.get("envs") or [name]
    numbers = {key: cast(entry[key]) for key, cast in _SETTING_KEYS.items() if entry.get(key) is not None}
    journal = entry.get("journal_dir", default_journal_dir(int(entry["port"])))  # null in the entry: no journal
    settings = AgentServerSettings(envs=tuple(envs), model_base_urls=tuple(str(url) for url in urls),
                                   model=config.get("policy_model_name"), api_key=config.get("policy_api_key"),
                                   journal_dir=None if journal is None else str(journal), **numbers)
    return NemoGymLaunch(settings=settings, host=str(entry["host"]), port=int(entry["port"]))


def main_from_nemo_gym(environ: Mapping[str, str] | None = None) -> None:
    """What the NeMo Gym entry point (`recipes/nemo_rl/responses_api_agents/gym_bridge/app.py`) runs."""
    launch = from_nemo_gym_environ(environ)
    serve(launch.settings, host="0.0.0.0", port=launch.port,
          on_ready=lambda url: print(f"gym-bridge serve: {', '.join(launch.settings.envs)} at {url}", flush=True))


def settings_from_args(envs: Sequence[str], base_urls: Sequence[str], **values: Any) -> AgentServerSettings:
    """Settings from the command line (`--model-base-url` may be repeated or comma-separated)."""
    urls = tuple(url.strip() for entry in base_urls for url in entry.split(",") if url.strip())
    return AgentServerSettings(envs=tuple(envs), model_base_urls=urls, **{k: v for k, v in values.items() if v is not None})
