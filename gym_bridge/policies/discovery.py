"""What an OpenAI-compatible server serves, asked once at start-up: its models and its tokenization.

`gym-bridge eval --base-url`, `gym-bridge serve` and the TRL server path ask `GET /v1/models` for
the served model's name and `POST /tokenize` to check that a local tokenizer is the server's (`served_model_identity`
puts both in a journal's fingerprint). Each question is one throwaway request (`gym_bridge.policies.http.request_once`), never the rollouts'
connection pools.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any, Sequence

import orjson

from gym_bridge.core.dialects.completions import preview
from gym_bridge.core.errors import BackendAnswerError, ConfigError
from gym_bridge.policies.http import ServerUnreachableError, TransportError, error_message, normalize_base_url, request_once

TOKENIZER_PROBE = " Hello, world! 123 4567.89\n\t<tool_call>{\"a\": [1, 2]}</tool_call>  \u00e9\u00e8 \u4f60\u597d  end "
"""Text whose token ids tell tokenizers apart (spaces, digits, markup, accents, CJK)."""


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


async def served_model_identity(base_urls: Sequence[str], *, model: str | None, api_key: str | None = None,
                                wait_s: float = 60.0, poll_s: float = 0.5) -> str:
    """What generates behind `base_urls`, as a journal's fingerprint holds it: per distinct answer, the model's id
    (`model`, else each server's first) with the `root` its `/v1/models` reports and a digest of how its
    `/tokenize` splits `TOKENIZER_PROBE` ("not reported" without one). URLs are left out: a restarted server may
    listen elsewhere. Servers whose connection is refused are asked again for up to `wait_s` (still starting).

    Raises ConfigError naming the URL when a server does not answer or does not serve `model`."""
    answers = await asyncio.gather(*(_identity(url, model=model, api_key=api_key, wait_s=wait_s, poll_s=poll_s) for url in base_urls))
    return "; ".join(sorted(set(answers)))


async def _identity(url: str, *, model: str | None, api_key: str | None, wait_s: float, poll_s: float) -> str:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            models = await served_models(url, api_key=api_key)
            break
        except ServerUnreachableError as error:
            if not error.refused or time.monotonic() + poll_s > deadline:
                raise ConfigError(f"cannot ask {url} which model it serves, for the journal's fingerprint ({error}); start "
                                  "the model server first, or run without a journal") from None
            await asyncio.sleep(poll_s)
        except BackendAnswerError as error:
            raise ConfigError(f"cannot ask {url} which model it serves, for the journal's fingerprint ({error})") from None
    entry = next((entry for entry in models if model is None or entry["id"] == model), None)
    if entry is None:
        raise ConfigError(f"{url} does not serve model {model!r}; it serves {', '.join(str(entry['id']) for entry in models) or 'none'}")
    ids = await served_token_ids(url, TOKENIZER_PROBE, model=str(entry["id"]), api_key=api_key)
    tokenizer = "not reported" if ids is None else hashlib.sha256(orjson.dumps(ids)).hexdigest()[:16]
    return f"{entry['id']} (root {entry.get('root', entry['id'])}, tokenizer {tokenizer})"
