"""A NeMo Gym resources server for trying and testing nemo_gym_remote: the `example_single_tool_call` weather tool.

It speaks the resources-server protocol as NeMo Gym 0.7 serves it: `POST /seed_session` (the
row, or a typed `{resources_session_id, episode_id, task_id, task_data}`), `POST /get_weather`,
`POST /verify` (the row plus `response`; reward 1.0 iff the trajectory calls `get_weather`),
`POST /close_session`, a session cookie set on every answer, and FastAPI's 422 for bad bodies.
It also reports what it saw of each session (`session_tool_calls`), so tests can check cookies.

    python -m environments.nemo_gym_remote.example_server --port 8000
    gym-bridge eval --env nemo_gym_remote --env-url nemo_gym_remote=http://127.0.0.1:8000 --limit 4
"""

import argparse
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

SESSION_COOKIE = "SimpleWeatherResourcesServer___example_single_tool_call"


@dataclass
class SessionState:
    tool_calls: int = 0
    seeded: bool = False


@dataclass
class ServerState:
    sessions: dict[str, SessionState] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)
    """Paths in the order they were requested."""


class GetWeatherRequest(BaseModel):
    city: str


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any]
    response: dict[str, Any]


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    resources_session_id: str
    episode_id: dict[str, Any]


def build_app(state: ServerState | None = None) -> FastAPI:
    """The FastAPI app; `state` (shared with the caller, for tests) holds the sessions."""
    state = state or ServerState()
    app = FastAPI()

    @app.middleware("http")
    async def session_cookie(request: Request, call_next):  # type: ignore[no-untyped-def]
        session_id = request.cookies.get(SESSION_COOKIE) or str(uuid.uuid4())
        request.state.session = state.sessions.setdefault(session_id, SessionState())
        state.requests.append(request.url.path)
        response: Response = await call_next(request)
        response.set_cookie(SESSION_COOKIE, session_id, path="/", httponly=True, samesite="lax")
        return response

    @app.post("/seed_session")
    async def seed_session(request: Request, body: dict[str, Any]) -> Response:
        request.state.session.seeded = True
        if set(body) == {"resources_session_id", "episode_id", "task_id", "task_data"}:
            if body["resources_session_id"] in state.closed:
                return JSONResponse({"detail": "session already closed"}, status_code=400)
            return JSONResponse({"resources_session_id": body["resources_session_id"]})
        return JSONResponse({})

    @app.post("/get_weather")
    async def get_weather(request: Request, body: GetWeatherRequest) -> dict[str, str]:
        request.state.session.tool_calls += 1
        return {"city": body.city, "weather_description": f"The weather in {body.city} is cold."}

    @app.post("/verify")
    async def verify(request: Request, body: VerifyRequest) -> dict[str, Any]:
        output = body.response.get("output") or []
        called = any(item.get("type") == "function_call" and item.get("name") == "get_weather" for item in output)
        session: SessionState = request.state.session
        return {
            **body.model_dump(), "reward": float(called), "mask_sample": False, "failure_kind": None, "failure_reason": None,
            "session_tool_calls": session.tool_calls, "session_seeded": session.seeded,
        }

    @app.post("/close_session")
    async def close_session(body: CloseRequest) -> dict[str, str]:
        state.closed.add(body.resources_session_id)
        return {"resources_session_id": body.resources_session_id}

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(build_app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
