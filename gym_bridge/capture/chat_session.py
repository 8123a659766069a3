"""A capture session in front of a chat policy that returns token ids (NeMo RL's server behind
`/run`, `gym-bridge serve-model`, `ChatAPIPolicy(token_ids=True)`).

The harness's conversation is passed to the policy as chat messages; the server renders each
prompt and answers with the call's `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs`. Those are captured as the call. When the harness sends an answered
assistant message back, the session puts that call's token ids on it (as NeMo Gym's model servers
do), so the server keeps the prompt's prefix exact and the sampled tokens are never re-tokenized.
A chat policy that returns no token ids (a hosted API) cannot be captured: the session stops as
`infra` and says so.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gym_bridge.capture.assembly import CapturedCall
from gym_bridge.capture.ledger import SessionLedger, request_tools
from gym_bridge.core.conversation import Message, appended, assistant_message
from gym_bridge.core.dialects.chat import MessageIn, answer_choice, chat_completion
from gym_bridge.core.errors import BackendError
from gym_bridge.core.items import TOKEN_FIELDS
from gym_bridge.core.policy import ChatPolicy, ChatRequest
from gym_bridge.core.trajectory import Trajectory
from gym_bridge.core.transcript import MessageTranscript
from gym_bridge.core.turn import CallTokens, Turn

NO_TOKENS = ("the chat policy answered without token ids; a harness behind a chat policy needs one that returns "
             "prompt_token_ids/generation_token_ids/generation_log_probs (NeMo RL's server, gym-bridge serve-model, "
             "ChatAPIPolicy(token_ids=True))")


@dataclass(kw_only=True)
class ChatCaptureSession:
    """Serves one rollout's calls from a chat policy with token ids; its ledger is mutated only by `chat_completions`."""

    policy: ChatPolicy
    ledger: SessionLedger
    _tokens: dict[str, CallTokens] = field(default_factory=dict)
    """The token ids of every answered assistant message, by `_answer_key`."""
    _conversation: MessageTranscript | None = None
    """The conversation of the last call answered (its messages and the answer; its token stream, which the next
    call's prompt ids may extend, else a new conversation starts)."""

    async def chat_completions(self, data: Any) -> dict[str, Any]:
        """The answer to one request body, as OpenAI's API gives it; raises ApiError for a 4xx/5xx."""
        ledger = self.ledger
        body = ledger.chat_body(data)
        tools = request_tools(body) or []
        async with ledger.turn():
            messages = [self._chat_message(message) for message in body.messages]
            sampling = ledger.reserve(body)
            self._input_items(messages)
            request = ChatRequest(messages=messages, tools=tools, sampling=sampling, session_id=ledger.label)
            turn = await ledger.sampled(sampling, self.policy.chat(request))
            if turn.tokens is None:
                raise ledger.backend_failed(BackendError(NO_TOKENS))
            return self._answer(messages, turn, turn.tokens)

    def _chat_message(self, message: MessageIn) -> Message:
        """A request message in the conversation's form; an answered assistant message gets its call's token ids back."""
        out = message.to_message()
        if out["role"] == "assistant":
            tokens = self._tokens.get(_answer_key(out))
            if tokens is not None:
                out["prompt_token_ids"] = list(tokens.prompt_token_ids)
                out["generation_token_ids"] = list(tokens.generation_token_ids)
                out["generation_log_probs"] = list(tokens.generation_log_probs)
        return out

    def _input_items(self, messages: Sequence[Message]) -> None:
        """Tool outputs and user messages that extend the last answered conversation become input items."""
        last = self._conversation
        if last is None or appended([_plain(m) for m in last.messages], [_plain(m) for m in messages]) is None:
            return
        last.writer.add_inputs(messages[len(last.messages):])

    def _transcript(self, tokens: CallTokens) -> MessageTranscript:
        """The last call's token stream when this call's prompt ids extend it (a token-in call); else a new conversation's."""
        last, ledger = self._conversation, self.ledger
        if last is not None and last.continues(tokens):
            ledger.token_in_calls += 1
            return last
        return MessageTranscript(self.policy, task=None, tools=(), trajectory=Trajectory(prompt_ids=[], output=ledger.output),
                                 session_id=ledger.label, max_tokens=ledger.limits.max_completion_tokens, numbering=ledger.numbering)

    def _answer(self, messages: Sequence[Message], answer: Turn, tokens: CallTokens) -> dict[str, Any]:
        transcript = self._conversation = self._transcript(tokens)
        transcript.add_call_tokens(tokens)
        prompt, ledger = list(tokens.prompt_token_ids), self.ledger
        ledger.answered(CapturedCall(prompt_ids=prompt, completion_ids=list(tokens.generation_token_ids),
                                     logprobs=list(tokens.generation_log_probs)), answer.finish_reason)
        named = replace(answer, calls=tuple(replace(call, id=f"call_{ledger.label or 'capture'}_{len(ledger.calls)}x{n}")
                                            for n, call in enumerate(answer.calls)))
        message = assistant_message(replace(named, tokens=None))
        self._tokens[_answer_key(message)] = tokens
        transcript.writer.add_answer(named)
        transcript.messages = [*messages, message]
        choice = answer_choice(0, message, answer.finish_reason)
        return chat_completion([choice], model=ledger.model_name, prompt_tokens=len(prompt),
                               completion_tokens=len(tokens.generation_token_ids), completion_id=f"chatcmpl-{secrets.token_hex(12)}")


def _answer_key(message: Mapping[str, Any]) -> str:
    """What identifies an assistant message the session answered: its text and its call ids."""
    return json.dumps([message.get("content") or "", [call["id"] for call in message.get("tool_calls") or []]])


def _plain(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message without token fields or reasoning (what a harness may or may not send back)."""
    plain = {key: value for key, value in message.items() if key not in TOKEN_FIELDS and key != "reasoning_content"}
    return {**plain, "content": plain.get("content") or ""}
