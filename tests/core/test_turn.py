"""One model turn, converted once per form: its Responses items, its assistant message; and the one reader each of a
content list's text and of a trajectory's answer."""

from __future__ import annotations

from gym_bridge.core.conversation import assistant_message
from gym_bridge.core.items import content_text, item_text, turn_items
from gym_bridge.core.trajectory import final_text
from gym_bridge.core.turn import CallTokens, ToolCall, Turn

TOKENS = CallTokens(prompt_token_ids=[1, 2], generation_token_ids=[3, 4], generation_log_probs=[-0.5, -0.25])
CALLS = (ToolCall(id="call_a", name="add", arguments='{"n": 1}'), ToolCall(id="call_b", name="add", arguments='{"n": 2}'))


def test_a_turn_that_calls_tools_has_its_items_in_order_and_the_last_carries_the_call_tokens():
    turn = Turn(reasoning="think", text="", calls=CALLS, tokens=TOKENS, policy_version=7)
    items = turn_items(turn, reasoning_id="rs_1", message_id="", call_item_ids=["fc_2", "fc_3"])
    assert [(item["type"], item["id"]) for item in items] == [("reasoning", "rs_1"), ("function_call", "fc_2"), ("function_call", "fc_3")]
    assert [item.get("call_id") for item in items[1:]] == ["call_a", "call_b"]  # each call named as the turn names it
    last = items[-1]
    assert (last.get("prompt_token_ids"), last.get("generation_token_ids"), last.get("generation_log_probs")) == ([1, 2], [3, 4], [-0.5, -0.25])
    assert last.get("policy_version") == 7
    assert all("prompt_token_ids" not in item and "policy_version" not in item for item in items[:-1])


def test_an_answer_without_tokens_is_one_message_item_with_no_token_fields():
    (item,) = turn_items(Turn(text="It is 4."), reasoning_id="", message_id="msg_1", call_item_ids=[])
    assert item["type"] == "message" and item_text(item) == "It is 4." and "prompt_token_ids" not in item


def test_the_assistant_message_of_a_turn():
    message = assistant_message(Turn(reasoning="think", calls=CALLS, tokens=TOKENS))
    assert message["content"] is None  # only calls: no content, as the chat API sends it
    assert [call["id"] for call in message.get("tool_calls", [])] == ["call_a", "call_b"]
    assert message.get("reasoning_content") == "think" and message.get("generation_token_ids") == [3, 4]
    plain = assistant_message(Turn(text="Hi."))
    assert plain == {"role": "assistant", "content": "Hi."}  # no calls, reasoning or tokens: no such keys


def test_one_reader_for_a_content_list_and_one_for_a_trajectorys_answer():
    assert content_text([{"type": "output_text", "text": "a"}, {"type": "input_text", "text": "b"}, {"type": "refusal"}]) == "ab"
    assert content_text("plain") == "plain" and content_text(None) == ""
    output = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "first"}]},
              {"type": "function_call", "call_id": "c", "name": "add", "arguments": "{}"},
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]},
              {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "last"}]}]
    assert final_text(output) == "last" and final_text(output[:3]) == "first" and final_text([]) == ""
