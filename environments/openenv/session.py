"""One OpenEnv session over its WebSocket (`/ws`): reset, step, state, MCP requests, close.

OpenEnv's server gives each WebSocket connection an environment instance of its own, so one connection
is one episode. Messages are `{"type": "reset" | "step" | "state" | "mcp" | "close", "data": ...}`; the
server answers `observation` (`{"observation", "reward", "done"}`), `state`, `mcp` (a JSON-RPC answer) or
`error` (`{"message", "code"}`). Every wait is bounded by `timeout_s`; an error the action caused
(`VALIDATION_ERROR`) is a `ToolError` the model reads, anything else from the server is `OpenEnvError`.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from gym_bridge import RolloutError, ToolError


class OpenEnvError(RolloutError):
    """The OpenEnv server is down, failed, or answered something that is not its protocol."""

    failure_kind = "env"


@dataclass(frozen=True)
class StepResult:
    """What the server answered a reset or a step: the observation, its reward (None: none given), done."""

    observation: dict[str, Any]
    reward: float | None
    done: bool


def ws_url(base_url: str) -> str:
    """The session WebSocket of the server at `base_url` (http -> ws, https -> wss)."""
    base = base_url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://"):] + "/ws"
    if base.startswith("http://"):
        return "ws://" + base[len("http://"):] + "/ws"
    raise OpenEnvError(f"OpenEnv server URL must start with http:// or https://, got {base_url!r}")


class OpenEnvSession:
    """An open `/ws` connection to one OpenEnv server; `await OpenEnvSession.open(url, timeout_s=...)`."""

    def __init__(self, http: aiohttp.ClientSession, socket: aiohttp.ClientWebSocketResponse, url: str, timeout_s: float) -> None:
        self._http = http
        self._socket = socket
        self.url = url
        self.timeout_s = timeout_s
        self._ids = itertools.count(1)

    @classmethod
    async def open(cls, base_url: str, *, timeout_s: float) -> OpenEnvSession:
        """Connect; raises OpenEnvError naming the URL when nothing answers there or it is not an OpenEnv server."""
        url = ws_url(base_url)
        http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_connect=timeout_s))
        try:
            socket = await http.ws_connect(url, heartbeat=None, max_msg_size=64 << 20)
        except aiohttp.WSServerHandshakeError as error:
            await http.close()
            raise OpenEnvError(f"{url} is not an OpenEnv session endpoint (HTTP {error.status} to the WebSocket handshake)") from None
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            await http.close()
            raise OpenEnvError(f"no OpenEnv server at {base_url}: {type(error).__name__}: {error or 'no answer'}") from None
        return cls(http, socket, url, timeout_s)

    @property
    def closed(self) -> bool:
        """Whether the WebSocket and its HTTP session are closed."""
        return self._socket.closed and self._http.closed

    async def reset(self, **kwargs: Any) -> StepResult:
        """Start the episode (`seed`, `episode_id` and the environment's own reset arguments)."""
        return to_step_result(await self._request("reset", kwargs, expect="observation"))

    async def step(self, action: dict[str, Any]) -> StepResult:
        """One action; raises ToolError when the server rejects the action as invalid."""
        return to_step_result(await self._request("step", action, expect="observation"))

    async def state(self) -> dict[str, Any]:
        return await self._request("state", {}, expect="state")

    async def mcp(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """One MCP JSON-RPC request on this session (`tools/list`, `tools/call`); its `result`."""
        request = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}}
        answer = await self._request("mcp", request, expect="mcp")
        if answer.get("error"):
            raise OpenEnvError(f"MCP {method} failed: {answer['error'].get('message', answer['error'])}")
        return answer.get("result")

    async def close(self) -> None:
        """Say `close`, then drop the connection; never raises (the server ends the episode either way)."""
        try:
            if not self._socket.closed:
                await self._socket.send_str(json.dumps({"type": "close"}))
                await self._socket.close()
        except (aiohttp.ClientError, OSError, RuntimeError):
            pass
        finally:
            await self._http.close()

    async def _request(self, kind: str, data: dict[str, Any], *, expect: str) -> dict[str, Any]:
        try:
            await self._socket.send_str(json.dumps({"type": kind, "data": data}))
            message = await self._socket.receive(timeout=self.timeout_s)
        except TimeoutError:
            raise OpenEnvError(f"{self.url}: no answer to {kind!r} within {self.timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError, RuntimeError) as error:
            raise OpenEnvError(f"{self.url}: {kind!r} failed: {type(error).__name__}: {error}") from None
        return parse_answer(message, kind=kind, expect=expect, url=self.url)


def parse_answer(message: aiohttp.WSMessage, *, kind: str, expect: str, url: str) -> dict[str, Any]:
    """The `data` of an answer of type `expect`; raises ToolError (an invalid action) or OpenEnvError."""
    if message.type is not aiohttp.WSMsgType.TEXT:
        raise OpenEnvError(f"{url}: the connection ended instead of answering {kind!r} ({message.type.name})")
    try:
        answer = json.loads(message.data)
    except ValueError:
        raise OpenEnvError(f"{url}: answered {kind!r} with text that is not JSON: {message.data[:200]!r}") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
        raise OpenEnvError(f"{url}: answered {kind!r} with JSON that is not an OpenEnv message: {message.data[:200]!r}")
    data: dict[str, Any] = answer["data"]
    if answer.get("type") == "error":
        if data.get("code") == "VALIDATION_ERROR":
            raise ToolError(f"invalid action: {json.dumps(data.get('errors', data.get('message')), default=str)[:1000]}")
        raise OpenEnvError(f"the OpenEnv environment failed on {kind!r} ({data.get('code')}): {data.get('message')}")
    if answer.get("type") != expect:
        raise OpenEnvError(f"{url}: answered {kind!r} with a {answer.get('type')!r} message, expected {expect!r}")
    return data


def to_step_result(data: dict[str, Any]) -> StepResult:
    """An `observation` answer as a StepResult; raises OpenEnvError for a reward that is not a number."""
    reward = data.get("reward")
    if reward is not None and not isinstance(reward, (bool, int, float)):  # OpenEnv allows a bool reward
        raise OpenEnvError(f"the OpenEnv environment gave a reward that is not a number: {reward!r}")
    observation = data.get("observation")
    return StepResult(observation=observation if isinstance(observation, dict) else {}, reward=None if reward is None else float(reward),
                      done=bool(data.get("done", False)))
