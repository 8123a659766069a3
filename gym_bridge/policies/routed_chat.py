"""A chat policy over several servers of one model: each call of a rollout goes where its first call went.

NeMo RL runs one vLLM server per replica and `gym-bridge serve` talks to all of them through chat completions
with token ids. `RoutedChatPolicy` holds one `ChatAPIPolicy` per server and asks the project's one routing rule
(`gym_bridge.policies.router.ReplicaRouter`) which one answers each call: a rollout stays on its server (its prefix
cache), a new one starts on the least busy. Without a model name it serves the first model the first server lists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from gym_bridge.core.errors import BackendAnswerError, ConfigError
from gym_bridge.core.policy import ChatRequest
from gym_bridge.core.turn import Turn
from gym_bridge.policies.chat_api import ChatAPIPolicy
from gym_bridge.policies.discovery import served_models
from gym_bridge.policies.http import normalize_base_url
from gym_bridge.policies.router import ReplicaRouter

MODEL_LOOKUP_TIMEOUT_S = 30.0
"""The most one asks a server which model it serves (when no name was given), within the call timeout."""


class RoutedChatPolicy:
    """Implements `ChatPolicy` over `base_urls`, one `ChatAPIPolicy(**chat_options)` per server, routed per session."""

    def __init__(self, base_urls: Sequence[str], *, model: str | None = None, api_key: str | None = None,
                 **chat_options: Any) -> None:
        """`chat_options`: what each server's `ChatAPIPolicy` gets besides its model and URL (`token_ids`,
        `request_timeout_s`, `max_retries`, ...)."""
        if not base_urls:
            raise ConfigError("a routed chat policy needs at least one base URL")
        self.base_urls = [normalize_base_url(url) for url in base_urls]
        self.model_name = model
        """The served model's name (asked from the first server on the first call when not given)."""
        self.router = ReplicaRouter(self.base_urls)
        """Which server each call goes to."""
        self._api_key = api_key
        self._chat_options = chat_options
        self._replicas: list[ChatAPIPolicy] | None = None
        self._lock = asyncio.Lock()

    async def _servers(self) -> list[ChatAPIPolicy]:
        """One `ChatAPIPolicy` per server, made on the first call (once the model's name is known)."""
        if self._replicas is None:
            async with self._lock:
                if self._replicas is None:
                    model = self.model_name or await self._first_served_model()
                    self.model_name = model
                    self._replicas = [ChatAPIPolicy(model=model, base_url=url, api_key=self._api_key, **self._chat_options)
                                      for url in self.base_urls]
        return self._replicas

    async def _first_served_model(self) -> str:
        timeout_s = min(float(self._chat_options.get("request_timeout_s", MODEL_LOOKUP_TIMEOUT_S)), MODEL_LOOKUP_TIMEOUT_S)
        models = await served_models(self.base_urls[0], api_key=self._api_key, timeout_s=timeout_s)
        if not models:
            raise BackendAnswerError(f"{self.base_urls[0]} serves no model")
        return str(models[0]["id"])

    async def chat(self, request: ChatRequest) -> Turn:
        """One turn from the session's server (`ReplicaRouter.choose`); raises what that server's policy raises."""
        servers = await self._servers()
        server = self.router.choose(request.session_id)
        self.router.started(server)
        ok = False
        try:
            turn = await servers[server].chat(request)
            ok = True
        finally:
            self.router.finished(server, ok=ok)
        return turn

    async def aclose(self) -> None:
        for policy in self._replicas or []:
            await policy.aclose()
