"""One model turn and one tool call: the form every policy kind's answer takes inside gym_bridge.

A token policy's sampled ids are read into a `Turn` by the model family's parsers (the transcript does it, since
reading needs the chat template and the prompt); a chat policy answers with a `Turn` directly. Every other form is
converted from it at its own home, once: Responses items (`gym_bridge.core.items.turn_items`), the assistant message
(`gym_bridge.core.conversation.assistant_message`), a journal event (`gym_bridge.core.resume`). A token policy still
returns a raw `Generation` (ids, log-probs, finish reason; `gym_bridge.core.policy`): it knows no template, so it
cannot parse what it sampled, and a `Turn` is made only once its text is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from gym_bridge.core.conversation import FinishReason


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call of a model turn, however the policy wrote it (parsed from its text, or as a chat API returned it)."""

    id: str | None = None
    """The call's id: the one the model wrote (Mistral) or the API gave, until the transcript names it as in the record."""
    name: str
    arguments: str
    """The arguments as a JSON object string (the raw text when they did not parse)."""
    error: str | None = None
    """Why the call is malformed; the model is shown this instead of running the tool."""


@dataclass(frozen=True)
class CallTokens:
    """The token ids of one model call: the prompt it was given, and what was sampled with its log-probs
    (NeMo Gym's field names, as the record's items and a token-returning chat server carry them)."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One model turn: reasoning, text, tool calls and, where the policy gives them, the call's token ids."""

    reasoning: str = ""
    text: str = ""
    """The turn's text outside reasoning and tool-call markup."""
    calls: tuple[ToolCall, ...] = ()
    tokens: CallTokens | None = None
    """This call's token ids and log-probs (None from a parser, and from hosted chat APIs, which do not return them)."""
    finish_reason: FinishReason = "stop"
    """`length` when the call stopped at its token cap."""
    policy_version: int | None = None
    """The weights' version this call's oldest token was sampled under; None when the backend does not know."""
    unparsed_tool_call: bool = False
    """True when the turn has no parsed call but its text holds a known tool-call marker (or is a bare JSON call
    object), its reasoning holds a call marker of its own family, or it addresses a tool gym_bridge does not run
    (harmony's built-in tools): a call it cannot act on, scored as an answer."""
    usage: Mapping[str, int] = field(default_factory=dict)
    """`input_tokens` and `output_tokens` as a chat API reported them (empty from token policies)."""

    @property
    def parse_errors(self) -> int:
        """Calls that looked like calls but could not be read."""
        return sum(call.error is not None for call in self.calls)
