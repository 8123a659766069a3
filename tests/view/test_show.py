"""`gym-bridge show` on a multi-turn rollout the engine really ran (scripted policy, multi_step), pinned."""

from __future__ import annotations

import json
import re

import pytest

from gym_bridge.cli import main

EXPECTED_HEAD = """\
═══ rollout #0  env=multi_step  task=0  repeat=0  reward=1.000
model: SmolLM2-135M-Instruct (embedded)   finish: answer   turns: 4   tool calls: 3   parse errors: 0   unparsed calls: 0   latency: X s
reward components: reward=1
verify metrics: accuracy=True, set_overlap=1, parsed_synonym_values=[407, 711], original_term_minefield_hit=False, order_instruction_following_failure=False
─── prompt as the model saw it (392 tokens, decoded with SmolLM2-135M-Instruct (embedded)); tools offered: get_synonym_value, extract_synonym_values
<|im_start|>system
You extract values with tools. Call get_synonym_value once for each of these synonyms, in this order: Warm, Blazing."""

EXPECTED_CONVERSATION = """\
─── conversation
tool call   │ get_synonym_value({"synonym": "Warm"})   [call_0-0_1]
tool output │ [call_0-0_1] {"synonym_value": 407}
tool call   │ get_synonym_value({"synonym": "Blazing"})   [call_0-0_2]
tool output │ [call_0-0_2] {"synonym_value": 711}
tool call   │ extract_synonym_values({"synonym_values": [407, 711]})   [call_0-0_3]
tool output │ [call_0-0_3] {"success": true}
assistant   │ The values are 407 and 711.
─── completion tokens: 130 model (trained), 57 env (masked)
model 36    │ <tool_call>
            │ {"name": "get_synonym_value", "arguments": {"synonym": "Warm"}}
            │ </tool_call><|im_end|>
env 21      │
            │ <|im_start|>tool
            │ {"synonym_value": 407}<|im_end|>
            │ <|im_start|>assistant
            │
model 36    │ <tool_call>
            │ {"name": "get_synonym_value", "arguments": {"synonym": "Blazing"}}
            │ </tool_call><|im_end|>
env 21      │
            │ <|im_start|>tool
            │ {"synonym_value": 711}<|im_end|>
            │ <|im_start|>assistant
            │
model 44    │ <tool_call>
            │ {"name": "extract_synonym_values", "arguments": {"synonym_values": [407, 711]}}
            │ </tool_call><|im_end|>
env 15      │
            │ <|im_start|>tool
            │ {"success": true}<|im_end|>
            │ <|im_start|>assistant
            │
model 14    │ The values are 407 and 711.<|im_end|>

showed 1 of 2 selected rollouts (2 in the file); -n 0 shows all"""


def show(capsys, *argv: str) -> str:
    assert main(["show", *argv]) == 0
    out = capsys.readouterr().out
    return "\n".join(line.rstrip() for line in re.sub(r"latency: [0-9.]+ s", "latency: X s", out).splitlines())


def test_show_pins_a_multi_turn_rollout(capsys, multi_step_file):
    out = show(capsys, str(multi_step_file), "-n", "1", "--tokens", "--color", "never")
    assert out.startswith(EXPECTED_HEAD)
    # the tool listing the template injected, as the model saw it
    assert '<tools>\n{"type": "function", "function": {"name": "get_synonym_value"' in out
    assert 'What are the values of the synonyms of "Hot"?<|im_end|>\n<|im_start|>assistant' in out
    assert out.endswith(EXPECTED_CONVERSATION)


def test_show_selects_sorts_and_colours(capsys, mixed_file):
    out = show(capsys, str(mixed_file), "--env", "weather", "-n", "0")
    assert out.count("═══ rollout") == 3 and "env=multi_step" not in out
    assert "showed 3 of 3 selected rollouts (5 in the file)" in out
    assert "assistant   │ It is probably sunny." in out
    worst_first = show(capsys, str(mixed_file), "--sort", "best", "-n", "1")
    assert "rollout #0  env=multi_step  task=0" in worst_first and "reward=1.000" in worst_first
    assert "showed 0 of 0 selected" in show(capsys, str(mixed_file), "--failed")
    capsys.readouterr()
    assert main(["show", str(mixed_file), "-n", "1", "--tokens", "--color", "always"]) == 0
    coloured = capsys.readouterr().out
    assert "\x1b[32mmodel 36" in coloured and "\x1b[90menv 21" in coloured


