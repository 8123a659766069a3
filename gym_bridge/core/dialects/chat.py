"""The chat-completions dialect: its messages, tool schemas, request bodies and error answers.

Owns the pydantic models of a `/v1/chat/completions` body (`ChatBody`, with `MessageIn`,
`ToolIn`), which serve-model and the capture endpoint both validate against; tool schemas
between the Responses form and the chat form (`to_chat_tool`, `from_chat_tool`); chat messages
as the chat-completions API is sent them (`to_openai_messages`); a chat policy's request and the
turn in its answer (`chat_request`, `chat_turn_from_completion`); a chat completion as the
`chat.completion.chunk` objects of a streamed answer (`completion_chunks`); and `ApiError`, an
error answer in OpenAI's shape. No web framework: the servers turn `ApiError` into their own responses.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from gym_bridge.core.conversation import AssistantMessage, FinishReason, Message, assistant_message
from gym_bridge.core.errors import BackendAnswerError, ErrorAnswer
from gym_bridge.core.items import TOKEN_FIELDS
from gym_bridge.core.policy import ChatRequest, LogprobsMode, SamplingParams
from gym_bridge.core.turn import CallTokens, ToolCall, Turn

MAX_CHOICES = 64
"""The most choices one request may ask for (prompts x n)."""
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256

LOGPROBS_MODES: dict[str, LogprobsMode] = {"raw": "raw", "raw_logprobs": "raw", "processed": "processed", "processed_logprobs": "processed"}
"""vLLM's `logprobs_mode` names and the policy mode each means."""


class ApiError(ErrorAnswer):
    """An error answer: HTTP status, message, and the OpenAI error type."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", *, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        """OpenAI's `error.code` (`context_length_exceeded`, ...), or None."""


# -- request bodies ---------------------------------------------------------------------------


class SamplingBody(BaseModel):
    """Fields shared by completions and chat completions; unknown fields are ignored, like vLLM does."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = -1
    """-1 or 0: off."""
    seed: Annotated[int, Field(ge=0, lt=2**63)] | None = None
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs_mode: str | None = None
    stream: StrictBool = False
    """A JSON true or false (the server reads the raw flag to choose a streamed answer, so no other value may pass)."""
    # Accepted only at their neutral values: the policy implements none of them.
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    ignore_eos: bool = False
    best_of: int | None = None
    logit_bias: dict[str, float] | None = None
    use_beam_search: bool = False
    prompt_logprobs: int | None = None

    def check_supported(self) -> None:
        """Raises ApiError 400 for a setting serve-model does not implement."""
        neutral = {"min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                   "min_tokens": 0, "ignore_eos": False, "use_beam_search": False}
        for name, value in neutral.items():
            if getattr(self, name) != value:
                raise ApiError(400, f"{name}={getattr(self, name)!r} is not supported by serve-model (only {value!r})")
        if self.best_of not in (None, 1) or self.logit_bias or self.prompt_logprobs is not None:
            raise ApiError(400, "best_of, logit_bias and prompt_logprobs are not supported by serve-model")
        if self.stream:
            raise ApiError(400, "stream=true is not supported by serve-model; send stream=false")
        if self.logprobs_mode is not None and self.logprobs_mode not in LOGPROBS_MODES:
            raise ApiError(400, f"logprobs_mode must be one of {sorted(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")
        for stop in self.stop_strings():
            if not 0 < len(stop) <= MAX_STOP_CHARS:
                raise ApiError(400, f"stop strings must have 1 to {MAX_STOP_CHARS} characters")
        if len(self.stop_strings()) > MAX_STOP_STRINGS:
            raise ApiError(400, f"at most {MAX_STOP_STRINGS} stop strings")

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling(self, *, max_new_tokens: int, default_mode: LogprobsMode, seed_offset: int = 0) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            max_new_tokens=max_new_tokens,
            stop=self.stop_strings(),
            seed=None if self.seed is None else self.seed + seed_offset,
            logprobs_mode=LOGPROBS_MODES[self.logprobs_mode] if self.logprobs_mode else default_mode,
        )


class FunctionIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: Annotated[str, Field(min_length=1)]
    description: str = ""
    parameters: dict[str, Any] | None = None
    arguments: str | dict[str, Any] | None = None


class ToolIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"] = "function"
    function: FunctionIn


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionIn


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "input_text", "output_text"]
    text: str


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    prompt_token_ids: list[StrictInt] | None = None
    generation_token_ids: list[StrictInt] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)

    def to_message(self) -> Message:
        """This request message in the conversation's form (`developer` is `system`; arguments as sent,
        an object as its JSON text); token fields are not carried."""
        if self.role in ("system", "developer"):
            return {"role": "system", "content": self.text()}
        if self.role == "user":
            return {"role": "user", "content": self.text()}
        if self.role == "tool":
            return {"role": "tool", "tool_call_id": self.tool_call_id or "", "content": self.text()}
        calls = tuple(ToolCall(id=call.id, name=call.function.name, arguments=_arguments_text(call.function.arguments))
                      for call in self.tool_calls or [])
        return assistant_message(Turn(text=self.text(), calls=calls))


def _arguments_text(arguments: str | dict[str, Any] | None) -> str:
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatBody(SamplingBody):
    """A `/v1/chat/completions` request body."""

    stream_options: StreamOptions | None = None
    messages: Annotated[list[MessageIn], Field(min_length=1)]
    tools: list[ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    required_prefix_token_ids: list[StrictInt] | None = None
    """The exact ids the prompt must start with (default: from the last message carrying token ids)."""


# -- conversions ------------------------------------------------------------------------------


def to_chat_tool(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses function schema (`name`, `description`, `parameters`) as a chat-completions tool."""
    return {
        "type": "function",
        "function": {
            "name": schema["name"],
            "description": schema.get("description", ""),
            "parameters": schema.get("parameters") or {"type": "object", "properties": {}},
        },
    }


