"""`build_policy`: each spec kind builds its policy with the spec's settings; a missing extra names the install command."""

from __future__ import annotations

import asyncio
import sys
import types
from typing import Any

import pytest

from gym_bridge.core.errors import GymBridgeError, MissingDependencyError
from gym_bridge.core.policy import GenerationRequest, Policy, SamplingParams
from gym_bridge.policies.chat_api import ChatAPIPolicy
from gym_bridge.policies.factory import PolicySpec, build_policy
from gym_bridge.policies.remote import RemotePolicy
from gym_bridge.policies.routed_chat import RoutedChatPolicy
from gym_bridge.policies.transformers import TransformersPolicy
from gym_bridge.policies.vllm_engine import VLLMEnginePolicy


def _generates(policy: TransformersPolicy) -> list[int]:
    async def main() -> list[int]:
        generation = await policy.generate(GenerationRequest(prompt_ids=[1, 2, 3], sampling=SamplingParams(temperature=0, max_new_tokens=3)))
        await policy.aclose()
        return generation.token_ids

    return asyncio.run(main())


def test_transformers_kind_loads_the_named_folder(tiny_model_dir) -> None:
    policy = build_policy(PolicySpec(kind="transformers", model=str(tiny_model_dir)))
    assert isinstance(policy, TransformersPolicy) and isinstance(policy, Policy)
    assert policy.model.config.num_hidden_layers == 2
    assert len(_generates(policy)) == 3


def test_transformers_kind_takes_the_batching_settings(tiny_model_dir) -> None:
    policy = build_policy(PolicySpec(kind="transformers", model=str(tiny_model_dir), device="cpu", max_batch_size=3, batch_wait_s=0.02,
                                     max_batch_tokens=500, release_memory_above_tokens=1000))
    assert isinstance(policy, TransformersPolicy) and policy.device.type == "cpu"
    assert (policy.max_batch_size, policy.batch_wait_s, policy.max_batch_tokens, policy.release_memory_above_tokens) == (3, 0.02, 500, 1000)


def test_embedded_kind_loads_the_embedded_model_whatever_the_model_field(tiny_model_dir, monkeypatch) -> None:
    import gym_bridge.policies.embedded as embedded

    monkeypatch.setattr(embedded, "embedded_model_path", lambda: tiny_model_dir)  # the tiny model stands in for SmolLM2
    policy = build_policy(PolicySpec(kind="embedded", model="/no/such/folder"))
    assert isinstance(policy, TransformersPolicy) and policy.model.config.num_hidden_layers == 2


def test_remote_kind_builds_a_remote_policy_with_the_spec_settings() -> None:
    policy = build_policy(PolicySpec(kind="remote", model="served", base_urls=("http://a:1/v1", "http://b:2/v1"), api_key="k",
                                     request_timeout_s=7.0, max_retries=1))
    assert isinstance(policy, RemotePolicy)
    assert [url.split("/v1")[0] for url in policy.base_urls] == ["http://a:1", "http://b:2"]
    assert (policy.model, policy.request_timeout_s, policy.max_retries) == ("served", 7.0, 1)
    default = build_policy(PolicySpec(kind="remote", model="served", base_urls=("http://a:1/v1",)))
    assert isinstance(default, RemotePolicy) and default.max_retries == RemotePolicy.__init__.__kwdefaults__["max_retries"]


def test_chat_kind_builds_a_chat_api_policy() -> None:
    policy = build_policy(PolicySpec(kind="chat", model="gpt", base_urls=("http://a:1/v1",), api="responses", max_retries=0))
    assert isinstance(policy, ChatAPIPolicy) and not isinstance(policy, Policy)
    assert (policy.model, policy.api, policy.max_retries) == ("gpt", "responses", 0)


def test_chat_kind_over_several_servers_or_without_a_name_builds_the_routed_chat_policy() -> None:
    """Issue 37 item 7: the routed chat policy `gym-bridge serve` calls NeMo RL through is built here (it was built
    beside the agent server); its servers' policies are made on the first call, with the spec's options."""
    routed = build_policy(PolicySpec(kind="chat", model="m", base_urls=("http://a:1/v1", "http://b:1"), token_ids=True,
                                     request_timeout_s=7.0, max_retries=1))
    assert isinstance(routed, RoutedChatPolicy) and not isinstance(routed, Policy)
    assert routed.base_urls == ["http://a:1/v1", "http://b:1/v1"] and routed.router.urls == routed.base_urls
    servers = asyncio.run(routed._servers())
    assert [(s.model, s.base_url, s.token_ids, s.request_timeout_s, s.max_retries) for s in servers] == [
        ("m", "http://a:1/v1", True, 7.0, 1), ("m", "http://b:1/v1", True, 7.0, 1)]
    unnamed = build_policy(PolicySpec(kind="chat", base_urls=("http://a:1/v1",)))
    assert isinstance(unnamed, RoutedChatPolicy) and unnamed.model_name is None  # asks the server on the first call


@pytest.mark.parametrize("spec, message", [
    (PolicySpec(kind="remote", model="m"), "base URL"),
    (PolicySpec(kind="remote", base_urls=("http://a:1/v1",)), "served model's name"),
    (PolicySpec(kind="chat", model="m"), "base URL"),
    (PolicySpec(kind="gpu"), "policy kind must be one of"),  # type: ignore[arg-type]
])
def test_settings_that_do_not_fit_the_kind_are_named(spec: PolicySpec, message: str) -> None:
    with pytest.raises(GymBridgeError, match=message):
        build_policy(spec)


def test_vllm_kind_builds_an_engine_with_the_spec_settings(monkeypatch) -> None:
    built: list[dict[str, Any]] = []

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            built.append(kwargs)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))  # a real engine takes minutes: test_vllm_real.py
    policy = build_policy(PolicySpec(kind="vllm", model="/models/m", seed=3, logprobs_mode="processed", gpu_memory_utilization=0.5))
    assert isinstance(policy, VLLMEnginePolicy) and isinstance(policy.llm, LLM)
    assert built[0]["model"] == "/models/m" and built[0]["seed"] == 3
    assert built[0]["logprobs_mode"] == "processed_logprobs" and built[0]["gpu_memory_utilization"] == 0.5


def test_a_missing_vllm_gives_the_install_hint(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(MissingDependencyError, match=r"gym-bridge\[vllm\]"):
        build_policy(PolicySpec(kind="vllm", model="/models/m"))


def test_a_missing_transformers_gives_the_install_hint(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gym_bridge.policies.transformers", None)
    with pytest.raises(MissingDependencyError, match=r"a transformers policy needs torch and transformers .*pip install 'gym-bridge\[local\]'"):
        build_policy(PolicySpec(kind="transformers"))
