"""The environment API: tools, a session per rollout, and a verifier.

An environment is a class. The engine makes one instance per rollout (the session), calls
`setup(task)`, lets the model call its `@tool` methods through `call_tool`, calls
`verify(task, output)` on the finished trajectory, and always calls `close()`. Tool JSON schemas
are derived once per class from signatures and docstrings; `call_tool` validates arguments against
them before a tool runs. Many tools are grouped in `Toolset` classes the environment includes.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, ClassVar, Mapping

import pydantic

from gym_bridge.core.errors import FailureKind, RolloutError
from gym_bridge.core.items import Item
from gym_bridge.core.journal import ResumeKind
from gym_bridge.core.task import Task
from gym_bridge.core.trust import DEFAULT_TRUST, TrustSettings


@dataclass(frozen=True)
class VerifyResult:
    """The score of one trajectory."""

    reward: float
    reward_components: dict[str, float] = field(default_factory=dict)
    """Named parts of the reward; when given they must sum to `reward`."""
    mask_sample: bool = False
    """True for infrastructure failures: keep the sample out of the loss and the group baseline."""
    failure_kind: FailureKind | None = None
    failure_reason: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    """Extra values for logging (accuracy, overlap, parsed answer, ...)."""

    def __post_init__(self) -> None:
        if not math.isfinite(self.reward):
            raise ValueError(f"reward must be a finite number, got {self.reward!r}")
        if self.reward_components and not math.isclose(
            sum(self.reward_components.values()), self.reward, rel_tol=1e-6, abs_tol=1e-6
        ):
            raise ValueError(
                f"reward_components {self.reward_components} sum to "
                f"{sum(self.reward_components.values())}, not to reward {self.reward}"
            )


def to_verify_result(value: object) -> VerifyResult:
    """What `verify` returned, as a VerifyResult (a plain number is the reward).

    Raises TypeError for anything else and ValueError for a reward that is not finite.
    """
    if isinstance(value, VerifyResult):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return VerifyResult(reward=float(value))
    raise TypeError(f"verify returned {type(value).__name__}, expected VerifyResult or float")


@dataclass(frozen=True)
class RowProblem:
    """One problem with a task row's verifier fields, found before anything runs."""

    field: str
    """Dotted path of the field, e.g. `verifier_metadata.kwargs[2].num_words`."""
    message: str


def schema_problems(model: type[pydantic.BaseModel], row: dict[str, Any]) -> list[RowProblem]:
    """The problems pydantic finds validating `row` against `model`, one per field."""
    try:
        model.model_validate(row)
    except pydantic.ValidationError as error:
        problems = []
        for entry in error.errors():
            path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in entry["loc"]).lstrip(".")
            problems.append(RowProblem(field=path or "(row)", message=entry["msg"]))
        return problems
    return []


def row_problems(env_class: type[Environment], row: dict[str, Any], trust: TrustSettings = DEFAULT_TRUST) -> list[RowProblem]:
    """A row's problems for `env_class`: its own (`validate_row`) and what `trust` does not let run (`trust_problems`)."""
    return [*env_class.validate_row(row), *env_class.trust_problems(row, trust)]


class ToolError(RolloutError):
    """Raised by a tool for an error the model should read (bad input, missing item).

    Any other exception from a tool is a bug in the environment and fails the rollout as `env`
    (so does a ToolError raised outside a tool).
    """

    failure_kind = "env"


@dataclass(frozen=True)
class ToolSpec:
    """A tool of an environment: its Responses-format schema and argument validator."""

    name: str
    schema: dict[str, Any]
    """`{"type": "function", "name", "description", "parameters", "strict"}` as in the Responses API."""
    arguments_model: type[pydantic.BaseModel]
    is_async: bool


