"""`gym-bridge serve`: gym_bridge environments as NeMo Gym agent servers, the way NeMo RL uses them.

NeMo RL POSTs each row to `/run` of the server its `agent_ref.name` names; each `/run` is one core rollout whose
model calls go to NeMo RL's `/v1/chat/completions` (a routed chat policy with token ids). Here: the settings, the
server (`AgentServer`: a row checked, run, answered in NeMo Gym's wire format, `gym_bridge.core.dialects.nemo_gym`),
its journal (`open_journal`: a row that names its rollout and is sent again continues from its last turn) and the
app (`build_app`; `agent_launch` starts it). A malformed row answers 422 naming the field; a failed rollout 200.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from gym_bridge.capture.environment import HarnessEnvironment, row_command
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.dialects.nemo_gym import aggregate_metrics, from_aggregate_request, rollout_id, run_sampling, to_run_result
from gym_bridge.core.engine import Engine, EngineConfig, ensure_ready
from gym_bridge.core.environment import Environment, row_problems
from gym_bridge.core.errors import ConfigError, DataError, UserError
from gym_bridge.core.journal import RolloutKey, RunFingerprint, environment_settings, open_journal
from gym_bridge.core.policy import ChatPolicy, SamplingParams
from gym_bridge.core.record import RolloutRecord
from gym_bridge.core.registry import get_environment, resolve_tasks, routing_names
from gym_bridge.core.rollout_file import dump_line
from gym_bridge.core.request_body import BodyError, read_json
from gym_bridge.core.task import Task, parse_task
from gym_bridge.serve.disconnect import ClientDisconnected, unless_disconnected

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


class RowError(UserError):
    """A `/run` body that is not a usable row; answered with 422 naming `field`."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field

    @classmethod
    def from_data_error(cls, error: DataError) -> RowError:
        """The row's problem `error` found (its message without source and field, and its field)."""
        return cls(error.message, field=error.field)


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
        self.policy: Any = policy if policy is not None else model_servers(settings)
        self.journal = (open_journal(settings.journal_dir, journal_fingerprint(settings, self.env_classes.values(), model_identity=model_identity))
                        if settings.journal_dir else None)
        self.engine = Engine(self.policy, None, EngineConfig(
            limits=Limits(max_turns=settings.max_turns, max_completion_tokens=settings.max_completion_tokens),
            max_concurrency=settings.max_concurrency, deadline_s=settings.deadline_s, model_name=settings.model or "",
        ), journal=self.journal)
        """The one engine of every `/run`: its concurrency bound holds across them; each row brings its own sampling."""
        self._counter = itertools.count()
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
            raise RowError.from_data_error(error) from None
        env_class = self.routes.get(task.env_name)
        if env_class is None:
            raise RowError(f"environment {task.env_name!r} is not served here; this server serves {sorted(set(self.settings.envs))}",
                           field="agent_ref.name")
        try:
            resolve_tasks([task])  # the row's tool schemas must match the environment's tools
        except DataError as error:
            raise RowError.from_data_error(error) from None
        if issubclass(env_class, HarnessEnvironment) and row_command(task.row) is not None:
            raise RowError("a /run body may not name the command its harness runs (it would run with this server's "
                           "permissions, whatever the environment allows elsewhere); the environment's own command runs",
                           field="harness.command")
        check_verifier_fields(task, env_class)
        try:
            return task, env_class, run_sampling(task, default_max_new_tokens=self.settings.max_new_tokens)
        except DataError as error:
            raise RowError.from_data_error(error) from None

    async def run(self, row: Any) -> dict[str, Any]:
        """One `/run`: the NeMo Gym result of a rollout of `row`. Raises RowError before running."""
        task, env_class, sampling = self.check_row(row)
        try:
            key = rollout_id(row) if self.journal is not None else None
        except DataError as error:
            raise RowError.from_data_error(error) from None
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
            return await self.engine.rollout(task, 0, env_class=env_class, sampling=sampling)
        journal_key = RolloutKey.of_task(*key)
        if key in self._tried:
            self.journal.load([journal_key])  # cut off earlier in this process (a client that disconnected)
        self._tried.add(key)
        self._running.add(key)
        try:
            record = await self.engine.rollout(dataclasses.replace(task, index=key[0]), key[1], env_class=env_class,
                                               sampling=sampling, key=journal_key)
        finally:
            self._running.discard(key)
        self.journal.finish(journal_key)
        self._tried.discard(key)
        return record


def model_servers(settings: AgentServerSettings) -> ChatPolicy:
    """The chat policy of `/run`: NeMo RL's chat endpoints with token ids (as NeMo Gym's model servers call them),
    every call of one rollout on the same server, new rollouts on the least busy one (`build_policy`'s routed chat
    policy). Raises ConfigError without a model base URL."""
    if not settings.model_base_urls:
        raise ConfigError("give at least one model base URL (--model-base-url)")
    from gym_bridge.policies.factory import PolicySpec, build_chat_policy

    return build_chat_policy(PolicySpec(kind="chat", model=settings.model, base_urls=settings.model_base_urls, api_key=settings.api_key,
                                          token_ids=True, request_timeout_s=settings.request_timeout_s,
                                          max_retries=settings.max_retries))


def check_verifier_fields(task: Task, env_class: type[Environment]) -> None:
    """Raise RowError for the problems `row_problems` finds in the row (the check `gym-bridge data validate` runs:
    `validate_row`, and what the default trust does not let run), naming the first problem's field and listing every problem."""
    problems = row_problems(env_class, task.row)
    if problems:
        first, *others = problems
        also = "".join(f"; {problem.field}: {problem.message}" for problem in others)
        raise RowError(f"{first.message} (environment {env_class.name!r}){also}", field=first.field)


class RolloutInFlight(UserError):
    """A `/run` for a rollout id whose earlier request is still running; answered with 409."""


def journal_fingerprint(settings: AgentServerSettings, env_classes: Iterable[type[Environment]], *,
                        model_identity: str | None = None) -> RunFingerprint:
    """What the server's journal depends on: its settings (environments and their settings, limits) and its model
    (`model_identity`, else the `model` setting); a journal a server with others wrote is refused (`open_journal`)."""
    return RunFingerprint(model=model_identity or settings.model or "", tasks="rows of /run", settings={
        "envs": sorted(settings.envs), "max_turns": settings.max_turns, "max_completion_tokens": settings.max_completion_tokens,
        "max_new_tokens": settings.max_new_tokens, "deadline_s": settings.deadline_s, **environment_settings(env_classes)})


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

    def body_error(error: BodyError) -> JSONResponse:
        """413 for a body too large; 422 naming the field for the rest, as a row's problems are answered."""
        if error.status == 413:
            return JSONResponse({"detail": error.message}, status_code=413)
        return unprocessable(error.message, error.field)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "envs": sorted(set(settings.envs)), "in_flight": server.in_flight, "completed": server.completed})

    async def run(request: Request) -> Response:
        try:
            row = await read_json(request.stream(), content_length=request.headers.get("content-length"),
                                  max_bytes=settings.max_request_bytes)
        except BodyError as error:
            return body_error(error)
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
            body = await read_json(request.stream(), content_length=request.headers.get("content-length"),
                                   max_bytes=settings.max_request_bytes)
        except BodyError as error:
            return body_error(error)
        try:
            return JSONResponse(aggregate_metrics(from_aggregate_request(body)))
        except DataError as error:
            return unprocessable(error.message, error.field)

    app.add_route("/health", health, methods=["GET"])
    app.add_route("/run", run, methods=["POST"])
    app.add_route("/aggregate_metrics", aggregate, methods=["POST"])
    return app
