"""The shipped chat-policy test double: `ScriptedChatPolicy` replays turns per session (or from the
"" fallback), raises what its script holds, keeps the requests, and fails clearly when it runs out."""

from __future__ import annotations

import asyncio

import pytest

from gym_bridge import ChatPolicy, ScriptedChatPolicy
from gym_bridge.core.errors import BackendAnswerError
from gym_bridge.core.policy import ChatRequest, SamplingParams
from gym_bridge.core.turn import ToolCall, Turn


def ask(policy: ScriptedChatPolicy, session_id: str, text: str = "hi") -> Turn:
    request = ChatRequest(messages=[{"role": "user", "content": text}], tools=(), sampling=SamplingParams(), session_id=session_id)
    return asyncio.run(policy.chat(request))


def test_turns_replay_in_order_per_session_with_the_fallback_for_the_rest():
    call = Turn(text="", calls=(ToolCall(name="add", arguments='{"a": 1}'),), finish_reason="tool_calls")
    policy = ScriptedChatPolicy({"a": [call, "done"], "": ["fallback 1", "fallback 2"]})
    assert isinstance(policy, ChatPolicy)
    assert ask(policy, "a") == call and ask(policy, "a").text == "done"  # a str is a text-only turn
    # each session without its own script walks the fallback from its own start
    assert [ask(policy, "b").text, ask(policy, "c").text, ask(policy, "b").text] == ["fallback 1", "fallback 1", "fallback 2"]
    assert [request.session_id for request in policy.requests] == ["a", "a", "b", "c", "b"]
    assert policy.requests[0].messages == [{"role": "user", "content": "hi"}]


def test_a_scripted_exception_is_raised_and_an_exhausted_or_missing_script_is_a_backend_failure():
    policy = ScriptedChatPolicy({"a": [TimeoutError("slow"), "late"]})
    with pytest.raises(TimeoutError, match="slow"):
        ask(policy, "a")
    assert ask(policy, "a").text == "late"
    with pytest.raises(BackendAnswerError, match="ran out of turns for session 'a'"):
        ask(policy, "a")
    with pytest.raises(BackendAnswerError, match="no script for session 'b'"):
        ask(policy, "b")
