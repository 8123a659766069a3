"""A model turn cut at its token limit, then a user message (a loop that goes on, as BFCL's does): the appended
tokens close the cut turn as the chat template renders it (the end-of-turn token the model did not sample is an
environment token), so every later prompt is the template's own rendering of the conversation, in every
append-only family; `conversation` gives the user messages an environment added."""

from __future__ import annotations

import asyncio

import pytest

from gym_bridge.core.agent_loop import RolloutContext
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment
from gym_bridge.core.items import message_item, user_message_item
from gym_bridge.core.policy import Generation, ScriptedPolicy
from gym_bridge.core.registry import register
from gym_bridge.core.task import parse_task
from gym_bridge.core.template.chat_template import ChatTemplate
from tests.support.families import MINI_FAMILIES, REAL_FAMILIES, SHARED_TEMPLATES, TEMPLATES_MISSING, family_tokenizer, prompt_mismatches
from tests.support.invariants import assert_token_invariants

CUT = "The first step is to look at the fi"


class CutThenAskLoop:
    """Generate (the scripted turn is cut), append a user message, generate the answer."""

    async def run(self, ctx: RolloutContext) -> str:
        first = await ctx.generate()
        assert first is not None and first.finish_reason == "length"
        assert await ctx.append_user_message_async("Go on, please.")
        assert await ctx.generate() is not None
        return "answer"


class CutThenAskEnv(Environment):
    name = "transcript_cut_then_ask"
    agent_loop = CutThenAskLoop()

    def verify(self, task, output):
        return 1.0


register(CutThenAskEnv)

real_present = pytest.mark.skipif(not SHARED_TEMPLATES.is_dir(), reason=TEMPLATES_MISSING)
FAMILIES = [pytest.param(None, id="SmolLM2")] + [
    pytest.param(f, id=f.label, marks=real_present) for f in REAL_FAMILIES if f.append_only] + [
    pytest.param(f, id=f.label) for f in MINI_FAMILIES if f.append_only]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_user_message_after_a_cut_turn_closes_it_as_the_template_renders_it(family, smol_tokenizer) -> None:
    if family is None:
        tokenizer, template = smol_tokenizer, ChatTemplate(smol_tokenizer)
    else:
        tokenizer, eos_ids = family_tokenizer(smol_tokenizer, family)
        template = ChatTemplate(tokenizer, eos_token_ids=eos_ids)
    cut_ids = tokenizer.encode(CUT, add_special_tokens=False)
    answer_ids = tokenizer.encode("Done.", add_special_tokens=False) + [template.end_of_turn_id]
    policy = ScriptedPolicy({"": [Generation(token_ids=cut_ids, logprobs=[-0.5] * len(cut_ids), finish_reason="length"),
                                  Generation(token_ids=answer_ids, logprobs=[-0.5] * len(answer_ids), finish_reason="stop")]})
    task = parse_task({"responses_create_params": {"input": "Move the file."}, "environment": CutThenAskEnv.name}, index=0)
    record = asyncio.run(Engine(policy, template, EngineConfig()).rollout(task))
    assert record.failure_kind is None, record.failure_reason
    row = record.to_dict()
    assert_token_invariants(row)
    assert prompt_mismatches(record, template, tokenizer) == []  # the second prompt: the template's rendering, cut turn closed
    tokens = row["tokens"]
    after_cut = len(cut_ids)  # the first token after the cut turn: the end of turn it did not sample, an environment token
    assert tokens["completion_ids"][:after_cut] == cut_ids
    assert tokens["completion_mask"][after_cut] == 0 and tokens["completion_logprobs"][after_cut] == 0.0
    assert template.decode(tokens["completion_ids"][after_cut:after_cut + 1]) in template.end_texts


def test_conversation_gives_the_user_messages_an_environment_added(smol_tokenizer) -> None:
    template = ChatTemplate(smol_tokenizer)
    ids = smol_tokenizer.encode("Hi", add_special_tokens=False)
    first = {**message_item("Hi", item_id="m0"), "generation_token_ids": ids, "prompt_token_ids": [], "generation_log_probs": [0.0]}
    output = [first, user_message_item("And then?", item_id="m1"), message_item("Then done.", item_id="m2")]
    messages = template.conversation(output)
    assert [message["role"] for message in messages[:2]] == ["assistant", "user"]
    assert messages[1]["content"] == "And then?"