def test_show_without_a_tokenizer_shows_ids(capsys, tmp_path, multi_step_file):
    renamed = tmp_path / "other_model.jsonl"
    renamed.write_text(multi_step_file.read_text().replace("SmolLM2-135M-Instruct (embedded)", "some/unknown-model"))
    out = show(capsys, str(renamed), "-n", "1")
    assert "decoded with none (pass --tokenizer PATH to decode token ids)" in out
    assert re.search(r"\[ids: 1 9690 198 ", out)
    assert "user        │ What are the values of the synonyms of \"Hot\"?" in out  # the input messages instead


@pytest.mark.parametrize(("argv", "message"), [
    (["show", "missing.jsonl"], "file not found"),
    (["show", "{rows}"], "is not a rollout record"),
    (["show", "{mixed}", "--env", "nope"], "no rollouts of environment(s) nope; the file has multi_step, weather"),
])
def test_show_bad_input_exits_2(capsys, tmp_path, mixed_file, argv, message):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi", "environment": "weather"}\n')
    argv = [arg.format(rows=rows, mixed=mixed_file) for arg in argv]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _big_file(path, template_line: str, count: int) -> list[float]:
    """`count` copies of one record with rewards 0.00..0.96 repeating (ties galore); returns the rewards."""
    import json

    record = json.loads(template_line)
    rewards = [(index * 37 % 25) / 25 for index in range(count)]
    with open(path, "w") as handle:
        for index, reward in enumerate(rewards):
            handle.write(json.dumps({**record, "reward": reward, "task_index": index}) + "\n")
    return rewards


@pytest.mark.parametrize(("sort", "order"), [
    ("reward", lambda rewards: sorted(range(len(rewards)), key=lambda i: rewards[i])),  # worst first, ties in file order
    ("best", lambda rewards: sorted(range(len(rewards)), key=lambda i: -rewards[i])),
    ("file", lambda rewards: list(range(len(rewards)))),
])
def test_show_streams_a_large_file_with_bounded_memory(capsys, tmp_path, multi_step_file, sort, order):
    """A file of 800 rollouts (16 MB) is shown holding a few records, not the file: the peak
    of Python allocations stays far below the file's size, and the rollouts shown are those a full
    sort picks (ties in the file's order)."""
    import tracemalloc

    path = tmp_path / "big.jsonl"
    rewards = _big_file(path, multi_step_file.read_text().splitlines()[0], 800)
    size = path.stat().st_size
    capsys.readouterr()
    tracemalloc.start()
    try:
        assert main(["show", str(path), "--sort", sort, "-n", "4", "--color", "never"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out
    assert size > 10_000_000 and peak < size / 10, (size, peak)
    shown = [int(position) for position in re.findall(r"═══ rollout #(\d+)", out)]
    assert shown == order(rewards)[:4]
    assert [f"reward={rewards[p]:.3f}" in line for p, line in zip(shown, re.findall(r"═══ rollout #.*", out))] == [True] * 4
    assert "showed 4 of 800 selected rollouts (800 in the file); -n 0 shows all" in out


def test_show_says_when_a_rollout_was_resumed(capsys, tmp_path, multi_step_file):
    # the metrics a resumed rollout's record carries (gym_bridge.core.resume): continued, and started again with the reason
    continued, restarted = (json.loads(line) for line in multi_step_file.read_text().splitlines())
    continued["metrics"].update(attempts=2, resumed_from_turn=3)
    restarted["metrics"].update(attempts=3, resumed_from_turn=0, resume_restarted="tool output differs at turn 1")
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text(json.dumps(continued) + "\n" + json.dumps(restarted) + "\n")
    out = show(capsys, str(resumed), "-n", "0", "--color", "never")
    assert "resumed: attempt 2, continued from turn 3 (the turns before it from the journal)" in out
    assert "resumed: attempt 3, started again from turn 0 (tool output differs at turn 1)" in out
    assert "resumed:" not in show(capsys, str(multi_step_file), "-n", "0", "--color", "never")
