"""What an OpenAI-compatible server serves, asked once at start-up: its models and its tokenization.

`gym-bridge eval --base-url`, `gym-bridge serve` and the TRL server path ask `GET /v1/models` for
the served model's name and `POST /tokenize` to check that a local tokenizer is the server's. Each
question is one throwaway request (`gym_bridge.policies.http.request_once`), never the rollouts'
connection pools.
"""

from __future__ import annotations

from typing import Any

import orjson

from gym_bridge.core.dialects.completions import preview
from gym_bridge.core.errors import BackendAnswerError
from gym_bridge.policies.http import ServerUnreachableError, TransportError, error_message, normalize_base_url, request_once


async def served_models(base_url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The `data` of `GET {base_url}/models` (each has `id`; vLLM and serve-model add `root`, `max_model_len`).

    Raises `ServerUnreachableError` when no server answers, `BackendError` when it answers something else.
    """
    url = normalize_base_url(base_url) + "/models"
    try:
        answer = await request_once("GET", url, api_key=api_key, timeout_s=timeout_s)
    except TransportError as error:
        unreachable = ServerUnreachableError(f"cannot reach {url}: {error}")
        unreachable.refused = error.refused
        raise unreachable from None
    if answer.status != 200:
        raise BackendAnswerError(f"{url} answered {answer.status}: {error_message(answer)}")
    try:
        data = orjson.loads(answer.body)["data"]
        return [entry for entry in data if isinstance(entry, dict) and "id" in entry]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise BackendAnswerError(f"{url} answered something other than a model list: {preview(answer.body)}") from None


async def served_token_ids(base_url: str, text: str, *, model: str, api_key: str | None = None, timeout_s: float = 10.0) -> list[int] | None:
    """How the server tokenizes `text` (vLLM's and serve-model's `POST /tokenize`, no special tokens added);
    None when the server has no such endpoint or cannot be asked."""
    root = normalize_base_url(base_url).removesuffix("/v1")
    body = {"model": model, "prompt": text, "add_special_tokens": False}
    try:
        answer = await request_once("POST", f"{root}/tokenize", body=body, api_key=api_key, timeout_s=timeout_s)
        tokens = orjson.loads(answer.body)["tokens"] if answer.status == 200 else None
    except (TransportError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return tokens if isinstance(tokens, list) else None
