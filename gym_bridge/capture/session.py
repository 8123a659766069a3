"""One rollout's capture session in front of a token policy: serves a harness's chat-completions
calls and keeps every call's prompt ids, completion ids and log-probs in its `SessionLedger`.

Prompts are token-in where the harness allows it: when a request's messages are the previous
request's messages, the assistant message this session answered (as the harness sends it back)
and then only tool or user messages, the prompt is the previous prompt and sampled ids followed
by the template's rendering of the new messages, so the sampled tokens are never re-tokenized.
Any other request (a rewritten history) is rendered whole with the chat template; the assembly
then sees, on token ids, that it starts a new token view. The conversation is the engine's: the session
holds a `ServedTranscript` per conversation the harness sends (`gym_bridge.core.transcript`), which owns that prefix rule,
the answer and the items. The run's sampling settings apply (the harness's temperature is ignored,
so log-probs mean what the trainer expects); the harness's `max_tokens` only lowers the cap.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Protocol

from gym_bridge.capture.assembly import CapturedCall
from gym_bridge.capture.ledger import SessionLedger, request_tools
from gym_bridge.core.conversation import TemplateMessage
from gym_bridge.core.dialects.chat import ApiError, answer_choice, chat_completion
from gym_bridge.core.dialects.template_view import template_messages
from gym_bridge.core.policy import Generation, Policy
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.transcript import ServedTranscript


class SessionState(Protocol):
    """A capture session as the endpoint and the harness loop use it, whatever its policy kind
    (`CaptureSession` for a token policy, `ChatCaptureSession` for a chat policy with token ids):
    the ledger both kinds hold (calls, items, errors, stop, admission) and its own chat-completions answer.
    A `/v1/responses` body is served by `ledger.responses(data, session.chat_completions)`."""

    @property
    def ledger(self) -> SessionLedger: ...

    async def chat_completions(self, data: Any) -> dict[str, Any]:
        """The answer to one `/v1/chat/completions` body, as OpenAI's API gives it (not streamed:
        the server streams it); raises ApiError for a 4xx/5xx (recorded on the ledger)."""
        ...


@dataclass(kw_only=True)
class CaptureSession:
    """Serves one rollout's calls from a token policy; its ledger is mutated only by `chat_completions`."""

    policy: Policy
    template: ChatTemplate
    ledger: SessionLedger
    _conversation: ServedTranscript | None = None
    """The conversation of the last call answered, which the next call may extend (a rewritten history starts another)."""

    async def chat_completions(self, data: Any) -> dict[str, Any]:
        """The answer to one request body, as OpenAI's API gives it; raises ApiError for a 4xx/5xx."""
        ledger = self.ledger
        body = ledger.chat_body(data)
        tools = tuple(request_tools(body) or ())
        try:
            messages = template_messages(body.messages, tool_format=self.template.tool_format)
        except ApiError as error:
            raise ledger.fail(error.status, error.message) from None
        async with ledger.turn():
            transcript = await self._transcript(messages, tools)
            sampling = ledger.reserve(body)
            generation, prompt_ids = await ledger.sampled(sampling, transcript.sample(sampling))
            return self._answer(transcript, prompt_ids, generation)

    async def _transcript(self, messages: list[TemplateMessage], tools: tuple[dict[str, Any], ...]) -> ServedTranscript:
        """The last call's conversation extended by the rendered new messages when the request extends it; else a whole
        render. A long request is tokenized in a worker thread, so the other rollouts' calls go on meanwhile."""
        last, ledger = self._conversation, self.ledger
        new = last.extension(messages, tools) if last is not None else None
        if last is not None and new:
            extended = await last.extended(new)
            ledger.token_in_calls += 1
            return extended
        try:
            return await ServedTranscript.start(self.policy, self.template, messages=messages, tools=tools, session_id=ledger.label,
                                                max_tokens=ledger.limits.max_completion_tokens, numbering=ledger.numbering,
                                                output=ledger.output)
        except TimeoutError:
            raise
        except Exception as error:
            raise ledger.fail(400, f"the chat template cannot render these messages: {type(error).__name__}: {error}") from None

    def _answer(self, transcript: ServedTranscript, prompt_ids: list[int], generation: Generation) -> dict[str, Any]:
        ids = generation.token_ids
        message = transcript.answer(generation, prompt_ids, number=len(self.ledger.calls))
        self.ledger.answered(CapturedCall(prompt_ids=list(prompt_ids), completion_ids=list(ids), logprobs=list(generation.logprobs)),
                             generation.finish_reason)
        self._conversation = transcript
        choice = answer_choice(0, message, generation.finish_reason)
        return chat_completion([choice], model=self.ledger.model_name, prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                               completion_id=f"chatcmpl-{secrets.token_hex(12)}")
