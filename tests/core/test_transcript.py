"""The two transcripts behind one protocol: a loop written against `RolloutContext` runs unchanged
over a token policy and a chat policy, and both write the same Responses items."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from gym_bridge.core.agent_loop import RolloutContext
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, tool
from gym_bridge.core.items import TOKEN_FIELDS
from gym_bridge.core.policy import Generation, ScriptedChatPolicy, ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.transcript import MessageTranscript, TokenTranscript, named_calls, sampled_turn, transcript_starter
from gym_bridge.core.turn import CallTokens, ToolCall, Turn
from gym_bridge.policies.embedded import load_embedded_tokenizer

CALL = '<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'


class LookupEnv(Environment):
    name = "transcript_lookup"
    inline_sync_tools = True

    @tool
    def lookup(self, key: str) -> dict[str, str]:
        """Look a key up."""
        return {"value": key.upper()}

    def verify(self, task, output):
        return 1.0


class AskTwiceLoop:
    """A custom loop using every step of the context: generate, call a tool, append its output,
    append a user message, generate again."""

    async def run(self, ctx: RolloutContext) -> str:
        step = await ctx.generate()
        assert step is not None
        turn = step
        outputs = [await ctx.call_tool(call) for call in turn.calls]
        assert await ctx.append_tool_outputs_async(outputs)
        assert await ctx.generate() is not None
        assert await ctx.append_user_message_async("And b?")
        assert await ctx.generate() is not None
        return "answer"


class AskTwiceEnv(LookupEnv):
    name = "transcript_ask_twice"
    agent_loop = AskTwiceLoop()


register(LookupEnv)
register(AskTwiceEnv)


def scripted_chat(texts: list[str]) -> ScriptedChatPolicy:
    """A chat policy answering with the next text, each turn reporting 1 input and 2 output tokens."""
    return ScriptedChatPolicy({"": [Turn(text=text, usage={"input_tokens": 1, "output_tokens": 2}) for text in texts]})


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(load_embedded_tokenizer())


def token_policy(template: ChatTemplate, texts: list[str]) -> ScriptedPolicy:
    tokenizer = template.tokenizer
    turns = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        turns.append(Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop"))
    return ScriptedPolicy({"": turns})


def run(policy, template, env: str):
    task = parse_task({"responses_create_params": {"input": "Look up a."}, "environment": env}, index=3)
    return asyncio.run(Engine(policy, template, EngineConfig()).rollout(task))


def without_tokens(output):
    return [{key: value for key, value in item.items() if key not in TOKEN_FIELDS} for item in output]


@pytest.mark.parametrize("env", ["transcript_lookup", "transcript_ask_twice"])
def test_token_and_chat_policies_write_the_same_items(template, env):
    texts = [CALL, "It is A.", "B is unknown."]
    tokens = run(token_policy(template, texts), template, env)
    chat_policy = scripted_chat(texts)
    chat = run(chat_policy, None, env)
    assert tokens.failure_kind is None and chat.failure_kind is None, (tokens.failure_reason, chat.failure_reason)
    assert without_tokens(tokens.output) == without_tokens(chat.output)
    assert [item["type"] for item in tokens.output][:3] == ["function_call", "function_call_output", "message"]
    # the chat policy saw the tool output (and the user message) as chat messages
    last = chat_policy.requests[-1].messages
    assert any(m["role"] == "tool" and json.loads(m["content"]) == {"value": "A"} for m in last)
    assert (last[-1]["role"] == "user") == (env == "transcript_ask_twice")
    # the token record streams what the template rendered; the chat record has no tokens
    assert tokens.tokens.completion_ids and 0 in tokens.tokens.completion_mask
    assert chat.tokens.completion_ids == [] and chat.usage()["output_tokens"] == 2 * len(chat_policy.requests)


def test_generate_returns_each_call_with_its_record_id(template):
    record_ids: list[str] = []

    class Loop:
        async def run(self, ctx: RolloutContext) -> str:
            step = await ctx.generate()
            assert step is not None
            record_ids.extend(call.id or "" for call in step.calls)
            return "answer"

    class Env(LookupEnv):
        name = "transcript_ids"
        agent_loop = Loop()

    register(Env)
    record = run(token_policy(template, [CALL + CALL.replace('"a"', '"b"')]), template, "transcript_ids")
    assert record_ids == [item["call_id"] for item in record.output if item["type"] == "function_call"]
    assert len(set(record_ids)) == 2


def test_the_starter_picks_the_transcript_once_by_policy_kind(template):
    from gym_bridge.core.trajectory import Trajectory

    task = parse_task({"responses_create_params": {"input": "Hi"}, "environment": "transcript_lookup"}, index=0)
    start = {"task": task, "tools": (), "session_id": "0-0", "max_tokens": 100}
    tokens = transcript_starter(token_policy(template, ["x"]), template)(trajectory=Trajectory(prompt_ids=[]), **start)
    assert isinstance(tokens, TokenTranscript) and tokens.trajectory.prompt_ids == template.prompt_ids(task.messages, None)
    messages = transcript_starter(scripted_chat(["x"]), None)(trajectory=Trajectory(prompt_ids=[]), **start)
    assert isinstance(messages, MessageTranscript) and messages.messages == list(task.messages)
    with pytest.raises(ValueError, match="needs a ChatTemplate"):
        transcript_starter(token_policy(template, ["x"]), None)
    with pytest.raises(TypeError, match="neither generate"):
        transcript_starter(object(), template)  # type: ignore[arg-type]


def test_a_token_transcript_refuses_what_does_not_fit_and_appends_nothing(template):
    from gym_bridge.core.template.messages import ToolOutput
    from gym_bridge.core.trajectory import Trajectory

    task = parse_task({"responses_create_params": {"input": "Hi"}, "environment": "transcript_lookup"}, index=0)
    trajectory = Trajectory(prompt_ids=[])
    transcript = TokenTranscript(token_policy(template, ["x"]), template, task=task, tools=(), trajectory=trajectory,
                                 session_id="0-0", max_tokens=20)
    assert not asyncio.run(transcript.append_tool_outputs([ToolOutput(name="lookup", content="word " * 50, call_id="c")]))
    assert not asyncio.run(transcript.append_user_message("word " * 50))
    assert trajectory.completion_ids == [] and trajectory.output == []
    assert asyncio.run(transcript.append_user_message("ok"))
    assert trajectory.completion_mask and set(trajectory.completion_mask) == {0}
    assert [item["role"] for item in trajectory.output] == ["user"]  # type: ignore[typeddict-item]


def test_template_decode_gives_the_tokenizers_text(template):
    tokenizer = template.tokenizer
    text = "<|im_start|>assistant\nHé, 12 × 3 = 36 !  <tool_call>{\"a\": [1]}</tool_call><|im_end|>\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert template.decode(ids) == tokenizer.decode(ids, skip_special_tokens=False) == text
    for start in range(0, 2000, 97):  # arbitrary runs of ids, split characters included
        run_ids = list(range(start, start + 40))
        assert template.decode(run_ids) == tokenizer.decode(run_ids, skip_special_tokens=False)


def test_template_decode_defers_to_a_tokenizer_that_cleans_up_spaces(template):
    tokenizer = load_embedded_tokenizer()
    tokenizer.clean_up_tokenization_spaces = True
    calls: list[list[int]] = []
    original = tokenizer.decode

    def decode(ids, skip_special_tokens=False, **kwargs):
        calls.append(list(ids))
        return original(ids, skip_special_tokens=skip_special_tokens, **kwargs)

    tokenizer.decode = decode
    cleaning = ChatTemplate(tokenizer)
    calls.clear()
    ids = tokenizer.encode("a , b .", add_special_tokens=False)
    assert cleaning.decode(ids) == original(ids, skip_special_tokens=False)
    assert calls == [ids]


def test_a_served_transcript_extends_only_with_tool_or_user_messages_and_copies(template):
    """The capture endpoint's transcript: the prefix rule on messages (same tools, only tool or user messages
    added), the new messages' tokens appended to a copy (calls made at once each extend what they were sent),
    one item numbering shared by the copies."""
    from gym_bridge.core.transcript import ItemIds, ServedTranscript

    tools = ({"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}},)
    first = [{"role": "user", "content": "Hi"}]
    numbering, output = ItemIds("s"), []
    start = asyncio.run(ServedTranscript.start(token_policy(template, ["x"]), template, messages=first, tools=tools,
                                               session_id="s", max_tokens=100, numbering=numbering, output=output))
    assert start.tokens.trajectory.prompt_ids == template.prompt_ids(first, list(tools))
    user, tool = {"role": "user", "content": "more"}, {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert start.extension([*first, user, tool], tools) == [user, tool]
    assert start.extension([*first, user], ()) is None  # other tools: a rewrite
    assert start.extension([*first, {"role": "assistant", "content": "made up"}], tools) is None
    assert start.extension([{"role": "user", "content": "Bye"}], tools) is None and start.extension(first, tools) is None
    extended = asyncio.run(start.extended([user, tool]))
    assert start.tokens.trajectory.completion_ids == [] and start.messages == first  # the original is left as it was
    added = extended.tokens.trajectory.completion_ids
    assert extended.tokens.trajectory.prompt_ids == start.tokens.trajectory.prompt_ids and set(extended.tokens.trajectory.completion_mask) == {0}
    assert "more" in template.decode(added) and "42" in template.decode(added) and extended.messages == [*first, user, tool]
    assert [(item["type"], item.get("id")) for item in output] == [("message", "msg_s_1"), ("function_call_output", None)]
    assert extended.tokens.writer.item_ids is start.tokens.writer.item_ids is numbering


def test_a_sampled_turn_keeps_every_field_the_parsers_read_and_takes_the_rest_from_the_call():
    """`sampled_turn` writes the turn out field by field (no `dataclasses.replace` per turn on the hot path): a field
    added to `Turn` and not carried over fails here."""
    parsed = Turn(reasoning="think", text="said", calls=(ToolCall(name="lookup", arguments="{}", error="bad"),),
                  unparsed_tool_call=True, usage={"input_tokens": 3})
    generation = Generation(token_ids=[5, 6], logprobs=[-0.1, -0.2], finish_reason="length", policy_version=4)
    named = (ToolCall(id="call_1", name="lookup", arguments="{}", error="bad"),)
    turn = sampled_turn(parsed, generation, [1, 2], calls=named)
    set_here = {"calls": named, "tokens": CallTokens([1, 2], [5, 6], [-0.1, -0.2]), "finish_reason": "length", "policy_version": 4}
    for field in dataclasses.fields(Turn):
        expected = set_here.get(field.name, getattr(parsed, field.name))
        assert getattr(turn, field.name) == expected, field.name
    assert all(getattr(parsed, name) != value for name, value in set_here.items())  # each set field differs from the parsed one
    assert sampled_turn(parsed, generation, [1, 2]).calls == parsed.calls


def test_named_calls_keep_each_calls_fields_but_its_id():
    call = ToolCall(id="written", name="lookup", arguments='{"key": "a"}', error="why")
    (named,) = named_calls([call], ["call_7"], lambda item_id, c: f"{item_id}:{c.id}")
    assert named == dataclasses.replace(call, id="call_7:written")
    assert {field.name for field in dataclasses.fields(ToolCall)} == {"id", "name", "arguments", "error"}  # a new field: carry it in named_calls
