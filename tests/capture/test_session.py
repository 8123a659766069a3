"""A capture session holds the engine's `Transcript` per segment: the calls of a token-in chain extend one
token stream, which is the assembly's segment token for token; a rewritten history starts another; the
items of every segment share one numbering; calls made at once each extend the conversation they were sent."""

from __future__ import annotations

import asyncio
from typing import Any

from gym_bridge.capture.assembly import assemble
from gym_bridge.capture.chat_session import ChatCaptureSession
from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.policy import ChatRequest, SamplingParams, ScriptedPolicy
from gym_bridge.core.transcript import MessageTranscript, ServedTranscript
from gym_bridge.core.turn import CallTokens, Turn

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {}}}}]
CALL = '<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>'


def session(template: Any, texts: list[Any], **kwargs: Any) -> CaptureSession:
    return CaptureSession(policy=ScriptedPolicy({"": texts}), template=template,
                          ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=32),
                          limits=Limits(max_turns=10, max_completion_tokens=1000), model_name="m", label="s", **kwargs))


def view(transcript: ServedTranscript | MessageTranscript) -> tuple[list[int], list[int], list[int], list[float]]:
    tokens = transcript.finish()
    return tokens.prompt_ids, tokens.completion_ids, tokens.completion_mask, tokens.completion_logprobs


def test_a_token_session_extends_one_transcript_per_segment(smol_template, turn) -> None:
    capture = session(smol_template, [turn(CALL), turn("Two."), turn("Fresh."), turn("More.")])

    async def main() -> list[ServedTranscript]:
        segments = []
        first = [{"role": "user", "content": "add"}]
        answer = (await capture.chat_completions({"messages": first, "tools": TOOLS}))["choices"][0]["message"]
        tool = {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "2"}
        await capture.chat_completions({"messages": [*first, answer, tool], "tools": TOOLS})
        segments.append(capture._conversation)
        rewritten = [{"role": "user", "content": "start over"}]  # a rewritten history: a new segment
        answer = (await capture.chat_completions({"messages": rewritten, "tools": TOOLS}))["choices"][0]["message"]
        await capture.chat_completions({"messages": [*rewritten, answer, {"role": "user", "content": "go on"}], "tools": TOOLS})
        segments.append(capture._conversation)
        return segments

    segments = asyncio.run(main())
    assembly = assemble(capture.ledger.calls)
    assert capture.ledger.token_in_calls == 2 and assembly.calls_per_segment == (2, 2)
    assert segments[0] is not segments[1]
    for transcript, segment in zip(segments, assembly.segments):  # the transcript is the assembly's segment, token for token
        assert view(transcript) == (segment.prompt_ids, segment.completion_ids, segment.completion_mask, segment.completion_logprobs)
    # one numbering over both segments: rs/msg/fc items numbered 1..n in order, never twice
    numbered = [item["id"] for item in capture.ledger.output if "id" in item]
    assert numbered == ["fc_s_1", "msg_s_2", "msg_s_3", "msg_s_4", "msg_s_5"]  # call, answer; answer; user 'go on', answer
    assert [item["type"] for item in capture.ledger.output] == ["function_call", "function_call_output", "message", "message", "message", "message"]


def test_calls_made_at_once_each_extend_what_they_were_sent(smol_template, turn) -> None:
    capture = session(smol_template, [turn("Hi."), turn("A."), turn("B.")], max_parallel_calls=2)

    async def main() -> None:
        first = [{"role": "user", "content": "hello"}]
        answer = (await capture.chat_completions({"messages": first}))["choices"][0]["message"]
        await asyncio.gather(*(capture.chat_completions({"messages": [*first, answer, {"role": "user", "content": f"ask {name}"}]})
                               for name in ("alpha", "beta")))

    asyncio.run(main())
    base = capture.ledger.calls[0].prompt_ids + capture.ledger.calls[0].completion_ids
    assert capture.ledger.token_in_calls == 2
    for call, name, other in ((capture.ledger.calls[1], "alpha", "beta"), (capture.ledger.calls[2], "beta", "alpha")):
        assert call.prompt_ids[:len(base)] == base
        added = smol_template.decode(call.prompt_ids[len(base):])
        assert f"ask {name}" in added and other not in added  # not the other call's message


class TokenChat:
    """A chat server's ids: call 2 extends call 1, call 3 does not (the server re-rendered the history)."""

    PROMPTS = ([1, 2], [1, 2, 41, 5, 6], [1, 9])

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, request: ChatRequest) -> Turn:
        prompt = self.PROMPTS[self.calls]
        self.calls += 1
        return Turn(text=f"answer {self.calls}", tokens=CallTokens(prompt_token_ids=prompt, generation_token_ids=[40 + self.calls],
                                                                       generation_log_probs=[-0.5]))


def test_a_chat_session_grows_a_transcript_while_the_servers_ids_extend_it() -> None:
    capture = ChatCaptureSession(policy=TokenChat(),
                                 ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=32), limits=Limits(max_turns=10),
                                 model_name="m", label="c"))

    async def main() -> list[MessageTranscript]:
        segments = []
        first = [{"role": "user", "content": "q"}]
        answer = (await capture.chat_completions({"messages": first}))["choices"][0]["message"]
        await capture.chat_completions({"messages": [*first, answer, {"role": "user", "content": "and?"}]})
        segments.append(capture._conversation)
        await capture.chat_completions({"messages": [{"role": "user", "content": "new"}]})
        segments.append(capture._conversation)
        return segments

    first, second = asyncio.run(main())
    assert capture.ledger.token_in_calls == 1 and first is not second
    assert view(first) == ([1, 2], [41, 5, 6, 42], [1, 0, 0, 1], [-0.5, 0.0, 0.0, -0.5])  # 5 6: the server's rendering of 'and?'
    assert view(second) == ([1, 9], [43], [1], [-0.5])
    assert [item["id"] for item in capture.ledger.output] == ["msg_c_1", "msg_c_2", "msg_c_3", "msg_c_4"]  # answer, user 'and?', answer, answer
