"""`show`, `view` and `export` over a file of odd records (issue 28, items 3, 4 and 12): each unreadable line is
reported as file:line with what is wrong, the rest is still shown or written, the exit status is 1; an export never
writes outside its folder; `show` prints no terminal control sequence from a record."""

from __future__ import annotations

import json
import re

import pytest

from gym_bridge.cli import main


def _odd_lines(good: dict) -> list[tuple[str, str]]:
    """(line, what the report must say) for records that crashed the views before."""
    def changed(**fields: object) -> str:
        return json.dumps({**good, **fields})

    tokens = good["tokens"]
    output = good["response"]["output"]
    surrogate = json.dumps({**good, "response": {**good["response"], "output": [
        {**output[-1], "content": [{"type": "output_text", "text": "SURROGATE"}]}]}}).replace("SURROGATE", "\\ud800")
    return [
        (changed(reward="1.0"), 'reward is "1.0", not a finite number'),
        (changed(tokens={**tokens, "completion_mask": tokens["completion_mask"][:-3]}), "tokens.completion_mask has"),
        (changed(tokens={**tokens, "completion_logprobs": [None] * len(tokens["completion_ids"])}), "completion_logprobs is not a list of finite numbers"),
        (surrogate, "lone surrogate escape (\\ud800)"),
        ("[1, 2, 3]", "is a JSON list, not a record"),
        ('{"reward": 1.0, "response": ', "malformed JSON"),
        (changed(response="done"), "no 'response' object"),
        (changed(response={**good["response"], "output": ["text"]}), "response.output[0] is not an item"),
        (changed(reward=float("nan")), "reward is NaN, not a finite number"),
        (changed(tokens={**tokens, "completion_ids": ["a", *tokens["completion_ids"][1:]]}), "tokens.completion_ids is not a list of token ids"),
        (changed(metrics="fast"), "metrics is a str"),
        (changed(reward_components={"accuracy": "high"}), "reward_components holds a value that is not a finite number"),
        (changed(responses_create_params={"input": "hi", "tools": ["get_weather"]}), "responses_create_params.tools is not a list of objects"),
        (changed(tokens={**tokens, "prompt_ids": [2**40, *tokens["prompt_ids"]]}), "tokens.prompt_ids is not a list of token ids"),
    ]


@pytest.fixture
def odd_file(tmp_path, mixed_file):
    """The five good rollouts of `mixed_file` with an odd line after each of the first ones; returns (path, expectations)."""
    good = mixed_file.read_text().splitlines()
    odd = _odd_lines(json.loads(good[0]))
    lines, expected = [], []
    for position, (line, message) in enumerate(odd):
        if position < len(good):
            lines.append(good[position])
        lines.append(line)
        expected.append((len(lines), message))
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, expected


def _check_reported(err: str, path, expected) -> None:
    for line_number, message in expected:
        reported = [entry for entry in err.splitlines() if entry.startswith(f"skipped {path}:{line_number}: ")]
        assert len(reported) == 1 and message in reported[0], (line_number, message, err)
    assert f"skipped {len(expected)} unreadable records" in err and "Traceback" not in err


def test_show_reports_odd_lines_and_shows_the_rest(capsys, odd_file):
    path, expected = odd_file
    assert main(["show", str(path), "-n", "0", "--tokens", "--color", "never"]) == 1
    captured = capsys.readouterr()
    assert captured.out.count("═══ rollout") == 5 and "showed 5 of 5 selected rollouts (5 in the file)" in captured.out
    _check_reported(captured.err, path, expected)


def test_view_reports_odd_lines_and_reports_the_rest(capsys, tmp_path, odd_file):
    path, expected = odd_file
    output = tmp_path / "report.html"
    assert main(["view", str(path), "--output", str(output)]) == 1
    captured = capsys.readouterr()
    assert "5 rollouts from" in captured.out and f"{len(expected)} unreadable lines skipped" in captured.out
    _check_reported(captured.err, path, expected)
    page = output.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S).group(1))
    assert len(data["rows"]) == 5