def from_chat_tool(tool: ToolIn) -> dict[str, Any]:
    """A chat-completions tool as a Responses function schema (no parameters: an empty object schema)."""
    function = tool.function
    return {"type": "function", "name": function.name, "description": function.description,
            "parameters": function.parameters or {"type": "object", "properties": {}}}


def tool_call_arguments(arguments: str | dict[str, Any] | None) -> dict[str, Any]:
    """A tool call's arguments as an object (a JSON string is parsed; None is `{}`).

    Raises ApiError 400 when they are not JSON or not an object.
    """
    if isinstance(arguments, dict):
        return arguments
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        raise ApiError(400, f"tool call arguments are not valid JSON: {arguments!r}") from None
    if not isinstance(parsed, dict):
        raise ApiError(400, "tool call arguments must be a JSON object")
    return parsed


def to_openai_messages(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Chat messages as the chat-completions API accepts them: tool messages keep only their id,
    an assistant message with tool calls has content None when empty, and the token fields
    NeMo RL's server reads stay on the assistant messages that carry them."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": message.get("tool_call_id", ""), "content": message.get("content", "")})
        elif message["role"] == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                entry.update(content=message.get("content") or None, tool_calls=message.get("tool_calls"))
            if "prompt_token_ids" in message:
                entry["prompt_token_ids"] = message["prompt_token_ids"]
            if "generation_token_ids" in message:
                entry["generation_token_ids"] = message["generation_token_ids"]
            if "generation_log_probs" in message:
                entry["generation_log_probs"] = message["generation_log_probs"]
            out.append(entry)
        else:
            out.append({"role": message["role"], "content": message.get("content", "")})
    return out


# -- the client side: a request for a chat policy's turn, and the turn in the answer -----------


def chat_request(request: ChatRequest, *, model: str) -> dict[str, Any]:
    """The chat-completions request for one turn (sampling as given; the client adds its extras)."""
    sampling = request.sampling
    params: dict[str, Any] = {
        "model": model,
        "messages": to_openai_messages(request.messages),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_completion_tokens": sampling.max_new_tokens,
    }
    if request.tools:
        params["tools"] = [to_chat_tool(schema) for schema in request.tools]
    if sampling.stop:
        params["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        params["seed"] = sampling.seed
    return params


def chat_turn_from_completion(completion: dict[str, Any]) -> Turn:
    """A chat-completions answer as a `Turn`; raises `BackendError` when it has no choice."""
    choices = completion.get("choices") or []
    if not choices or not isinstance(choices[0].get("message"), dict):
        raise BackendAnswerError(f"chat completion has no message: {json.dumps(completion)[:200]}")
    choice = choices[0]
    message = choice["message"]
    calls = tuple(
        ToolCall(name=call["function"]["name"], arguments=call["function"].get("arguments") or "{}")
        for call in message.get("tool_calls") or [] if call.get("function")
    )
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    usage = completion.get("usage") or {}
    return Turn(
        text=message.get("content") or "",
        reasoning=reasoning if isinstance(reasoning, str) else "",
        calls=calls,
        finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
        usage={"input_tokens": int(usage.get("prompt_tokens") or 0), "output_tokens": int(usage.get("completion_tokens") or 0)},
        tokens=call_tokens(message),
    )


def call_tokens(message: Mapping[str, Any]) -> CallTokens | None:
    """The token fields NeMo RL's server puts on an answer's message, or None when there are none.

    Raises `BackendError` when they are there but malformed (missing one, lengths that disagree).
    """
    present = [field for field in TOKEN_FIELDS if message.get(field) is not None]
    if not present:
        return None
    if len(present) != len(TOKEN_FIELDS):
        raise BackendAnswerError(f"the message carries {present} but not all of {list(TOKEN_FIELDS)}")
    prompt, generation, logprobs = (message[field] for field in TOKEN_FIELDS)
    if not all(isinstance(value, list) for value in (prompt, generation, logprobs)) or len(generation) != len(logprobs):
        raise BackendAnswerError(f"malformed token fields: {len(generation)} generation ids and {len(logprobs)} log-probs")
    return CallTokens(prompt_token_ids=[int(t) for t in prompt], generation_token_ids=[int(t) for t in generation],
                      generation_log_probs=[float(v) for v in logprobs])


# -- the server side: a chat.completion answer ------------------------------------------------


def answer_choice(index: int, message: AssistantMessage, finish_reason: FinishReason) -> dict[str, Any]:
    """One choice of a `chat.completion`: finish reason `tool_calls` when the message calls tools and the
    turn ended on its own (`length` stays `length`)."""
    finish = "tool_calls" if message.get("tool_calls") and finish_reason == "stop" else finish_reason
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish}


def chat_completion(choices: list[dict[str, Any]], *, model: str, prompt_tokens: int, completion_tokens: int,
                    completion_id: str) -> dict[str, Any]:
    """A `chat.completion` answer with its usage (`completion_id`: `chatcmpl-...`)."""
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}
    return {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": choices, "usage": usage}


def completion_chunks(completion: Mapping[str, Any], *, include_usage: bool) -> list[dict[str, Any]]:
    """A `chat.completion` answer as the `chat.completion.chunk` objects OpenAI streams for it: per
    choice a role delta, the reasoning and content deltas, per tool call its index, id, type and
    name then its arguments, and a last delta with the finish reason; with `include_usage` every
    chunk has `usage: null` and a last chunk with no choices carries the usage."""
    head = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"], "system_fingerprint": None}
    if include_usage:
        head["usage"] = None
    deltas: list[tuple[int, dict[str, Any], str | None]] = []
    for choice in completion["choices"]:
        index, message = choice["index"], choice["message"]
        deltas.append((index, {"role": "assistant", "content": None if message.get("content") is None else ""}, None))
        if message.get("reasoning_content"):
            deltas.append((index, {"reasoning_content": message["reasoning_content"]}, None))
        if message.get("content"):
            deltas.append((index, {"content": message["content"]}, None))
        for position, call in enumerate(message.get("tool_calls") or []):
            opened = {"index": position, "id": call["id"], "type": "function",
                      "function": {"name": call["function"]["name"], "arguments": ""}}
            deltas.append((index, {"tool_calls": [opened]}, None))
            arguments = {"index": position, "function": {"arguments": call["function"]["arguments"]}}
            deltas.append((index, {"tool_calls": [arguments]}, None))
        deltas.append((index, {}, choice["finish_reason"]))
    chunks = [{**head, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
              for index, delta, finish in deltas]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": completion["usage"]})
    return chunks
