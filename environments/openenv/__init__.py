"""openenv: any OpenEnv environment server as a gym_bridge environment, one OpenEnv session per rollout.

The server is the row's `openenv.url`, the `base_url` setting, or the `server_app` gym_bridge starts in OpenEnv's venv
(`server.py`). Each rollout opens the session WebSocket, resets with the row's `openenv.reset`, and closes on every
path. Simulation mode: the action schema is one tool, `act`; MCP mode: the server's tools. The episode ends when the
server says `done`; the reward is the last one a step reported, as OpenEnv's own harness takes it (README.md).
"""

from __future__ import annotations

import asyncio
import functools
import json
import subprocess
from pathlib import Path
from typing import Any, ClassVar, Literal

import pydantic

from gym_bridge import ConfigError, Environment, FailRollout, Item, MissingExtraError, RolloutContext, Task, ToolError, VerifyResult

from environments.openenv.rows import build_rows
from environments.openenv.server import ServerSpec, server_url
from environments.openenv.session import OpenEnvError, OpenEnvSession, StepResult

STEP_TOOL = "act"
"""The one tool of a simulation-mode environment: its arguments are the action."""
HERE = Path(__file__).resolve().parent
DEFAULT_PYTHON = HERE.parents[1] / ".venv-openenv" / "bin" / "python"
INSTALL = ("make openenv-venv (in a gym_bridge checkout; it runs: python3 -m venv .venv-openenv && "
           ".venv-openenv/bin/pip install openenv==0.10.0), or set openenv.server_python to a python that has openenv")


@functools.lru_cache(maxsize=None)
def has_openenv(python: str) -> bool:
    """Whether `python` exists and can import openenv (asked once per interpreter path)."""
    probe = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('openenv') is None)"]
    try:
        return Path(python).exists() and subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class OpenEnvRow(pydantic.BaseModel):
    """The `openenv` field of a row."""

    model_config = pydantic.ConfigDict(extra="forbid")
    url: str | None = None
    """The server (http://host:port); default: the environment's `base_url` setting, else the server it starts."""
    mode: Literal["simulation", "mcp"] = "simulation"
    reset: dict[str, Any] = {}
    """Keyword arguments of `reset` (`seed`, `episode_id`, the environment's own)."""


class RowSchema(pydantic.BaseModel):
    openenv: OpenEnvRow = OpenEnvRow()


class OpenEnvLoop:
    """The tool-calling loop, which also ends when the OpenEnv episode is done (finish reason `answer`)."""

    async def run(self, ctx: RolloutContext) -> str:
        env = ctx.env
        assert isinstance(env, OpenEnvEnvironment)
        for turn in range(ctx.limits.max_turns):
            step = await ctx.generate()
            if step is None:
                return "budget"
            if step.finish_reason == "length":
                return "length"
            if not step.calls:
                return "answer"
            outputs = [await ctx.call_tool(call) for call in step.calls]
            if env.done:
                return "answer"
            if turn == ctx.limits.max_turns - 1:
                return "max_turns"
            if not await ctx.append_tool_outputs_async(outputs):
                return "budget"
        return "max_turns"


