"""The piece cache of `PieceEncoder` stays exact when it fills: a call that overflows it still finds the
pieces it read from the cache (the template's markup, `user`, `tool`), and threads that share one
encoder (rollouts on worker threads) never see a piece vanish between lookup and read. Also through the two
paths the issue lost: engine rollouts (`infra` "KeyError: 'tool'") and capture requests (400 "KeyError: 'system'")."""

import asyncio
import itertools
import threading

from gym_bridge.capture.ledger import SessionLedger
from gym_bridge.capture.session import CaptureSession
from gym_bridge.core.agent_loop import Limits
from gym_bridge.core.engine import Engine, EngineConfig
from gym_bridge.core.environment import Environment, VerifyResult, tool
from gym_bridge.core.policy import SamplingParams, ScriptedPolicy
from gym_bridge.core.task import parse_task
from gym_bridge.core.template import piece_encoder
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.messages import ToolOutput
from tests.support.lab import call


def tool_output(index: int) -> ToolOutput:
    """A tool result of 200 lines no other call shares (search hits, file listings, logs)."""
    lines = "\n".join(f"hit {index}-{line}: /srv/data/file_{index}_{line}.txt" for line in range(200))
    return ToolOutput("search", lines, f"call_{index}")


def test_a_call_that_fills_the_cache_still_reads_its_markup(smol_tokenizer):
    template = ChatTemplate(smol_tokenizer)
    # 200 new lines a call: the cache (16,384 pieces) fills during call 82, which also needs `tool`,
    # `user` and the markup pieces every earlier call left in the cache
    calls = piece_encoder.MAX_CACHED_PIECES // 200 + 3
    for index in range(calls):
        ids = template.tool_delta_ids([tool_output(index)], last_token_id=smol_tokenizer.eos_token_id)
        text = template.delta_text(template.tool_messages([tool_output(index)]), closing_sampled=template.closing_text(smol_tokenizer.eos_token_id))
        assert ids == smol_tokenizer.encode(text, add_special_tokens=False), index
    assert len(template.codec.pieces._piece_ids) <= piece_encoder.MAX_CACHED_PIECES


def test_one_call_with_more_new_pieces_than_the_cache_holds(smol_tokenizer, monkeypatch):
    monkeypatch.setattr(piece_encoder, "MAX_CACHED_PIECES", 50)
    template = ChatTemplate(smol_tokenizer)
    text = template.delta_text(template.tool_messages([tool_output(0)]), closing_sampled="")  # 200 new lines
    for _ in range(2):
        assert template.encode(text) == smol_tokenizer.encode(text, add_special_tokens=False)
        assert len(template.codec.pieces._piece_ids) == 50


def test_threads_sharing_one_encoder_get_exact_ids(smol_tokenizer, monkeypatch):
    monkeypatch.setattr(piece_encoder, "MAX_CACHED_PIECES", 300)  # the cache fills and is trimmed every few calls
    template = ChatTemplate(smol_tokenizer)
    texts = [template.delta_text(template.tool_messages([tool_output(index)]), closing_sampled="") for index in range(24)]
    expected = [smol_tokenizer.encode(text, add_special_tokens=False) for text in texts]
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def encode_all(offset: int) -> None:
        start.wait()
        try:
            for round_index in range(6):
                for index in range(len(texts)):
                    shifted = (index + offset * 6 + round_index) % len(texts)
                    assert template.encode(texts[shifted]) == expected[shifted]
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=encode_all, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(template.codec.pieces._piece_ids) <= 300


class Listing(Environment):
    """A tool that lists 200 lines no other call shares (as the issue's eval did: 5 of 64 rollouts lost as `infra`)."""

    name = "piece_cache_listing"
    calls = itertools.count()

    @tool
    def search(self, query: str) -> str:
        """Search the files.

        Args:
            query: What to look for.
        """
        number = next(self.calls)
        return "\n".join(f"/srv/data/{query}/run_{number}/file_{line}.log: match at line {line * 7}" for line in range(200))

    def verify(self, task, output):  # type: ignore[no-untyped-def]
        return VerifyResult(reward=1.0)


def test_an_engine_run_past_the_cache_size_loses_no_rollout(smol_tokenizer, turn, monkeypatch):
    monkeypatch.setattr(piece_encoder, "MAX_CACHED_PIECES", 1000)  # filled every 5 rollouts (200 new lines each)
    engine = Engine(ScriptedPolicy({"": [turn(call("search", query="logs")), turn("Found them.")]}), ChatTemplate(smol_tokenizer),
                    EngineConfig(max_concurrency=8))
    tasks = [parse_task({"prompt": "Find the logs.", "environment": "piece_cache_listing"}, index=index) for index in range(64)]

    async def collect():  # type: ignore[no-untyped-def]
        return await asyncio.gather(*(engine.rollout(task, 0, env_class=Listing) for task in tasks))

    records = asyncio.run(collect())
    assert len(records) == 64
    assert [record.failure_reason for record in records if record.failure_kind is not None] == []
    assert all(record.tool_calls == 1 and record.reward == 1.0 for record in records)


def test_capture_requests_past_the_cache_size_are_all_answered(smol_tokenizer, turn, monkeypatch):
    monkeypatch.setattr(piece_encoder, "MAX_CACHED_PIECES", 1000)
    session = CaptureSession(policy=ScriptedPolicy({"": [turn("ok")] * 30}), template=ChatTemplate(smol_tokenizer),
                             ledger=SessionLedger(sampling=SamplingParams(max_new_tokens=8),
                                                  limits=Limits(max_turns=30, max_completion_tokens=10_000),
                             model_name="policy", label="t"))

    async def send_all() -> list[str]:
        answers = []
        for number in range(30):  # each a new conversation whose system message lists 200 new lines (a whole render)
            listing = "\n".join(f"/srv/data/run_{number}/file_{line}.log" for line in range(200))
            body = {"model": "policy", "messages": [{"role": "system", "content": listing}, {"role": "user", "content": "hi"}]}
            answers.append((await session.chat_completions(body))["choices"][0]["message"]["content"])
        return answers

    assert asyncio.run(send_all()) == ["ok"] * 30 and session.ledger.errors == []
