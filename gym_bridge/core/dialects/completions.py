"""The completions dialect: the `/v1/completions` wire format training runs on, both directions.

Client side: the request fields for a `GenerationRequest` (`request_fields`; token-id prompts,
every sampling field sent, log-probs of the sampled tokens as `"token_id:N"` strings) and the
`Generation` in an answer (`parse_completion`, which refuses what a rollout cannot use).
Server side (serve-model): the request model (`CompletionBody`) and a choice's log-probs as vLLM
writes them (`completion_logprobs`). Transport (HTTP, retries, routing) is the policy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import orjson
from pydantic import Field, StrictInt

from gym_bridge.core.dialects.chat import SamplingBody
from gym_bridge.core.errors import BackendAnswerError, BackendError
from gym_bridge.core.policy import Generation, GenerationRequest, SamplingParams

_TOKEN_ID_PREFIX = "token_id:"


class MalformedAnswerError(BackendError):
    """An HTTP 200 answer a rollout cannot use (no token ids, ids outside the vocabulary, log-probs
    missing, a finish reason that is neither `stop` nor `length`); the client retries it elsewhere."""


def request_fields(sampling: SamplingParams, *, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "n": 1,
        "stream": False,
        "echo": False,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
        "include_stop_str_in_output": True,
    }
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.logprobs_mode != "raw":
        body["logprobs_mode"] = sampling.logprobs_mode  # serve-model honours it; vLLM fixes it at launch
    return body


def parse_completion(data: Any, *, request: GenerationRequest, vocab_size: int | None = None) -> Generation:
    """The `Generation` in a `/v1/completions` answer.

    Raises `MalformedAnswerError` for a malformed answer (ids outside `[0, vocab_size)` included) and
    `BackendError` when the server answered for another prompt than the one sent (a proxy or server
    that rewrites prompts).
    """
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise MalformedAnswerError(f"answer has no choices: {preview(data)}")
    choice = data["choices"][0]
    if not isinstance(choice, dict):
        raise MalformedAnswerError(f"choice is not an object: {preview(choice)}")
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        logprobs = {}
    token_logprobs = logprobs.get("token_logprobs")
    token_ids = choice.get("token_ids")
    listed_ids = _ids_from_token_strings(logprobs.get("tokens"))
    if token_ids is None:
        token_ids = listed_ids
    if token_ids is None:
        raise MalformedAnswerError(
            "answer has no token ids: the server needs `return_token_ids` (vLLM >= 0.10.2) or "
            "`return_tokens_as_token_ids` with log-probs"
        )
    if not isinstance(token_ids, list) or not all(type(token) is int for token in token_ids):
        raise MalformedAnswerError(f"token_ids is not a list of integers: {preview(token_ids)}")
    if listed_ids is not None and listed_ids is not token_ids and listed_ids != token_ids:
        raise MalformedAnswerError("token_ids and the log-prob tokens disagree")
    if vocab_size is not None and token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab_size):
        outside = sorted({token for token in token_ids if not 0 <= token < vocab_size})
        raise MalformedAnswerError(f"token ids outside the tokenizer's vocabulary [0, {vocab_size}): {preview(outside)} "
                               "(does this server serve another model than the tokenizer's?)")
    if not isinstance(token_logprobs, list) or len(token_logprobs) != len(token_ids):
        raise MalformedAnswerError(
            f"answer has {len(token_ids)} token ids but log-probs {preview(token_logprobs)}; log-probs must be on"
        )
    if not all(type(value) is float for value in token_logprobs):  # orjson gives floats; ints only for integral values
        if not all(isinstance(value, (int, float)) and not isinstance(value, bool) for value in token_logprobs):
            raise MalformedAnswerError(f"log-probs are not all numbers: {preview(token_logprobs)}")
        token_logprobs = [float(value) for value in token_logprobs]
    finish_reason = choice.get("finish_reason")
    if finish_reason not in ("stop", "length"):
        raise MalformedAnswerError(f"finish_reason {finish_reason!r} is neither 'stop' nor 'length'")
    if len(token_ids) > request.sampling.max_new_tokens:
        raise MalformedAnswerError(f"{len(token_ids)} tokens returned for max_tokens={request.sampling.max_new_tokens}")
    text = choice.get("text")
    if text is not None and not isinstance(text, str):
        raise MalformedAnswerError(f"text is not a string: {preview(text)}")
    prompt_ids = choice.get("prompt_token_ids")
    if prompt_ids is not None and prompt_ids != _as_list(request.prompt_ids):
        raise BackendAnswerError("the server generated for other prompt ids than those sent (does a proxy rewrite prompts?)")
    mode = choice.get("logprobs_mode")
    if mode is not None and mode != request.sampling.logprobs_mode:
        raise BackendAnswerError(f"asked for {request.sampling.logprobs_mode} log-probs, the server returned {mode} ones")
    return Generation(token_ids=token_ids, logprobs=token_logprobs, finish_reason=finish_reason, text=text)


def _as_list(ids: Sequence[int]) -> list[int]:
    return ids if isinstance(ids, list) else list(ids)


def _ids_from_token_strings(tokens: Any) -> list[int] | None:
    """The ids in `return_tokens_as_token_ids` strings (`"token_id:42"`); None unless every token is one."""
    if not isinstance(tokens, list):
        return None
    try:
        ids = [int(token[9:]) for token in tokens if token[:9] == _TOKEN_ID_PREFIX]
    except (TypeError, ValueError, KeyError):
        return None
    return ids if len(ids) == len(tokens) else None


def preview(value: Any, limit: int = 200) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if len(text) <= limit else text[:limit] + "..."


class CompletionBody(SamplingBody):
    """A `/v1/completions` request body (serve-model)."""

    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    max_tokens: Annotated[int, Field(ge=1)] = 16
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool = False
    suffix: str | None = None


def completion_logprobs(tokens: list[str], logprobs: Sequence[float]) -> dict[str, Any]:
    """A choice's `logprobs` as vLLM writes them: text offsets, one log-prob per token, the tokens
    (text or `token_id:N`) and the sampled token as the only top log-prob."""
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": list(logprobs),
        "tokens": tokens,
        "top_logprobs": [{token: logprob} for token, logprob in zip(tokens, logprobs)],
    }
