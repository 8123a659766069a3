"""Typed journal events read back the frames format 2 wrote (as dicts, before the events were typed) byte for byte,
and a journal written with such frames resumes into typed events."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gym_bridge.core.journal import RolloutKey, RunFingerprint, RunJournal, encode_frame, read_frames
from gym_bridge.core.journal_event import ChatEvent, ModelEvent, ToolEvent, UserEvent, event_from_frame

# Frames as the dict-based code of 24e676e built them (core/resume.py: `generate`, `chat`, `tool_output`, `user_message`),
# key order included: orjson writes a dict's keys in insertion order, so the order is part of the bytes.
OLD_FRAMES = [
    {"t": "model", "delta": [1, 2, 3], "n": 3, "ids": [4, 5], "lp": [-0.5, -0.25], "fr": "stop"},
    {"t": "model", "delta": [6], "n": 6, "ids": [7], "lp": [-1.0], "fr": "length", "text": "hi", "m": {"ttft_s": 0.1}, "pv": 3},
    {"t": "tool", "name": "add", "args": '{"n": 2}', "out": '{"total": 2}'},
    {"t": "user", "text": "and now?"},
    {"t": "chat", "n": 2, "digest": "ab" * 16, "text": "ok", "reasoning": "", "calls": [["add", '{"n": 1}']], "fr": "stop",
     "usage": {"prompt_tokens": 5}, "tokens": [[1, 2], [3], [-0.1]]},
    {"t": "chat", "n": 4, "digest": "cd" * 16, "text": "", "reasoning": "hm", "calls": [], "fr": "length", "usage": {},
     "tokens": None},
]


@pytest.mark.parametrize("frame", OLD_FRAMES, ids=lambda frame: f"{frame['t']}-{len(frame)}")
def test_a_frame_written_before_reads_back_equal_and_encodes_to_the_same_bytes(frame):
    event = event_from_frame(orjson.loads(orjson.dumps(frame)))  # as read from disk
    assert event.to_frame() == frame
    assert orjson.dumps(event.to_frame()) == orjson.dumps(frame)
    assert type(event).from_frame(event.to_frame()) == event


def test_each_kind_reads_into_its_own_class_and_an_unknown_kind_is_refused():
    assert [type(event_from_frame(frame)) for frame in OLD_FRAMES] == [ModelEvent, ModelEvent, ToolEvent, UserEvent, ChatEvent, ChatEvent]
    with pytest.raises(ValueError, match="unknown journal event kind 'model2'"):
        event_from_frame({"t": "model2"})


def test_a_journal_file_of_old_frames_resumes_into_typed_events_and_is_folded_forward_unchanged(tmp_path):
    fingerprint = RunFingerprint(model="m", tasks="t")
    journal = RunJournal.prepare(tmp_path / "j", fingerprint, resume=False)
    asyncio.run(journal.close())  # an empty journal: the folder goes; make one by hand with the old frames
    folder = tmp_path / "j"
    folder.mkdir()
    header = {"k": "header", "v": 2, "fingerprint": fingerprint.to_dict()}
    commit = {"k": "commit", "r": [4, 1], "a": 1, "at": 0, "ev": OLD_FRAMES[:4], "b": {"turns": 2, "tokens": 3, "seconds": 1.5},
              "kind": "replay"}
    (folder / f"{1:020d}-1.log").write_bytes(encode_frame(header) + encode_frame(commit))
    again = RunJournal.prepare(folder, fingerprint, resume=True)
    folded = [frame for frame in read_frames(again.path) if frame["k"] == "commit"]
    assert [frame["ev"] for frame in folded] == [OLD_FRAMES[:4]]  # carried into the new journal file as written
    state = again.restore(RolloutKey.of_task(4, 1))
    assert state is not None and [event.kind for event in state.events] == ["model", "model", "tool", "user"]
    assert state.turns == 2 and state.events[1] == ModelEvent(prompt_delta=[6], prompt_length=6, token_ids=[7], logprobs=[-1.0],
                                                              finish_reason="length", text="hi", metrics={"ttft_s": 0.1},
                                                              policy_version=3)
    again.finish(RolloutKey.of_task(4, 1))
    asyncio.run(again.close())


def test_a_key_says_what_its_numbers_are_and_is_written_as_a_pair():
    key = RolloutKey.of_step(step=12, position=3)
    assert (key.group, key.member) == (12, 3) and key == RolloutKey.of_group(12, 3) == (12, 3)
    assert orjson.dumps(list(RolloutKey.of_task(task_index=5, repeat_index=0))) == b"[5,0]"
