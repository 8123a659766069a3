"""`/v1/responses` on the capture endpoint with the real `openai` client over loopback: a string
input, a function-call round trip that stays token-in (one segment, as the chat path), the same
prompt ids as the equivalent chat-completions call, streaming read by the client's own
accumulator, and 400s naming what a stateless endpoint cannot serve."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import openai
import pytest

from gym_bridge.capture import HarnessEnvironment
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.task import load_tasks
from gym_bridge.core.template.chat_template import ChatTemplate
from tests.capture.endpoint import serve

EXAMPLE = Path(__file__).parents[2] / "environments" / "harness_example" / "data" / "example.jsonl"
ADD_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>'
ADD = {"type": "function", "name": "add", "description": "Add two numbers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}


def test_a_string_input_is_answered_as_a_response_with_the_same_prompt_as_the_chat_call(smol_template, turn) -> None:
    answer = turn("12 + 30 = 42")

    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        response = await client.responses.create(model="policy", instructions="Be brief.", input="What is 12 + 30?")
        assert response.object == "response" and response.status == "completed" and response.output_text == "12 + 30 = 42"
        (item,) = response.output
        assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
        assert response.usage is not None and response.usage.output_tokens == len(answer.token_ids)
        chat = await client.chat.completions.create(model="policy", messages=[
            {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30?"}])
        assert chat.choices[0].message.content == response.output_text
        by_responses, by_chat = session.ledger.calls
        assert by_responses == by_chat and by_responses.completion_ids == answer.token_ids
        assert response.usage.input_tokens == len(by_responses.prompt_ids)

    serve(smol_template, {"": [answer, answer]}, check)


async def responses_agent(client: openai.AsyncOpenAI, task: dict[str, Any]) -> str:
    """A Responses-API tool loop: the output items go back as input with the tool's output."""
    params = task["row"]["responses_create_params"]
    items: list[Any] = list(params["input"])
    response = await client.responses.create(model=task["model"], input=items, tools=params["tools"], store=False)
    calls = [item for item in response.output if item.type == "function_call"]
    items += [item.model_dump(exclude_none=True) for item in response.output]
    for call in calls:
        arguments = json.loads(call.arguments)
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"result": arguments["a"] + arguments["b"]})})
    final = await client.responses.create(model=task["model"], input=items, tools=params["tools"], store=False)
    return final.output_text


class ResponsesHarness(HarnessEnvironment):
    name = "responses_harness"
    agent = responses_agent

    def score(self, task, answer):  # type: ignore[no-untyped-def]
        return float("42" in answer)


def test_a_function_call_round_trip_over_responses_is_token_in_and_one_segment(smol_template, turn) -> None:
    first, second = turn(ADD_CALL), turn("12 + 30 = 42")
    policy = ScriptedPolicy({"": [first, second]})
    engine = Engine(policy, smol_template, EngineConfig(sampling=SamplingParams(max_new_tokens=64), limits=Limits(),
                                                       deadline_s=60, template_check="off"))
    record = asyncio.run(engine.rollout(load_tasks(EXAMPLE)[0], env_class=ResponsesHarness)).to_dict()
    assert record["failure_kind"] is None, record["failure_reason"]
    assert record["reward"] == 1.0 and len(policy.calls) == 2
    head = list(policy.calls[0].prompt_ids) + first.token_ids
    assert list(policy.calls[1].prompt_ids[: len(head)]) == head  # the output items went back as given: token-in
    env_ids = list(policy.calls[1].prompt_ids[len(head):])
    assert '{"result": 42}' in smol_template.tokenizer.decode(env_ids)  # the agent ran its own tool
    tokens = record["tokens"]
    assert tokens["completion_ids"] == first.token_ids + env_ids + second.token_ids and "segments" not in tokens
    assert tokens["completion_mask"] == [1] * len(first.token_ids) + [0] * len(env_ids) + [1] * len(second.token_ids)
    verify = record["metrics"]["verify"]
    assert verify["segments"] == 1 and verify["token_in_calls"] == 1 and verify["endpoint_errors"] == []
    assert [item["type"] for item in record["response"]["output"]] == ["function_call", "function_call_output", "message"]


def test_a_streamed_response_reassembles_to_the_plain_one(smol_tokenizer, turn) -> None:
    think_and_call = turn("<think>add them</think>" + ADD_CALL)
    template = ChatTemplate(smol_tokenizer, reasoning_parser="qwen3")  # SmolLM2's template, `<think>` read as reasoning

    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        plain = await client.responses.create(model="policy", input="12 + 30?", tools=[ADD])
        async with client.responses.stream(model="policy", input="12 + 30?", tools=[ADD]) as stream:  # type: ignore[arg-type]
            kinds = [event.type async for event in stream]
            streamed = await stream.get_final_response()
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert "response.function_call_arguments.delta" in kinds and "response.output_item.done" in kinds
        assert [item.model_dump(exclude_none=True, exclude={"id", "call_id"}) for item in streamed.output] == \
            [item.model_dump(exclude_none=True, exclude={"id", "call_id"}) for item in plain.output]
        assert [item.type for item in plain.output] == ["reasoning", "function_call"]
        assert session.ledger.calls[0] == session.ledger.calls[1] and session.ledger.errors == []

    serve(template, {"": [think_and_call, think_and_call]}, check)


@pytest.mark.parametrize(("change", "named"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"store": True}, "store=true"),
    ({"tools": [{"type": "web_search"}]}, "'web_search'"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}, "input_image"),
    ({"input": []}, "input must not be empty"),
    ({"model": "gpt-5"}, "gpt-5"),
])
def test_what_a_stateless_endpoint_cannot_serve_is_a_clear_error_that_is_recorded(smol_template, change, named) -> None:
    async def check(session: CaptureSession, client: openai.AsyncOpenAI, base_url: str) -> None:
        with pytest.raises(openai.APIStatusError) as raised:
            await client.responses.create(**{"model": "policy", "input": "hi", **change})
        assert raised.value.status_code in (400, 404) and named in raised.value.message
        assert [error.status for error in session.ledger.errors] == [raised.value.status_code] and session.ledger.calls == []

    serve(smol_template, {"": []}, check)
