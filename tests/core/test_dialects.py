"""The dialects layer: Responses items, chat-completions messages and tools, and the template's view,
converted there and back."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gym_bridge.core.dialects.chat import (
    ApiError, ChatBody, MessageIn, ToolIn, from_chat_tool, to_chat_tool, to_openai_messages, tool_call_arguments,
)
from gym_bridge.core.dialects.responses import from_chat_messages, to_messages, to_responses_tool
from gym_bridge.core.items import item_text
from gym_bridge.core.dialects.responses_api import output_items
from gym_bridge.core.dialects.template_view import template_messages, to_template_tool
from gym_bridge.core.items import (
    function_call_item, function_call_output_item, message_item, reasoning_item, user_message_item,
)
from gym_bridge.core.template.chat_template import ChatTemplate
from tests.support.families import MINI_FAMILIES, family_tokenizer

WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


# -- item text --------------------------------------------------------------------------------


def test_item_text_of_each_item_type():
    assert item_text(message_item("Sunny, 21 C.", item_id="msg_1")) == "Sunny, 21 C."
    assert item_text(user_message_item("And tomorrow?", item_id="msg_2")) == "And tomorrow?"
    assert item_text(reasoning_item("Look it up first.", item_id="rs_1")) == "Look it up first."
    # several parts are joined in order; parts that are not objects are skipped
    two_parts = {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "Sun"}, "stray", {"type": "output_text", "text": "ny."}]}
    assert item_text(two_parts) == "Sunny."
    assert item_text({"type": "reasoning", "summary": [{"text": "a"}, {"text": "b"}]}) == "ab"
    assert item_text({"type": "message", "role": "user", "content": "plain string"}) == "plain string"
    # calls and their outputs have no text of their own
    assert item_text(function_call_item("get_weather", '{"city": "Paris"}', call_id="call_1", item_id="fc_1")) == ""
    assert item_text(function_call_output_item('{"t": 21}', call_id="call_1")) == ""


# -- Responses items <-> chat messages ---------------------------------------------------------


def test_task_input_items_become_chat_messages():
    task_input = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"role": "user", "content": "Weather in Paris?"},
        reasoning_item("dropped: chat messages carry no reasoning", item_id="rs_1"),
        function_call_item("get_weather", '{"city": "Paris"}', call_id="call_1", item_id="fc_1"),
        function_call_output_item('{"t": 21}', call_id="call_1"),
    ]
    # one converter for task inputs and /v1/responses requests: the call keeps its id, the output names it
    assert to_messages(task_input) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 21}'},
    ]
    assert to_messages("hi") == [{"role": "user", "content": "hi"}]


def test_unknown_input_entries_are_named():
    with pytest.raises(ApiError, match=r"input\[1\].role: expected user, system, developer or assistant, got 'robot'"):
        to_messages([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    with pytest.raises(ApiError, match=r"input\[0\]: items of type 'web_search_call' are not supported"):
        to_messages([{"type": "web_search_call"}])


def _qwen_like_template(smol_tokenizer) -> ChatTemplate:
    family = MINI_FAMILIES[0]  # Qwen2.5-like: structured tool calls with ids, tool messages with tool_call_id
    tokenizer, eos_ids = family_tokenizer(smol_tokenizer, family)
    return ChatTemplate(tokenizer, eos_token_ids=eos_ids)


def test_trajectory_items_to_chat_messages_and_back_keep_call_ids(smol_tokenizer):
    template = _qwen_like_template(smol_tokenizer)
    end = [template.end_of_turn_id]
    call = function_call_item("get_weather", '{"city": "Paris"}', call_id="call_abc123", item_id="fc_1")
    call["generation_token_ids"] = template.encode('<tool_call>\n{"name": "get_weather"}\n</tool_call>') + end  # ends model call 1
    answer = message_item("Sunny, 21 C.", item_id="msg_2")
    answer["generation_token_ids"] = template.encode("Sunny, 21 C.") + end  # ends model call 2
    output = [reasoning_item("Look it up first.", item_id="rs_1"), call,
              function_call_output_item('{"t": 21}', call_id="call_abc123"), answer]

    messages = template.conversation(output)
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[1] == {"role": "tool", "name": "get_weather", "content": '{"t": 21}', "tool_call_id": "call_abc123"}

    back = from_chat_messages(messages)
    # reasoning is not part of chat input; every call keeps its id, name and arguments, every output its call's id
    assert [(item["type"], item.get("call_id")) for item in back] == [
        ("function_call", "call_abc123"), ("function_call_output", "call_abc123"), ("message", None)]
    assert back[0]["name"] == "get_weather"
    arguments = back[0]["arguments"]
    assert (json.loads(arguments) if isinstance(arguments, str) else arguments) == {"city": "Paris"}
    assert back[1]["output"] == '{"t": 21}'
    assert item_text(back[2]) == item_text(answer) == "Sunny, 21 C."


def test_chat_policy_messages_to_responses_input_and_back():
    arguments = '{"city": "Paris"}'
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": '{"t": 21}'},
    ]
    items = from_chat_messages(messages)
    assert items == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": "call_7", "name": "get_weather", "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_7", "output": '{"t": 21}'},
    ]
    # and back: the same messages, the call and its output keeping the call's id
    again = to_messages(items)
    assert again == [messages[0], messages[1], {**messages[2], "content": None}, messages[3]]


# -- chat-completions messages <-> the template's view ------------------------------------------


def _wire_conversation() -> list[dict]:
    return [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "name": "get_weather", "content": '{"t": 21}'},
    ]


def test_chat_messages_to_template_view_and_back_to_the_wire():
    body = ChatBody.model_validate({"messages": _wire_conversation()})
    view = template_messages(body.messages, tool_format="native")
    assert view == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": '{"t": 21}', "name": "get_weather", "tool_call_id": "call_9"},
    ]
    wire = to_openai_messages(view)
    assert wire[2] == {"role": "assistant", "content": None, "tool_calls": view[2]["tool_calls"]}
    assert wire[3] == {"role": "tool", "tool_call_id": "call_9", "content": '{"t": 21}'}
    # the wire messages read back give the same view (the tool's name travels on the call, not the tool message)
    again = template_messages([MessageIn.model_validate(message) for message in wire], tool_format="native")
    assert again[:3] == view[:3]
    assert again[3] == {**view[3], "name": ""}


def test_template_view_writes_calls_as_text_for_templates_without_tool_support():
    body = ChatBody.model_validate({"messages": _wire_conversation()})
    view = template_messages(body.messages, tool_format="hermes_system")
    assert view[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'}


def test_token_fields_stay_on_assistant_wire_messages():
    wire = to_openai_messages([{"role": "assistant", "content": "ok", "prompt_token_ids": [1, 2], "generation_token_ids": [3],
                                "generation_log_probs": [-0.5], "name": "dropped"}])
    assert wire == [{"role": "assistant", "content": "ok", "prompt_token_ids": [1, 2], "generation_token_ids": [3],
                     "generation_log_probs": [-0.5]}]


@pytest.mark.parametrize(("arguments", "message"), [("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object")])
def test_bad_tool_call_arguments_are_a_400(arguments, message):
    with pytest.raises(ApiError, match=message) as caught:
        tool_call_arguments(arguments)
    assert caught.value.status == 400
    assert tool_call_arguments(None) == {}
    assert tool_call_arguments({"a": 1}) == {"a": 1}


# -- tool schemas: Responses <-> chat <-> template ---------------------------------------------


def test_tool_schemas_responses_to_chat_to_template_and_back():
    chat = to_chat_tool(WEATHER)
    assert chat == {"type": "function", "function": WEATHER}
    assert to_template_tool(WEATHER) == chat  # templates get the chat-completions shape
    back = from_chat_tool(ToolIn.model_validate(chat))
    assert back == {"type": "function", **WEATHER}
    assert to_responses_tool(WEATHER) == back
    assert to_chat_tool(back) == chat


def test_a_schema_without_parameters_gets_an_empty_object_schema_each_way():
    empty = {"type": "object", "properties": {}}
    assert to_chat_tool({"name": "now"})["function"] == {"name": "now", "description": "", "parameters": empty}
    assert from_chat_tool(ToolIn.model_validate({"function": {"name": "now"}})) == {
        "type": "function", "name": "now", "description": "", "parameters": empty}
    assert to_responses_tool({"name": "now"})["parameters"] == empty


# -- boundaries -----------------------------------------------------------------------------


def test_dialects_and_the_capture_session_load_no_web_framework_or_trainer():
    heavy = ["fastapi", "starlette", "uvicorn", "torch", "transformers", "trl", "verl", "vllm", "ray"]
    code = (
        "import sys, gym_bridge.core.dialects.chat, gym_bridge.core.dialects.responses, "
        "gym_bridge.core.dialects.template_view, gym_bridge.capture.session\n"
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


def test_responses_output_items_go_back_as_the_one_assistant_message_they_came_from():
    message = {"role": "assistant", "content": "Let me add.", "reasoning_content": "sum it", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]}
    completion = {"id": "chatcmpl-x", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    items = output_items(completion)
    assert [item["type"] for item in items] == ["reasoning", "message", "function_call", "function_call"]
    outputs = [{"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "1"}]}]
    back = to_messages([{"role": "user", "content": "add"}, *items, *outputs])
    assert back[1] == {"role": "assistant", "content": "Let me add.", "tool_calls": message["tool_calls"]}
    assert back[2] == {"role": "tool", "tool_call_id": "call_1", "content": "1"} and len(back) == 3


def test_a_tasks_calls_reach_the_template_with_their_ids_and_arguments_as_objects():
    from gym_bridge.core.dialects.template_view import task_template_messages

    messages = to_messages([{"role": "user", "content": "Weather?"},
                            function_call_item("get_weather", '{"city": "Paris"}', call_id="call_1", item_id="fc_1"),
                            function_call_output_item('{"t": 21}', call_id="call_1")])
    assert task_template_messages(messages) == [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"t": 21}'},
    ]
    plain = to_messages("hi")
    assert task_template_messages(plain) is plain  # no call: the messages as they are, nothing copied
