"""Real multi-turn rollouts of the embedded model keep the token invariants.

The tiny model rarely calls a tool on its own, so each rollout's first turn is a scripted tool
call; every later turn is sampled by the real model after the real rendered tool output.
"""

import asyncio
from dataclasses import dataclass, field

import pytest

from gym_bridge import Engine, EngineConfig, Generation, GenerationRequest, Limits, SamplingParams, get_environment, load_tasks
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.policies.transformers import TransformersPolicy
from tests.support.invariants import assert_token_invariants


@dataclass
class FirstTurnScripted:
    """Answers each session's first call with `first`, then defers to the real policy."""

    first: Generation
    real: TransformersPolicy
    seen: set[str] = field(default_factory=set)
    real_calls: int = 0

    async def generate(self, request: GenerationRequest) -> Generation:
        if request.session_id not in self.seen:
            self.seen.add(request.session_id)
            return self.first
        self.real_calls += 1
        return await self.real.generate(request)


@pytest.mark.slow  # about 15-20 s; by default: the embedded model under eval via serve-model and its local parity (serve/test_eval_over_http.py)
def test_real_model_continues_after_tool_outputs_with_exact_tokens(smol_tokenizer):
    real = TransformersPolicy.from_pretrained(None)
    template = ChatTemplate(real.tokenizer, eos_token_ids=sorted(real.eos_token_ids))
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    ids = smol_tokenizer.encode(call, add_special_tokens=False) + [smol_tokenizer.eos_token_id]
    policy = FirstTurnScripted(first=Generation(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop"), real=real)
    engine = Engine(policy, template, EngineConfig(
        sampling=SamplingParams(temperature=0.8, max_new_tokens=40, seed=1), limits=Limits(max_turns=3)))
    tasks = load_tasks(get_environment("weather").example_data, limit=3)

    async def run():
        return [record async for record in engine.stream(tasks, repeats=2)]

    records = asyncio.run(run())
    real.close()
    assert policy.real_calls >= 6
    for record in records:
        row = record.to_dict()
        assert record.failure_kind is None and record.reward == 1.0  # the scripted call counts
        assert record.turns >= 2 and record.tool_calls >= 1
        assert_token_invariants(row)
        mask = row["tokens"]["completion_mask"]
        # model, env (tool output + generation prompt), model: both kinds of token run are present
        assert mask[0] == 1 and 0 in mask and mask[-1] == 1
        text = smol_tokenizer.decode(row["tokens"]["completion_ids"])
        assert '<|im_start|>tool\n{"city": "Oslo", "weather_description": "The weather in Oslo is cold."}<|im_end|>' in text
