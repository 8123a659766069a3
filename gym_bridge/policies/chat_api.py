"""A `ChatPolicy` over hosted chat APIs: OpenAI chat completions or the Responses API (`openai` package).

For evaluation only. These APIs return text, not the sampled token ids and their log-probs, so
records of its rollouts have empty token lists and training refuses it
(`gym_bridge.core.policy.require_token_policy`). The conversation arrives as chat messages;
for the Responses API, assistant tool calls become `function_call` items and tool messages
`function_call_output` items, and the answer's items are read back the same way. The `openai`
client retries connection errors, 429 and 5xx (`max_retries`, exponential backoff); on top of
that every call is bounded in total, so a dead endpoint fails the rollout as `infra`.

With `token_ids=True` (chat completions only) it speaks NeMo RL's OpenAI-compatible server, as
NeMo Gym's model servers do: it asks for `logprobs`, `top_logprobs=0` and
`return_tokens_as_token_ids`, reads `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs` off the answer's message, and sends them back on that assistant message in
later calls, from which the server keeps the prompt's prefix exact. Those records can train.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import Any, Literal

from gym_bridge.core.dialects.chat import chat_request, chat_turn_from_completion
from gym_bridge.core.dialects.responses import chat_turn_from_response, responses_request
from gym_bridge.core.policy import ChatRequest, SamplingParams
from gym_bridge.core.turn import Turn
from gym_bridge.core.errors import ContextOverflowError, BackendAnswerError, MissingExtraError
from gym_bridge.policies.http import CONTEXT_OVERFLOW_PATTERN, RequestTimeoutError

ChatApi = Literal["chat", "responses"]


class ChatAPIPolicy:
    """Implements `ChatPolicy` with `openai.AsyncOpenAI` (one client per event loop).

    Sampling: temperature and top-p are sent as given; `top_k` (not an OpenAI parameter) only
    when set, in the request body for servers that know it (vLLM). The Responses API has no stop
    strings or seed: stop strings are applied to the text afterwards, and the seed is not sent.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api: ChatApi = "chat",
        api_key: str | None = None,
        request_timeout_s: float = 120.0,
        max_retries: int = 3,
        extra_body: Mapping[str, Any] | None = None,
        token_ids: bool = False,
    ) -> None:
        """`base_url` None means OpenAI's; `api_key` None is sent as "EMPTY" (local servers need none);
        `token_ids` asks for and requires each call's token ids (see the module docstring)."""
        if api not in ("chat", "responses"):
            raise ValueError(f"api must be 'chat' or 'responses', got {api!r}")
        if token_ids and api != "chat":
            raise ValueError("token_ids=True needs api='chat' (NeMo RL's chat-completions endpoint)")
        self.token_ids = token_ids
        try:
            import openai  # noqa: F401
        except ImportError:  # pragma: no cover - openai is a dependency

            raise MissingExtraError("ChatAPIPolicy needs the openai package: pip install openai") from None
        self.model = model
        self.base_url = base_url
        self.api: ChatApi = api
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.extra_body = dict(extra_body or {})
        self._api_key = api_key or "EMPTY"
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    @property
    def max_call_s(self) -> float:
        """The longest one `chat` call can take (all retries and the client's backoff included)."""
        return (self.max_retries + 1) * (self.request_timeout_s + 8.0)

    def _openai(self) -> Any:
        """The `openai.AsyncOpenAI` client of the running event loop (each loop gets its own)."""
        import openai

        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = openai.AsyncOpenAI(
                api_key=self._api_key, base_url=self.base_url, timeout=self.request_timeout_s, max_retries=self.max_retries
            )
            self._clients[loop] = client
        return client

    async def chat(self, request: ChatRequest) -> Turn:
        """One assistant turn. Raises `ContextOverflowError` when the API says the conversation does
        not fit, `BackendError` for everything else that goes wrong (after the client's retries)."""
        import openai

        try:
            async with asyncio.timeout(self.max_call_s):
                if self.api == "chat":
                    return await self._chat_completions(request)
                return await self._responses(request)
        except TimeoutError:
            raise RequestTimeoutError(f"{self.api} API call did not finish within {self.max_call_s:g} s") from None
        except openai.BadRequestError as error:
            message = _message(error)
            if getattr(error, "code", None) == "context_length_exceeded" or CONTEXT_OVERFLOW_PATTERN.search(message):
                raise ContextOverflowError(message) from None
            raise BackendAnswerError(f"{self.api} API rejected the request (400): {message}") from None
        except openai.APIStatusError as error:
            raise BackendAnswerError(f"{self.api} API answered HTTP {error.status_code}: {_message(error)}") from None
        except openai.APIError as error:  # connection errors, timeouts, undecodable answers
            raise BackendAnswerError(f"{self.api} API: {type(error).__name__}: {error}") from None

    async def _chat_completions(self, request: ChatRequest) -> Turn:
        sampling = request.sampling
        params = chat_request(request, model=self.model)
        extra = self._extra_body(sampling)
        if self.token_ids:
            params["logprobs"], params["top_logprobs"] = True, 0
            extra["return_tokens_as_token_ids"] = True
        if extra:
            params["extra_body"] = extra
        completion = await self._openai().chat.completions.create(**params)
        turn = chat_turn_from_completion(_as_dict(completion))
        if self.token_ids and turn.tokens is None:
            raise BackendAnswerError(
                f"{self.base_url} answered without prompt_token_ids/generation_token_ids/generation_log_probs on the message; "
                "training over chat completions needs NeMo RL's server (expose_http_server) or gym-bridge serve-model"
            )
        return turn

    async def _responses(self, request: ChatRequest) -> Turn:
        sampling = request.sampling
        params = responses_request(request, model=self.model)
        extra = self._extra_body(sampling)
        if extra:
            params["extra_body"] = extra
        response = await self._openai().responses.create(**params)
        return chat_turn_from_response(_as_dict(response), stop=sampling.stop)

    def _extra_body(self, sampling: SamplingParams) -> dict[str, Any]:
        extra = dict(self.extra_body)
        if sampling.top_k > 0:
            extra.setdefault("top_k", sampling.top_k)
        return extra

    async def aclose(self) -> None:
        """Close the running loop's client; a later call opens a new one."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.close()

    def close(self) -> None:
        """Forget every client (inside an event loop, `aclose` closes its client cleanly)."""
        self._clients.clear()


def _as_dict(answer: Any) -> dict[str, Any]:
    if hasattr(answer, "model_dump"):  # the openai client's pydantic models
        answer = answer.model_dump()
    if isinstance(answer, dict):
        return answer
    raise BackendAnswerError(f"the API answered {type(answer).__name__}, not a JSON object")


def _message(error: Any) -> str:
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        nested = body.get("error")
        inner = nested if isinstance(nested, dict) else body
        if inner.get("message"):
            return str(inner["message"])
    return str(getattr(error, "message", "") or error)
