"""Picklable engine factories for Ray workers in the scale tests and benchmarks: a scripted policy
(optionally slow, so a worker can be killed mid-run) on the embedded model's real chat template."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.policy import Generation, GenerationRequest, ScriptedPolicy

WEATHER_TURNS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "It is cold in Paris, wear a coat.")


@dataclass
class SlowPolicy:
    """A scripted policy whose every call first sleeps `delay_s`."""

    inner: ScriptedPolicy
    delay_s: float

    async def generate(self, request: GenerationRequest) -> Generation:
        await asyncio.sleep(self.delay_s)
        return await self.inner.generate(request)


def scripted_policy(tokenizer, texts=WEATHER_TURNS) -> ScriptedPolicy:  # type: ignore[no-untyped-def]
    turns: list[Generation | BaseException] = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        turns.append(Generation(token_ids=ids, logprobs=[-0.25] * len(ids), finish_reason="stop"))
    return ScriptedPolicy(script={"": turns}, record_calls=False)


@dataclass(frozen=True)
class ScriptedEngine:
    """Builds an engine whose policy answers every rollout with `texts`, one per call, after `delay_s`."""

    texts: tuple[str, ...] = WEATHER_TURNS
    delay_s: float = 0.0
    max_concurrency: int = 64

    def __call__(self) -> Engine:
        from gym_bridge.core.template.chat_template import ChatTemplate
        from gym_bridge.policies.embedded import load_embedded_tokenizer

        tokenizer = load_embedded_tokenizer()
        policy = scripted_policy(tokenizer, self.texts)
        chosen = SlowPolicy(policy, self.delay_s) if self.delay_s else policy
        return Engine(chosen, ChatTemplate(tokenizer), EngineConfig(max_concurrency=self.max_concurrency, model_name="scripted"))


def _weather_class():  # type: ignore[no-untyped-def]
    from environments.weather import WeatherEnvironment

    return WeatherEnvironment


class SandboxWeather(_weather_class()):  # type: ignore[misc]
    """The weather environment, asking Ray for one unit of a custom `sandbox` resource per worker."""

    name = "weather_sandboxed"
    aliases = ()
    ray_resources = {"num_cpus": 0.5, "sandbox": 1}


class GpuWeather(_weather_class()):  # type: ignore[misc]
    """The weather environment, asking for a GPU no test cluster has."""

    name = "weather_gpu"
    aliases = ()
    ray_resources = {"num_gpus": 1}


POLICY_SETTINGS = ("base_urls", "model", "request_timeout_s", "connect_timeout_s", "max_retries", "backoff_s", "max_backoff_s",
                   "down_for_s", "retry_reached_calls", "max_connections", "max_connections_per_server", "extra_body", "vocab_size")
"""The settings of a `RemotePolicy` that decide how it calls its servers and which answers it can use."""


def policy_settings(build_engine) -> dict:  # type: ignore[no-untyped-def]
    """The `POLICY_SETTINGS` of the policy `build_engine()` makes (in a Ray worker process, or here)."""
    policy = build_engine().policy
    return {name: getattr(policy, name) for name in POLICY_SETTINGS}


@dataclass
class TurnAnsweringPolicy:
    """Answers `turns[k]` when the prompt holds k finished assistant turns (so an episode continued on another worker
    gets the same answers), after `delay_s`; appends each call's prompt digest to `call_log` (shared by all workers)."""

    template: object
    turns: list[Generation]
    delay_s: float
    call_log: str

    async def generate(self, request: GenerationRequest) -> Generation:
        import hashlib
        import os

        line = hashlib.sha1(repr(list(request.prompt_ids)).encode()).hexdigest() + "\n"
        fd = os.open(self.call_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        await asyncio.sleep(self.delay_s)
        done = self.template.decode(list(request.prompt_ids)).count("<|im_start|>assistant") - 1  # type: ignore[attr-defined]
        return self.turns[min(done, len(self.turns) - 1)]


@dataclass(frozen=True)
class TurnEngine:
    """Builds an engine whose policy answers by turn (`TurnAnsweringPolicy`), logging every model call to `call_log`."""

    call_log: str
    texts: tuple[str, ...] = WEATHER_TURNS
    delay_s: float = 0.0

    def __call__(self) -> Engine:
        from gym_bridge.core.template.chat_template import ChatTemplate
        from gym_bridge.policies.embedded import load_embedded_tokenizer

        tokenizer = load_embedded_tokenizer()
        template = ChatTemplate(tokenizer)
        turns = [turn for turn in scripted_policy(tokenizer, self.texts).script[""] if isinstance(turn, Generation)]
        policy = TurnAnsweringPolicy(template, turns, self.delay_s, self.call_log)
        return Engine(policy, template, EngineConfig(model_name="scripted"))
