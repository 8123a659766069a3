"""`gym-bridge data validate|prepare|mix`: every bundled example file passes, corrupted copies fail with
file:line and field, generators write valid seeded rows, mixing is seeded and weighted."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gym_bridge.cli import main
from gym_bridge.core.registry import known_environments
from gym_bridge.data import mix_files, validate_file

EXAMPLES = {name: Path(env.example_data) for name, env in known_environments().items() if env.example_data}


def test_every_bundled_example_file_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"weather", "math", "mcqa", "workplace_assistant", "instruction_following", "reasoning_gym"} <= set(EXAMPLES)
    assert main(["data", "validate", *map(str, EXAMPLES.values())]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok") == len(EXAMPLES)


def write(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_a_corrupted_copy_fails_with_file_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = {name: [json.loads(line) for line in path.read_text().splitlines() if line.strip()] for name, path in EXAMPLES.items()}
    mcqa, wp, ifr, rg = rows["mcqa"][0], rows["workplace_assistant"][0], rows["instruction_following"][0], rows["reasoning_gym"][0]
    weather = rows["weather"][0]
    bad_tool = json.loads(json.dumps(weather))
    bad_tool["responses_create_params"]["tools"][0]["parameters"]["properties"] = {"town": {"type": "string"}}
    corrupted = write(tmp_path / "corrupted.jsonl", [
        mcqa,                                                                   # 1: fine
        {**mcqa, "expected_answer": "Z"},                                       # 2
        "{not json",                                                            # 3
        {**wp, "ground_truth": [{"name": "email_nuke_all", "arguments": "{}"}]},  # 4
        {**ifr, "verifier_metadata": {**ifr["verifier_metadata"], "kwargs": [{"num_words": "ten"}] * len(ifr["verifier_metadata"]["kwargs"])}},  # 5
        {**rg, "metadata": {"source_dataset": "no_such_task"}},                # 6
        {**mcqa, "agent_ref": {"name": "no_such_env"}},                         # 7
        {"agent_ref": {"name": "mcqa"}, "options": [], "expected_answer": "A"},  # 8: no input
        bad_tool,                                                               # 9
        {k: v for k, v in mcqa.items() if k != "options"},                      # 10
    ])
    report = validate_file(corrupted)
    found = {(Path(p.source).name, p.field) for p in report.problems}
    assert found >= {("corrupted.jsonl:2", "expected_answer"), ("corrupted.jsonl:3", ""), ("corrupted.jsonl:4", "ground_truth[0].name"),
                     ("corrupted.jsonl:6", "metadata.source_dataset"), ("corrupted.jsonl:7", "agent_ref.name"),
                     ("corrupted.jsonl:8", "responses_create_params.input"),
                     ("corrupted.jsonl:9", "responses_create_params.tools[0].parameters"), ("corrupted.jsonl:10", "options")}
    assert any(source == "corrupted.jsonl:5" and field.startswith("verifier_metadata.kwargs[") for source, field in found)
    assert not any(source == "corrupted.jsonl:1" for source, _ in found)
    assert report.rows == 10 and report.rows_per_env["mcqa"] >= 3
    assert main(["data", "validate", str(corrupted)]) == 1
    err = capsys.readouterr().err
    assert f"{corrupted}:2: expected_answer: 'Z' is not one of the option letters" in err
    assert "corrupted.jsonl:3: malformed JSON" in err


def test_rows_that_name_no_environment_validate_with_env(tmp_path: Path) -> None:
    row = {k: v for k, v in json.loads(EXAMPLES["mcqa"].read_text().splitlines()[0]).items() if k != "agent_ref"}
    path = write(tmp_path / "plain.jsonl", [row])
    assert [p.field for p in validate_file(path).problems] == ["agent_ref"]
    assert validate_file(path, default_env="mcqa").ok


def test_prepare_writes_valid_seeded_rows_and_names_the_generators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "if.jsonl"
    assert main(["data", "prepare", "instruction_following", "--size", "25", "--seed", "4", "--output", str(out)]) == 0
    first = out.read_text()
    assert len(first.splitlines()) == 25 and validate_file(out).ok
    assert main(["data", "prepare", "instruction_following", "--size", "25", "--seed", "4", "--output", str(out)]) == 0
    assert out.read_text() == first
    assert main(["data", "prepare", "instruction_following", "--split", "validation", "--size", "25", "--seed", "4", "--output", str(out)]) == 0
    assert out.read_text() != first
    capsys.readouterr()
    assert main(["data", "prepare", "weather", "--output", str(tmp_path / "w.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "has no row generator" in err and "instruction_following" in err and "workplace_assistant" in err
    assert main(["data", "prepare", "reasoning_gym", "--task", "chain_sum", "--size", "3", "--output", str(tmp_path / "rg.jsonl")]) == 0
    assert main(["data", "prepare", "reasoning_gym", "--output", str(tmp_path / "rg.jsonl")]) == 2
    assert "needs --task" in capsys.readouterr().err


def test_mix_is_seeded_shuffled_and_weighted(tmp_path: Path) -> None:
    a, b = EXAMPLES["mcqa"], EXAMPLES["weather"]
    every = mix_files([a, b], seed=1)
    assert len(every) == 10 + 8 and every == mix_files([a, b], seed=1) and every != mix_files([a, b], seed=2)
    weighted = mix_files([a, b], weights=[3, 1], num_rows=40, seed=0)
    counts = Counter("mcqa" if "options" in row else "weather" for row in weighted)
    assert counts == {"mcqa": 30, "weather": 10}
    assert Counter(json.dumps(row, sort_keys=True) for row in weighted if "options" in row).most_common(1)[0][1] == 3  # whole passes
    out = tmp_path / "mixed.jsonl"
    assert main(["data", "mix", str(a), str(b), "--weights", "1", "1", "--num-rows", "6", "--seed", "3", "--output", str(out)]) == 0
    assert validate_file(out).ok and len(out.read_text().splitlines()) == 6


def test_mix_refuses_rows_without_an_environment_and_bad_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = write(tmp_path / "plain.jsonl", [{"prompt": "hi"}])
    assert main(["data", "mix", str(plain), "--output", str(tmp_path / "m.jsonl")]) == 2
    assert "plain.jsonl:1: agent_ref: row names no environment" in capsys.readouterr().err
    a = str(EXAMPLES["mcqa"])
    assert main(["data", "mix", a, a, "--weights", "1", "--output", str(tmp_path / "m.jsonl")]) == 2
    assert "got 1 weights for 2 sources" in capsys.readouterr().err


# -- issue 19, item 6: outputs are never an input and are replaced atomically -------------------


def test_mix_and_to_verl_refuse_an_output_that_is_one_of_their_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text(EXAMPLES["mcqa"].read_text() + EXAMPLES["weather"].read_text())
    before = source.read_bytes()
    assert main(["data", "mix", str(source), "--output", str(source)]) == 2
    assert f"--output {source} is also an input" in capsys.readouterr().err
    (tmp_path / "sub").mkdir()
    by_another_path = tmp_path / "sub" / ".." / "rows.jsonl"
    assert main(["data", "mix", str(EXAMPLES["mcqa"]), str(source), "--output", str(by_another_path)]) == 2
    pytest.importorskip("pyarrow")
    assert main(["data", "to-verl", str(source), "--output", str(source)]) == 2  # used to replace the JSONL with parquet
    assert "is also an input" in capsys.readouterr().err
    assert main(["data", "to-verl", str(source), "--output", str(tmp_path / "train.jsonl")]) == 2
    assert "name the file .parquet" in capsys.readouterr().err
    assert source.read_bytes() == before and not (tmp_path / "train.jsonl").exists()


def test_an_interrupted_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """An interrupted `mix X --output X` (on main, rewritten in place) left 2,649 of 20,000 rows."""
    from gym_bridge.data import write_rows

    out = tmp_path / "mixed.jsonl"
    out.write_text('{"old": 1}\n{"old": 2}\n')

    rows: list = [{"new": 1}, {"new": 2}, {"new": object()}]  # the 3rd row stops the write, as Ctrl-C or a full disk would
    with pytest.raises(TypeError):
        write_rows(rows, out)
    assert out.read_text() == '{"old": 1}\n{"old": 2}\n'
    assert [path.name for path in tmp_path.iterdir()] == ["mixed.jsonl"]  # no temporary file left behind
    write_rows(rows[:2], out)
    assert out.read_text() == '{"new": 1}\n{"new": 2}\n'


# -- issue 19, item 7: validate reports unreadable files and lines, and goes on ----------------


def test_validate_reports_bad_encodings_and_directories_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good_line = EXAMPLES["mcqa"].read_text().splitlines()[0]
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes((good_line + "\n").encode() + '{"prompt": "café", "environment": "math"}\n'.encode("latin-1") + (good_line + "\n").encode())
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_text(good_line + "\n", encoding="utf-16")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)  # an image saved as .jsonl
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"prompt": "x", "environment": "math", "a": ' + "[" * 3000 + "]" * 3000 + "}\n")
    folder = tmp_path / "folder"
    folder.mkdir()
    good = write(tmp_path / "good.jsonl", [json.loads(good_line)])
    files = [latin1, utf16, binary, deep, folder, tmp_path / "missing.jsonl", good]
    assert main(["data", "validate", *map(str, files)]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert f"{latin1}:2: invalid UTF-8 (byte 0xe9 at column 16)" in captured.err
    assert f"{utf16}: is UTF-16 (it starts with a byte-order mark); save it as UTF-8" in captured.err
    assert f"{binary}:1: invalid UTF-8 (byte 0x89 at column 1)" in captured.err
    assert f"{deep}:1: nested too deeply to read" in captured.err
    assert f"{folder}: is a directory" in captured.err
    assert f"{tmp_path / 'missing.jsonl'}: cannot be read: No such file or directory" in captured.err
    assert f"{latin1}: 3 rows (mcqa 2): 1 problem(s)" in captured.out
    assert f"{good}: 1 row (mcqa 1): ok" in captured.out  # the files after the bad ones were validated


def test_validate_counts_rows_in_plain_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('"prompt": "x", "environment": "math"}\n')  # its opening brace lost: no row routes
    assert main(["data", "validate", str(broken)]) == 1
    assert capsys.readouterr().out == f"{broken}: 1 row: 1 problem(s)\n"  # was "1 rows (none)"
