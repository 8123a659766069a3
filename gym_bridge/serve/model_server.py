"""`gym-bridge serve-model`: an OpenAI-compatible HTTP server over a `TransformersPolicy`.

It speaks the part of vLLM's server that gym_bridge and its users need — `/v1/models`,
`/health`, `/v1/completions` (token-id prompts, `return_token_ids`, log-probs), `/v1/chat/completions`
(tools in, `tool_calls` out as the model family's parser reads them and the capture endpoint answers them,
the same token fields) and `/tokenize` / `/detokenize` — so environments
can be developed against a laptop CPU and the remote policy can be tested over real HTTP. Every
request goes through the one policy, which batches concurrent requests into one `generate`.
Malformed requests (deeply nested JSON included) get a 400 with a message in vLLM's error shape,
bodies over the size limit a 413, and an unexpected failure a 500 for that request only. A client
that disconnects cancels its generation. Two extensions: a request's
`logprobs_mode` (`raw`/`processed`) overrides the server's, and each choice echoes the mode used.
Only the sampled token's log-prob is computed: `top_logprobs` holds just that token.

Chat completions also speak NeMo RL's token-id convention (its vLLM server behind NeMo Gym): an
assistant message may carry the `prompt_token_ids` and `generation_token_ids` of its call, and the
prompt is then those exact ids followed by the template's rendering of what came after that
message (`gym_bridge.serve.prefix_splice`); with `logprobs` and `return_tokens_as_token_ids` the answer's message
carries `prompt_token_ids`, `generation_token_ids` and `generation_log_probs`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictInt

from gym_bridge.core.conversation import AssistantMessage, assistant_message
from gym_bridge.core.dialects.chat import MAX_CHOICES, ApiError, ChatBody, MessageIn, SamplingBody, ToolIn, answer_choice, chat_completion, from_chat_tool
from gym_bridge.core.dialects.completions import CompletionBody, completion_logprobs
from gym_bridge.core.dialects.template_view import template_messages
from gym_bridge.serve.disconnect import ClientDisconnected, unless_disconnected
from gym_bridge.core.errors import ContextOverflowError
from gym_bridge.core.request_body import BodyError, json_object, read_json
from gym_bridge.core.policy import Generation, GenerationRequest, LogprobsMode, SamplingParams
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.transcript import answer_turn
from gym_bridge.serve.listen import bind_socket, run_app
from gym_bridge.serve.prefix_splice import required_prefix, splice_prefix
from gym_bridge.serve.request_limit import RequestLimit

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_CHAT_MAX_TOKENS = 1024
"""Chat requests without `max_tokens` generate up to this many tokens (or what fits the context)."""

logger = logging.getLogger(__name__)


def _error_response(error: ApiError) -> JSONResponse:
    body = {"error": {"message": error.message, "type": error.kind, "param": None, "code": error.status}}
    return JSONResponse(body, status_code=error.status)


def _busy(limit: int) -> dict[str, Any]:
    message = f"the server is serving its limit of {limit} requests at once; retry later"
    return {"error": {"message": message, "type": "ServiceUnavailableError", "param": None, "code": 503}}


# -- request bodies ---------------------------------------------------------------------------


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[MessageIn] | None = None
    tools: list[ToolIn] | None = None
    add_special_tokens: bool = True


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[StrictInt]


# -- the app ----------------------------------------------------------------------------------


@dataclass
class ServerState:
    """What the routes share."""

    policy: Any
    """A `TransformersPolicy` (anything with `generate`, `tokenizer`, `eos_token_ids`, `model`)."""
    template: ChatTemplate
    model_name: str
    model_root: str
    max_model_len: int | None
    vocab_size: int
    logprobs_mode: LogprobsMode
    max_request_bytes: int
    started: int
    generations: int = 0


def build_app(
    policy: Any,
    *,
    model_name: str,
    model_root: str = "",
    logprobs_mode: LogprobsMode = "raw",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> FastAPI:
    """The FastAPI app serving `policy` (a `TransformersPolicy`) under `model_name`.

    `model_root` is reported as the model's `root` in `/v1/models` (clients use it to find the
    tokenizer). `logprobs_mode` is the default of requests that do not name one.
    """
    tokenizer = policy.tokenizer
    text_config = policy.model.config.get_text_config()
    state = ServerState(
        policy=policy,
        template=ChatTemplate(tokenizer, eos_token_ids=sorted(policy.eos_token_ids)),
        model_name=model_name,
        model_root=model_root,
        max_model_len=getattr(text_config, "max_position_embeddings", None),
        vocab_size=policy.model.get_input_embeddings().num_embeddings,
        logprobs_mode=logprobs_mode,
        max_request_bytes=max_request_bytes,
        started=int(time.time()),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        close = getattr(policy, "close", None)
        if callable(close):
            close()

    app = FastAPI(title="gym-bridge serve-model", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/v1/completions", _json_route(completions), methods=["POST"])
    app.add_api_route("/v1/chat/completions", _json_route(chat_completions), methods=["POST"])
    for path in ("/tokenize", "/v1/tokenize"):
        app.add_api_route(path, _json_route(tokenize), methods=["POST"])
    for path in ("/detokenize", "/v1/detokenize"):
        app.add_api_route(path, _json_route(detokenize), methods=["POST"])
    return app


# -- routes: each reads the shared `ServerState` from its app ---------------------------------


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.serve
    return state


def _json_route(handler: Callable[[Request], Awaitable[dict[str, Any]]]) -> Callable[[Request], Awaitable[JSONResponse]]:
    """`handler` answering JSON, with an `ApiError` (or any other error, as a 500) as an OpenAI-style error body."""
    async def wrapped(request: Request) -> JSONResponse:
        try:
            return JSONResponse(await handler(request))
        except ApiError as error:
            return _error_response(error)
        except Exception as error:  # one request fails, the server goes on
            return _error_response(ApiError(500, f"{type(error).__name__}: {error}", "InternalServerError"))

    wrapped.__name__ = handler.__name__
    return wrapped


async def health(request: Request) -> dict[str, Any]:
    state = _state(request)
    return {"status": "ok", "model": state.model_name, "generations": state.generations}


async def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    entry = {"id": state.model_name, "object": "model", "created": state.started, "owned_by": "gym_bridge",
             "root": state.model_root or state.model_name, "parent": None, "max_model_len": state.max_model_len}
    return {"object": "list", "data": [entry]}


async def completions(request: Request) -> dict[str, Any]:
    state = _state(request)
    body = await _parse(request, CompletionBody, state)
    _check_model(body.model, state)
    body.check_supported()
    if body.echo or body.suffix:
        raise ApiError(400, "echo and suffix are not supported by serve-model")
    prompts = _completion_prompts(body.prompt, state)
    if len(prompts) * body.n > MAX_CHOICES:
        raise ApiError(400, f"prompts x n must be at most {MAX_CHOICES}, got {len(prompts) * body.n}")
    for prompt_ids in prompts:
        _check_fits(len(prompt_ids), body.max_tokens, state)
    jobs = [(prompt_ids, body.sampling(max_new_tokens=body.max_tokens, default_mode=state.logprobs_mode, seed_offset=i))
            for prompt_ids in prompts for i in range(body.n)]
    generations = await _generate_all(state, jobs, request)
    choices = []
    for index, ((prompt_ids, sampling), generation) in enumerate(zip(jobs, generations)):
        text, stop_reason = _final_text(generation, sampling, body, state)
        choice: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": generation.finish_reason,
                                  "stop_reason": stop_reason, "logprobs_mode": sampling.logprobs_mode}
        if body.logprobs is not None:
            choice["logprobs"] = completion_logprobs(_token_strings(generation.token_ids, as_ids=body.return_tokens_as_token_ids, state=state),
                                                     generation.logprobs)
        if body.return_token_ids:
            choice["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(generation.token_ids)
        choices.append(choice)
    prompt_tokens = sum(len(prompt_ids) for prompt_ids in prompts)
    completion_tokens = sum(len(generation.token_ids) for generation in generations)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": state.model_name, "choices": choices, "usage": _usage(prompt_tokens, completion_tokens)}


async def chat_completions(request: Request) -> dict[str, Any]:
    state = _state(request)
    body = await _parse(request, ChatBody, state)
    _check_model(body.model, state)
    body.check_supported()
    if body.tool_choice not in (None, "auto", "none"):
        raise ApiError(400, "tool_choice must be 'auto' or 'none' on serve-model")
    use_tools = bool(body.tools) and body.tool_choice != "none"
    tools = [from_chat_tool(tool) for tool in body.tools or []] if use_tools else None
    messages = template_messages(body.messages, tool_format=state.template.tool_format)
    try:
        prompt_ids = state.template.prompt_ids(messages, tools)
    except Exception as error:
        raise ApiError(400, f"the chat template cannot render these messages: {type(error).__name__}: {error}") from None
    prefix = required_prefix(body)
    if prefix:
        _check_ids(prefix, state)
        prompt_ids = splice_prefix(state.template, messages, tools, prompt_ids, prefix)
    requested = body.max_completion_tokens or body.max_tokens
    max_tokens = requested or DEFAULT_CHAT_MAX_TOKENS
    if requested is None and state.max_model_len is not None:
        max_tokens = max(1, min(max_tokens, state.max_model_len - len(prompt_ids)))
    _check_fits(len(prompt_ids), max_tokens, state)
    jobs = [(prompt_ids, body.sampling(max_new_tokens=max_tokens, default_mode=state.logprobs_mode, seed_offset=i))
            for i in range(body.n)]
    generations = await _generate_all(state, jobs, request)
    choices = []
    for index, ((_, sampling), generation) in enumerate(zip(jobs, generations)):
        text, stop_reason = _final_text(generation, sampling, body, state)
        message = _assistant_message(state.template, text, prompt_ids=prompt_ids, tools=tools)
        choice = answer_choice(index, message, generation.finish_reason)
        choice.update(stop_reason=stop_reason, logprobs_mode=sampling.logprobs_mode)
        if body.logprobs:
            choice["logprobs"] = {"content": _chat_logprobs(generation, as_ids=body.return_tokens_as_token_ids, state=state)}
            if body.return_tokens_as_token_ids:
                message["prompt_token_ids"] = list(prompt_ids)
                message["generation_token_ids"] = list(generation.token_ids)
                message["generation_log_probs"] = list(generation.logprobs)
        if body.return_token_ids:
            choice["token_ids"] = list(generation.token_ids)
        choices.append(choice)
    completion_tokens = sum(len(generation.token_ids) for generation in generations)
    answer = chat_completion(choices, model=state.model_name, prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens,
                             completion_id=f"chatcmpl-{uuid.uuid4().hex}")
    if body.return_token_ids:
        answer["prompt_token_ids"] = list(prompt_ids)
    return answer


async def tokenize(request: Request) -> dict[str, Any]:
    state = _state(request)
    body = await _parse(request, TokenizeBody, state)
    _check_model(body.model, state)
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(400, "give exactly one of 'prompt' or 'messages'")
    if body.prompt is not None:
        tokens = state.policy.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        tools = [from_chat_tool(tool) for tool in body.tools or []] or None
        tokens = state.template.prompt_ids(template_messages(body.messages or [], tool_format=state.template.tool_format), tools)
    return {"count": len(tokens), "max_model_len": state.max_model_len, "tokens": tokens}


async def detokenize(request: Request) -> dict[str, Any]:
    state = _state(request)
    body = await _parse(request, DetokenizeBody, state)
    _check_model(body.model, state)
    _check_ids(body.tokens, state)
    return {"prompt": state.policy.tokenizer.decode(body.tokens, skip_special_tokens=False)}


async def _parse(request: Request, model: type[pydantic.BaseModel], state: ServerState) -> Any:
    """The validated body; 413 when it is over the size limit, 400 when it is not valid (`read_json`)."""
    try:
        data = json_object(await read_json(request.stream(), content_length=request.headers.get("content-length"),
                                           max_bytes=state.max_request_bytes))
    except BodyError as error:
        raise ApiError(error.status, error.message, "RequestTooLarge" if error.status == 413 else "BadRequestError") from None
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors()[:5])
        raise ApiError(400, f"invalid request: {problems}") from None


def _check_model(name: str | None, state: ServerState) -> None:
    if name is not None and name != state.model_name:
        raise ApiError(404, f"The model `{name}` does not exist. This server serves `{state.model_name}`.", "NotFoundError")


def _check_ids(ids: list[int], state: ServerState) -> None:
    if any(token < 0 or token >= state.vocab_size for token in ids):
        raise ApiError(400, f"token ids must be in [0, {state.vocab_size})")


def _check_fits(prompt_tokens: int, max_tokens: int, state: ServerState) -> None:
    limit = state.max_model_len
    if limit is not None and prompt_tokens + max_tokens > limit:
        raise ApiError(
            400,
            f"This model's maximum context length is {limit} tokens. However, you requested {prompt_tokens + max_tokens} "
            f"tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of "
            "the messages or completion.",
        )


def _completion_prompts(prompt: Any, state: ServerState) -> list[list[int]]:
    if isinstance(prompt, str):
        prompts: list[Any] = [prompt]
    elif prompt and all(isinstance(token, int) for token in prompt):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise ApiError(400, "prompt is empty")
    ids_list = []
    for entry in prompts:
        ids = state.policy.tokenizer.encode(entry) if isinstance(entry, str) else list(entry)
        if not ids:
            raise ApiError(400, "prompt is empty")
        _check_ids(ids, state)
        ids_list.append(ids)
    return ids_list


async def _generate_all(state: ServerState, jobs: list[tuple[list[int], SamplingParams]], request: Request) -> list[Generation]:
    """Generate every job concurrently (they batch in the policy); policy errors become API errors.

    When the client disconnects first, the generations are cancelled (the policy stops their
    rows) and a 499 is returned to nobody.
    """
    started = time.perf_counter()
    generating = asyncio.gather(*(state.policy.generate(GenerationRequest(prompt_ids=ids, sampling=sampling)) for ids, sampling in jobs))

    def cancelled() -> None:
        logger.warning("request cancelled after %.1f s: the client disconnected (%d prompt(s); their generation stopped)",
                       time.perf_counter() - started, len(jobs))

    try:
        generations = await unless_disconnected(generating, request.receive, on_cancel=cancelled)
    except ClientDisconnected:
        raise ApiError(499, "the client disconnected; its generation was cancelled", "ClientDisconnected") from None
    except ContextOverflowError as error:
        raise ApiError(400, f"This model's maximum context length is exceeded: {error}") from None
    except ValueError as error:
        raise ApiError(400, str(error)) from None
    state.generations += len(generations)
    return list(generations)


def _final_text(generation: Generation, sampling: SamplingParams, body: SamplingBody, state: ServerState) -> tuple[str, str | None]:
    """The choice's text and `stop_reason` (the stop string that ended it), as vLLM gives them."""
    ids = generation.token_ids
    if body.skip_special_tokens:
        text = generation.text if generation.text is not None else state.policy.tokenizer.decode(ids, skip_special_tokens=True)
    else:
        text = state.policy.tokenizer.decode(ids, skip_special_tokens=False)
    ended_on_eos = bool(ids) and ids[-1] in state.template.eos_token_ids
    if generation.finish_reason != "stop" or ended_on_eos or not sampling.stop:
        return text, None
    found = [(text.find(stop), stop) for stop in sampling.stop if stop in text]
    if not found:
        return text, None
    position, stop = min(found)
    return (text[: position + len(stop)] if body.include_stop_str_in_output else text[:position]), stop