def tool(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an environment method as a tool the model may call.

    The schema comes from the signature (type hints) and the docstring: its first paragraph
    is the description and an `Args:` section describes the parameters.
    """
    setattr(method, "__gym_bridge_tool__", True)  # a mark on a function object: no type declares it
    return method


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    if not doc:
        return "", {}
    text = inspect.cleandoc(doc)
    description = text.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    args_block = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", text, re.MULTILINE)
    if args_block:
        current = None
        for line in args_block.group(1).splitlines():
            match = re.match(r"\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
            if match:
                current = match.group(1)
                params[current] = match.group(2).strip()
            elif current and line.strip():
                params[current] += " " + line.strip()
    return description, params


def without_titles(schema: Any) -> Any:
    """A JSON schema with pydantic's `title` keys left out at every level (tool parameters as the model reads them)."""
    if isinstance(schema, dict):
        return {key: without_titles(value) for key, value in schema.items() if key != "title"}
    if isinstance(schema, list):
        return [without_titles(value) for value in schema]
    return schema


def tool_spec(method: Callable[..., Any], *, name: str) -> ToolSpec:
    """Derive the schema and argument validator of one tool method.

    Raises TypeError naming the parameter when a parameter has no type hint.
    """
    description, param_docs = _parse_docstring(method.__doc__)
    hints = typing.get_type_hints(method)
    fields: dict[str, Any] = {}
    for param in list(inspect.signature(method).parameters.values())[1:]:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {name}: *args/**kwargs are not supported")
        if param.name not in hints:
            raise TypeError(f"tool {name}: parameter {param.name!r} needs a type hint")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (
            hints[param.name],
            pydantic.Field(default, description=param_docs.get(param.name) or None),
        )
    model = pydantic.create_model(
        f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    parameters = without_titles(model.model_json_schema())
    parameters.pop("additionalProperties", None)
    parameters.setdefault("properties", {})
    parameters["required"] = [key for key, spec in fields.items() if spec[1].is_required()]
    parameters["additionalProperties"] = False
    schema = {"type": "function", "name": name, "description": description, "parameters": parameters, "strict": False}
    return ToolSpec(name=name, schema=schema, arguments_model=model, is_async=inspect.iscoroutinefunction(method))


class Toolset:
    """A group of `@tool` methods (and their helpers) that environments include by listing it:
    `toolsets = (Calendar, Email)`.

    Its members become members of the environment class, so a tool runs with `self` being the
    session and toolsets share the session's state (what `setup` sets) and each other's helpers;
    declare the attributes a toolset uses (`db: sqlite3.Connection`) on it or on a common base.
    A name two toolsets define differently, or that the environment API already has, is a
    TypeError when the environment class is made; the environment's own methods override.
    """


_MISSING = object()


def _toolset_members(toolset: type[Toolset]) -> dict[str, Any]:
    """The attributes `toolset` and its bases (below Toolset) define, dunders left out."""
    members: dict[str, Any] = {}
    for klass in reversed(toolset.__mro__):
        if issubclass(klass, Toolset) and klass is not Toolset:
            members.update((key, value) for key, value in vars(klass).items() if not key.startswith("__"))
    return members


def _include_toolsets(env_class: type[Environment]) -> None:
    """Copy the members of the toolsets `env_class` lists onto it; raises TypeError on a clash."""
    owners: dict[str, type[Toolset]] = {}
    for toolset in env_class.__dict__.get("toolsets", ()):
        if not (isinstance(toolset, type) and issubclass(toolset, Toolset)):
            raise TypeError(f"{env_class.__name__}.toolsets must hold Toolset classes, got {toolset!r}")
        for key, value in _toolset_members(toolset).items():
            if key in env_class.__dict__ and key not in owners:
                continue  # the environment's own definition overrides
            current = inspect.getattr_static(env_class, key, _MISSING)
            if current is value:  # the same member: from a base two toolsets share, or inherited
                owners.setdefault(key, toolset)
            elif key in owners:
                raise TypeError(f"{env_class.__name__}: toolsets {owners[key].__name__} and {toolset.__name__} both define {key!r}")
            elif current is not _MISSING:
                raise TypeError(f"{env_class.__name__}: toolset {toolset.__name__} defines {key!r}, which the environment already has")
            else:
                owners[key] = toolset
                setattr(env_class, key, value)


def _check_resume(env_class: type[Environment]) -> None:
    """Raise TypeError for an unknown resume kind, or `snapshot` without both hooks."""
    kind = env_class.resume
    if kind not in typing.get_args(ResumeKind):
        raise TypeError(f"{env_class.__name__}.resume must be one of {typing.get_args(ResumeKind)}, got {kind!r}")
    if kind == "snapshot" and (env_class.snapshot is Environment.snapshot or env_class.restore is Environment.restore):
        raise TypeError(f"{env_class.__name__} declares resume = 'snapshot' but does not define both snapshot() and restore()")


def _validation_problems(error: pydantic.ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in error.errors())


class Environment:
    """Base class of an environment. Subclass it, add `@tool` methods and `verify`.

    Class attributes describe the environment; an instance is one rollout's session.
    An environment that can generate its own task rows defines the optional classmethod
    `prepare_rows(cls, *, split: str, size: int, seed: int, **options) -> list[dict]`
    (`gym-bridge data prepare` calls it; equal arguments must give equal rows).
    """

    name: ClassVar[str] = ""
    """The routing name rows use (`agent_ref.name`, `environment`, ...)."""
    description: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    """Other routing names, e.g. the NeMo Gym agent names of compatible datasets."""
    example_data: ClassVar[Path | None] = None
    tool_timeout_s: ClassVar[float] = 30.0
    """Bound on each tool call, setup and close; past it the rollout fails as `env`."""
    inline_sync_tools: ClassVar[bool] = False
    """Run sync tools on the event loop instead of a worker thread. Only for quick, pure tools:
    it saves a thread hop per call, but a sync tool that hangs can then not be interrupted."""
    verify_timeout_s: ClassVar[float] = 60.0
    isolate_tools: ClassVar[bool] = False
    """Run `setup`, the tools, `verify` and `close` in a worker process (`gym_bridge.run_in_process`'s
    pool): a call that exits, segfaults or hangs then fails only its rollout (as `env` or
    `verifier`), and a hung call's worker is killed. The session travels to the worker and back
    with each call, so its state must pickle; the pool runs at most
    `gym_bridge.core.bounded.offload.set_pool_size(n)` calls at once (default 2), and recycles a worker
    after 1000 calls or above 2048 MiB resident (`gym_bridge.core.bounded.offload.set_worker_limits`)."""
    settings: ClassVar[tuple[str, ...]] = ()
    """Class attributes a user may change for a run: `configure(name, key=value)` or
    `gym-bridge eval --env-setting NAME.KEY=VALUE` (the timeouts above always may be)."""
    tools_from_row: ClassVar[bool] = False
    """The tools are the row's own schemas (`responses_create_params.tools`), run by
    `call_row_tool` instead of `@tool` methods (environments behind HTTP)."""
    row_schema: ClassVar[type[pydantic.BaseModel] | None] = None
    """Pydantic model of the verifier fields a row needs (extra fields allowed); checked by
    `validate_row`, hence by `gym-bridge data validate`. None: any row is accepted."""
    toolsets: ClassVar[tuple[type[Toolset], ...]] = ()
    """Toolset classes whose `@tool` methods (and helpers) this environment includes."""
    resume: ClassVar[ResumeKind] = "restart"
    """How a session comes back when a killed run resumes a rollout mid-episode (`gym_bridge.core.resume`):
    `snapshot` (`snapshot()` at each turn boundary, `restore(task, state)` instead of `setup`; for state changed only
    by tools), `replay` (the logged tool calls run again in a fresh session, each output checked; for deterministic
    tools), `restart` (from turn 0; the default)."""
    snapshot_version: ClassVar[int] = 1
    """Version of what `snapshot` returns; a journal saved under another version restarts its rollouts from turn 0."""
    max_snapshot_bytes: ClassVar[int] = 8 * 1024 * 1024
    """Largest `snapshot()` state, as JSON, a commit journals (a changed state is journaled whole, an unchanged one not
    again); a larger one fails the rollout as `env`, naming `snapshot()`."""

    _tool_specs: ClassVar[dict[str, ToolSpec] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _include_toolsets(cls)
        _check_resume(cls)

    @classmethod
    def tool_specs(cls) -> dict[str, ToolSpec]:
        """The environment's tools by name, derived once per class."""
        specs: dict[str, ToolSpec]
        if cls.__dict__.get("_tool_specs") is None:
            specs = {}
            for attr in dir(cls):
                member = getattr(cls, attr, None)
                if callable(member) and getattr(member, "__gym_bridge_tool__", False):
                    specs[attr] = tool_spec(member, name=attr)
            cls._tool_specs = specs
        specs = cls.__dict__["_tool_specs"]
        return specs

    @classmethod
    def tool_arguments(cls, name: str, args: str | Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments a call of tool `name` with `args` (a JSON object, as text or
        parsed) runs with, validated against the tool's schema (a row tool's: any object).

        Raises ToolError naming the problem: an unknown tool, arguments that are not valid.
        """
        spec = cls.tool_specs().get(name)
        if spec is None:
            if not cls.tools_from_row:
                raise ToolError(f"unknown tool {name!r}; available tools: {sorted(cls.tool_specs())}")
            try:
                arguments = (json.loads(args) if args.strip() else {}) if isinstance(args, str) else args
            except ValueError as error:
                raise ToolError(f"invalid arguments for {name}: not JSON ({error})") from None
            if not isinstance(arguments, Mapping):
                raise ToolError(f"invalid arguments for {name}: must be a JSON object")
            return dict(arguments)
        try:
            model = spec.arguments_model
            parsed = model.model_validate_json(args) if isinstance(args, str) else model.model_validate(args)
        except pydantic.ValidationError as error:
            raise ToolError(f"invalid arguments for {name}: {_validation_problems(error)}") from None
        return parsed.model_dump()

    def call_tool(self, name: str, args: str | Mapping[str, Any]) -> Any:
        """Run tool `name` of this session with `args` (a JSON object, as text or parsed), checked
        by `tool_arguments` first; a row tool (`tools_from_row`) goes to `call_row_tool`.

        Returns what the tool returns (for an async tool, an awaitable). Raises ToolError for an
        unknown tool or invalid arguments (the model reads it), and whatever the tool raises.
        """
        arguments = self.tool_arguments(name, args)
        if name not in self.tool_specs():
            return self.call_row_tool(name, **arguments)
        return getattr(self, name)(**arguments)

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        """Problems with the verifier fields of a row routed here ([] when it is fine).

        The default checks `row_schema`; override it (calling super) for checks a schema
        cannot express, such as an expected answer that must be one of the options.
        """
        return schema_problems(cls.row_schema, row) if cls.row_schema is not None else []

    @classmethod
    def trust_problems(cls, row: dict[str, Any], trust: TrustSettings) -> list[RowProblem]:
        """What of a row routed here the run's `trust` does not let run ([] when nothing). The default refuses
        nothing; an environment whose rows can name code to run (a harness's command) checks it here."""
        return []

    def setup(self, task: Task) -> Any:
        """Prepare the session for `task` (may be async). Default: nothing."""

    def verify(self, task: Task, output: list[Item]) -> VerifyResult | float | Awaitable[VerifyResult | float]:
        """Score a finished trajectory (may be async). `output` is the Responses output list."""
        raise NotImplementedError(f"environment {self.name!r} does not implement verify")

    def close(self) -> Any:
        """Release the session's resources (may be async). Called even when the rollout failed."""

    def episode_ended(self) -> bool:
        """Whether the environment has ended the episode (a game won or lost, a server's `done`): the default
        loop checks it after each turn's tool calls and finishes with `answer`. Default: never."""
        return False

    def snapshot(self) -> Any:
        """The session's state as JSON-able data, taken at a turn boundary (only with `resume = "snapshot"`; runs in a
        worker thread under `tool_timeout_s`)."""
        raise NotImplementedError(f"environment {self.name!r} declares no snapshot")

    def restore(self, task: Task, state: Any) -> Any:
        """Make this new session the one `snapshot` saw, instead of `setup(task)` (only with `resume = "snapshot"`; may be async)."""
        raise NotImplementedError(f"environment {self.name!r} declares no restore")

    def call_row_tool(self, tool_name: str, /, **arguments: Any) -> Any:
        """Run a tool the row declares (only with `tools_from_row`); may be async. Returns what a
        `@tool` returns and raises what it raises (`ToolError` for the model to read)."""
        raise NotImplementedError(f"environment {self.name!r} has no row tools")

    @classmethod
    def check_ready(cls) -> None:
        """Raise `GymBridgeError` saying what to install or set when the environment cannot run on
        this machine (a missing sandbox). Called once per run before the first rollout."""
