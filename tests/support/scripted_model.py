"""A scripted model for `gym-bridge serve-model`'s real app: the attributes `server.build_app` reads
of a `TransformersPolicy` (tokenizer, EOS ids, the model's context length and vocabulary size) and a
`generate` that answers from a script instead of a network, so multi-turn protocol tests are exact."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from gym_bridge.core.policy import Generation, GenerationRequest


class ScriptedModel:
    """`answer(prompt_text, request)` gives the Generation for each request; every request is kept."""

    def __init__(self, tokenizer, answer: Callable[[str, GenerationRequest], Generation], *, max_model_len: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = {tokenizer.eos_token_id}
        self.answer = answer
        self.requests: list[GenerationRequest] = []
        text_config = SimpleNamespace(max_position_embeddings=max_model_len)
        embeddings = SimpleNamespace(num_embeddings=len(tokenizer))
        self.model = SimpleNamespace(config=SimpleNamespace(get_text_config=lambda: text_config), get_input_embeddings=lambda: embeddings)

    async def generate(self, request: GenerationRequest) -> Generation:
        self.requests.append(request)
        generation = self.answer(self.tokenizer.decode(list(request.prompt_ids), skip_special_tokens=False), request)
        cap = request.sampling.max_new_tokens
        if len(generation.token_ids) > cap:
            return Generation(token_ids=generation.token_ids[:cap], logprobs=generation.logprobs[:cap], finish_reason="length")
        return generation


def by_turn(*generations: Generation, marker: str = "<|im_start|>tool") -> Callable[[str, GenerationRequest], Generation]:
    """An `answer` that picks the generation by how many tool outputs the prompt already holds."""

    def answer(prompt_text: str, request: GenerationRequest) -> Generation:
        return generations[min(prompt_text.count(marker), len(generations) - 1)]

    return answer


def finished_turns(tokenizer, texts) -> list[Generation]:
    """Each of `texts` as a finished model turn: its ids, the end-of-turn token, a log-prob of -0.5 per token."""
    turns = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        turns.append(Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop"))
    return turns