def _token_strings(ids: list[int], *, as_ids: bool, state: ServerState) -> list[str]:
    if as_ids:
        return [f"token_id:{token}" for token in ids]
    return [state.policy.tokenizer.decode([token], skip_special_tokens=False) for token in ids]


def _chat_logprobs(generation: Generation, *, as_ids: bool, state: ServerState) -> list[dict[str, Any]]:
    tokens = _token_strings(generation.token_ids, as_ids=as_ids, state=state)
    return [
        {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")),
         "top_logprobs": [{"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}]}
        for token, logprob in zip(tokens, generation.logprobs)
    ]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


def _assistant_message(template: ChatTemplate, text: str, *, prompt_ids: list[int], tools: list[dict[str, Any]] | None) -> AssistantMessage:
    """The assistant message of a chat choice: `text` read with the model family's parsers, answered by the
    rule the capture endpoint answers with (`answer_turn`), so one model answers alike through both;
    `tool_calls` is always there, as vLLM gives it."""
    parsed = template.parse(text, prompt_ids=prompt_ids, tools=tools or ())
    message = assistant_message(answer_turn(parsed, text, tools_offered=bool(tools),
                                            call_id=lambda n, call: template.call_id(uuid.uuid4().hex[:24], written=call.id)))
    message.setdefault("tool_calls", [])
    return message


def serve(
    policy: Any,
    *,
    model_name: str,
    model_root: str = "",
    host: str = "127.0.0.1",
    port: int = 8000,
    logprobs_mode: LogprobsMode = "raw",
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_requests: int = 1024,
    on_ready: Callable[[str], None] | None = None,
    sock: socket.socket | None = None,
) -> None:
    """Serve `policy` until interrupted. `on_ready` gets the base URL (`http://host:port/v1`) once bound.

    Past `max_requests` requests in flight, a new one gets a 503 with `Retry-After` (clients retry):
    only those past it; `/health` and `/v1/models` are always answered. `sock`: a socket bound already
    (`bind_socket`, so a busy port is found before the model loads); else `host:port`.
    """
    app = RequestLimit(build_app(policy, model_name=model_name, model_root=model_root, logprobs_mode=logprobs_mode,
                                 max_request_bytes=max_request_bytes),
                       limit=max_requests, limited=lambda path: path not in ("/health", "/v1/models"), refusal=_busy)
    run_app(app, sock or bind_socket(host, port), on_ready=on_ready, url_path="/v1", timeout_keep_alive=30,
            h11_max_incomplete_event_size=64 * 1024)