class OpenEnvEnvironment(Environment):
    name = "openenv"
    description = "Any OpenEnv environment server (simulation: the action is one `act` tool; MCP: the server's tools); OpenEnv's reward."
    if not DEFAULT_PYTHON.exists():
        description += " Its example server needs OpenEnv's venv: make openenv-venv."
    example_data = HERE / "data" / "example.jsonl"
    row_schema = RowSchema
    tools_from_row = True
    agent_loop = OpenEnvLoop()
    settings = ("base_url", "server_app", "server_app_dir", "server_python", "start_timeout_s", "request_timeout_s")
    tool_timeout_s: ClassVar[float] = 30.0
    base_url: ClassVar[str | None] = None
    """The server for rows without `openenv.url`; when None, gym_bridge starts `server_app`."""
    server_app: ClassVar[str] = "example_server:app"
    """`module:attribute` of the OpenEnv server's ASGI app (what `create_app` returned), run with uvicorn; "": none."""
    server_app_dir: ClassVar[str] = str(HERE)
    """The folder `server_app`'s module is imported from."""
    server_python: ClassVar[str | None] = None
    """The python that runs the server (has openenv installed); default: the checkout's `.venv-openenv`."""
    start_timeout_s: ClassVar[float] = 60.0
    request_timeout_s: ClassVar[float] = 25.0
    """Bound on each answer of the session (below `tool_timeout_s`, so a hung step is reported as such)."""

    # -- the run -------------------------------------------------------------------------------

    @classmethod
    def check_ready(cls) -> None:
        """A server to start needs OpenEnv's venv (rows that all name their `openenv.url`: set `server_app` to "")."""
        if cls.base_url is None and cls.server_app:
            cls.server_spec()

    @classmethod
    def server_spec(cls) -> ServerSpec:
        """What runs the server gym_bridge starts; raises MissingExtraError when that python lacks openenv."""
        python = cls.server_python or str(DEFAULT_PYTHON)
        if not has_openenv(python):
            raise MissingExtraError(f"the openenv environment starts its OpenEnv server with {python}, which has no openenv: {INSTALL}")
        return ServerSpec(python=python, app=cls.server_app, app_dir=cls.server_app_dir)

    # -- the session ---------------------------------------------------------------------------

    async def setup(self, task: Task) -> None:
        self.row = RowSchema.model_validate(task.row).openenv
        self.done = False
        self.rewards: list[float] = []
        self.session: OpenEnvSession | None = None
        try:
            self.session = await OpenEnvSession.open(await self._url(), timeout_s=self.request_timeout_s)
            await self._start(task)
        except (OpenEnvError, ToolError) as error:
            raise FailRollout("env", f"OpenEnv setup: {error}") from None

    async def _url(self) -> str:
        if self.row.url or self.base_url:
            return str(self.row.url or self.base_url)
        if not self.server_app:
            raise OpenEnvError("no server for this row: give it openenv.url, or set openenv.base_url or openenv.server_app")
        return await server_url(type(self).server_spec(), start_timeout_s=self.start_timeout_s)

    async def _start(self, task: Task) -> None:
        assert self.session is not None
        first = await self.session.reset(**self.row.reset)
        self.done = first.done
        if self.row.mode == "mcp":
            offered = {tool["name"] for tool in (await self.session.mcp("tools/list") or {}).get("tools", [])}
            missing = sorted({schema["name"] for schema in task.tools or ()} - offered)
            if missing:
                raise OpenEnvError(f"the row's tools {missing} are not tools of the server (it offers {sorted(offered)}): rebuild the rows")

    async def call_row_tool(self, tool_name: str, /, **arguments: Any) -> str:
        """One step of the episode; the observation (with reward and done) is what the model reads."""
        if self.done:
            raise ToolError("the episode is over; answer without calling a tool")
        if self.row.mode == "simulation" and tool_name != STEP_TOOL:
            raise ToolError(f"unknown tool {tool_name!r}; the action is the arguments of {STEP_TOOL!r}")
        action = arguments if self.row.mode == "simulation" else {"type": "call_tool", "tool_name": tool_name, "arguments": arguments}
        assert self.session is not None
        result = await self.session.step(action)
        self.done = result.done
        if result.reward is not None:
            self.rewards.append(result.reward)
        return json.dumps(self._shown(result), default=str)

    def _shown(self, result: StepResult) -> dict[str, Any]:
        observation = {key: value for key, value in result.observation.items() if value or key != "metadata"}
        if self.row.mode == "mcp":
            error = observation.get("error")
            if error:
                raise ToolError(str(error.get("message", error) if isinstance(error, dict) else error))
            answer = observation.get("result")
            observation = {"result": answer.get("data", answer) if isinstance(answer, dict) else answer}
        return {"observation": observation, "reward": result.reward, "done": result.done}

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        reward = self.rewards[-1] if self.rewards else 0.0
        return VerifyResult(reward=reward, metrics={"episode_done": self.done, "steps_rewarded": len(self.rewards)})

    async def close(self) -> None:
        session = getattr(self, "session", None)
        if session is not None:
            await session.close()

    # -- rows ----------------------------------------------------------------------------------

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int, mode: str = "simulation", **options: Any) -> list[dict[str, Any]]:
        """Rows made from the server (`base_url`, else the one gym_bridge starts): reset seeds `seed`, `seed + 1`, ...
        (plus 100,000 for the validation split). `mode`: `simulation` or `mcp`."""
        if options:
            raise ConfigError(f"openenv rows take only the option `mode`, not {sorted(options)}")
        seeds = [seed + (100_000 if split == "validation" else 0) + offset for offset in range(size)]

        async def build() -> list[dict[str, Any]]:
            url = cls.base_url or await server_url(cls.server_spec(), start_timeout_s=cls.start_timeout_s)
            return await build_rows(url, mode=mode, seeds=seeds, env_name=cls.name, tool_name=STEP_TOOL, timeout_s=cls.request_timeout_s)

        return asyncio.run(build())
