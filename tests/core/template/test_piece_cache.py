"""The piece cache of `PieceEncoder` stays exact when it fills: a call that overflows it still finds the
pieces it read from the cache (the template's markup, `user`, `tool`), and threads that share one
encoder (rollouts on worker threads) never see a piece vanish between lookup and read."""

import threading

from gym_bridge.core.template import piece_encoder
from gym_bridge.core.template.chat_template import ChatTemplate, ToolOutput


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