@pytest.mark.parametrize("target", ["folder", "out.jsonl"])
def test_export_reports_odd_lines_and_writes_the_rest(capsys, tmp_path, odd_file, target):
    path, expected = odd_file
    output = tmp_path / target
    assert main(["export", "--format", "atif", str(path), "--output", str(output)]) == 1
    captured = capsys.readouterr()
    assert f"wrote 5 ATIF-v1.7 trajectories to {output}" in captured.out
    _check_reported(captured.err, path, expected)
    written = sorted(output.glob("*.json")) if output.is_dir() else output.read_text().splitlines()
    assert len(written) == 5


def test_a_file_of_only_odd_lines_exits_2_naming_the_first(capsys, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "hi"}\n[1]\n')
    for argv in (["show", str(path)], ["view", str(path), "--output", str(tmp_path / "r.html")],
                 ["export", "--format", "atif", str(path), "--output", str(tmp_path / "out")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"no readable rollout records: all 2 lines were skipped; the first, {path}:1: is not a rollout record" in err
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("env", ["../../escaped", "/tmp/../{root}/abs", "..", ".hidden", "a/b\\c", "x" * 600])
def test_export_folder_names_stay_inside_the_folder(tmp_path, mixed_file, env):
    record = json.loads(mixed_file.read_text().splitlines()[0])
    rollouts = tmp_path / "in.jsonl"
    rollouts.write_text("\n".join(json.dumps({**record, "env": env.format(root=tmp_path), "repeat_index": repeat}) for repeat in (0, 0)) + "\n")
    output = tmp_path / "deep" / "out"
    before = {path for path in tmp_path.rglob("*")}
    assert main(["export", "--format", "atif", str(rollouts), "--output", str(output)]) == 0
    created = {path for path in tmp_path.rglob("*")} - before
    files = [path for path in created if path.is_file()]
    assert len(files) == 2 and all(path.parent == output for path in files)  # two records, two files: a clash gets "-2"
    assert all(not path.name.startswith(".") and len(path.name) <= 210 for path in files)


def test_export_refuses_a_name_that_a_symlink_points_outside(tmp_path, mixed_file):
    record = json.loads(mixed_file.read_text().splitlines()[0])
    rollouts = tmp_path / "in.jsonl"
    rollouts.write_text(json.dumps({**record, "env": "planted", "task_index": 0, "repeat_index": 0}) + "\n")
    output = tmp_path / "out"
    output.mkdir()
    (output / "planted-0-0.json").symlink_to(tmp_path / "victim.json")
    assert main(["export", "--format", "atif", str(rollouts), "--output", str(output)]) == 2
    assert not (tmp_path / "victim.json").exists()


CONTROL_TEXT = ("\x1b]0;owned title\x07\x1b]52;c;ZWNobyBvd25lZA==\x07\x1b[2J\x1b[1A\x1b[2K"
                "\x9b31m\r\x08\x00ok\ttab\nnext line")


def test_terminal_safe_escapes_controls_but_tab_and_newline():
    from gym_bridge.view.show import terminal_safe

    assert terminal_safe(CONTROL_TEXT) == ("\\x1b]0;owned title\\x07\\x1b]52;c;ZWNobyBvd25lZA==\\x07\\x1b[2J\\x1b[1A\\x1b[2K"
                                           "\\x9b31m\\x0d\\x08\\x00ok\ttab\nnext line")


@pytest.mark.parametrize("colour", ["never", "always"])
def test_show_prints_no_control_sequence_from_a_record(capsys, tmp_path, mixed_file, colour):
    record = json.loads(mixed_file.read_text().splitlines()[2])  # weather: an answer, no tool call
    record["response"]["output"][-1]["content"][0]["text"] = CONTROL_TEXT
    record["failure_kind"], record["failure_reason"] = "env", CONTROL_TEXT
    record["env"] = "weather\x1b[2J"
    record["response"]["output"].append({"type": "function_call_output", "call_id": "c\x1b]52;c;eA==\x07", "output": CONTROL_TEXT})
    path = tmp_path / "controls.jsonl"
    path.write_text(json.dumps(record) + "\n")
    assert main(["show", str(path), "--tokens", "--color", colour]) == 0
    out = capsys.readouterr().out
    own = re.sub(r"\x1b\[[0-9;]*m", "", out) if colour == "always" else out  # show's own colour codes (SGR) only
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", own)
    assert "\\x1b]52;c;ZWNobyBvd25lZA==\\x07" in out and "env=weather\\x1b[2J" in out
