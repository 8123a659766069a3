"""OpenEnv servers for the tests, written with openenv's own framework and run in OpenEnv's venv (not collected).

`calc_app`: an MCP environment (FastMCP tools `add`, `multiply`, `submit_answer`) whose question comes from the
reset seed (a = seed + 2, b = seed + 3: "what is a * b + a?"); `submit_answer` ends the episode with reward 1.0
when right, else 0.0. `faulty_app`: a simulation environment whose `command` action `ok` gives reward 0.5,
`finish` ends with 1.0, `crash` raises in the environment and `hang` never returns. `app` serves them all, with the example server, in one process, and `POST /reference` runs OpenEnv's own client
loop on plays it is sent (`openenv_reference.py`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from fastmcp import FastMCP
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route
from openenv.core.env_server import Action, CallToolAction, CallToolObservation, Environment, MCPEnvironment, Observation, State, create_app


OPEN_SESSIONS = {"calc": 0, "faulty": 0}
"""Environment instances made and not yet closed, per environment (`GET /open_sessions`)."""


class CalcEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        OPEN_SESSIONS["calc"] += 1
        mcp = FastMCP("calc")

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two whole numbers."""
            return a + b

        @mcp.tool()
        def multiply(a: int, b: int) -> int:
            """Multiply two whole numbers."""
            return a * b

        @mcp.tool()
        def submit_answer(answer: int) -> str:
            """Submit the final answer; ends the episode."""
            return f"submitted {answer}"

        super().__init__(mcp)
        self._state = State(step_count=0)
        self._expected = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        a, b = (seed or 0) + 2, (seed or 0) + 3
        self._expected = a * b + a
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"question": f"What is {a} * {b} + {a}?"})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and isinstance(observation, CallToolObservation) and observation.error is None:
            if action.tool_name == "submit_answer":
                observation.reward = 1.0 if action.arguments.get("answer") == self._expected else 0.0
                observation.done = True
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    def close(self) -> None:
        OPEN_SESSIONS["calc"] -= 1
        super().close()

    @property
    def state(self) -> State:
        return self._state


class CommandAction(Action):
    command: str


class CommandObservation(Observation):
    echo: str = ""


class FaultyEnvironment(Environment[CommandAction, CommandObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        OPEN_SESSIONS["faulty"] += 1
        self._state = State(step_count=0)

    def close(self) -> None:
        OPEN_SESSIONS["faulty"] -= 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CommandObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return CommandObservation(echo="ready")

    def step(self, action: CommandAction, timeout_s: float | None = None, **kwargs: Any) -> CommandObservation:
        self._state.step_count += 1
        if action.command == "crash":
            raise RuntimeError("the environment crashed on purpose")
        if action.command == "hang":
            time.sleep(3600)
        if action.command == "finish":
            return CommandObservation(echo="finish", done=True, reward=1.0)
        return CommandObservation(echo=action.command, reward=0.5)

    @property
    def state(self) -> State:
        return self._state


calc_app = create_app(CalcEnvironment, CallToolAction, CallToolObservation, env_name="calc", max_concurrent_envs=64)
faulty_app = create_app(FaultyEnvironment, CommandAction, CommandObservation, env_name="faulty", max_concurrent_envs=64)


def _all_apps() -> Starlette:
    """The example server and the two above in one process (each under its own path), so the tests start one."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from example_server import app as guess_app

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "healthy"})

    async def open_sessions(request: Request) -> JSONResponse:
        return JSONResponse(OPEN_SESSIONS)

    async def reference(request: Request) -> JSONResponse:
        """OpenEnv's own client loop on the posted plays (`openenv_reference.py`), run here to spare the tests a second
        start of OpenEnv's venv; its clients talk to this server over loopback like any other client."""
        from openenv_reference import main as play

        plays = await request.json()
        return JSONResponse({"rewards": await asyncio.to_thread(lambda: [play(spec) for spec in plays])})

    return Starlette(routes=[Route("/health", health), Route("/open_sessions", open_sessions), Route("/reference", reference, methods=["POST"]), Mount("/guess", guess_app), Mount("/calc", calc_app), Mount("/faulty", faulty_app)])


app = _all_apps()
