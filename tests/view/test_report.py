"""`gym-bridge view`: the report's data, and the page itself in headless Chromium (DevTools protocol):
filter the table, open a rollout, read the rendered text and the token colours, and check that no
request leaves the page. A screenshot is written next to the test's files."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest

from gym_bridge.cli import main
from gym_bridge.view.report import build_data, histogram, percentiles, write_report
from tests.view.browser import Browser, chromium_path

DOCS = Path(__file__).resolve().parents[2] / "docs"
"""Where the docs' screenshots live (docs/viewing.md shows them): rewritten by this test with GYM_BRIDGE_UPDATE_SCREENSHOTS=1."""
CHOOSE_ENV = "{{ const s = document.getElementById('f-env'); s.value = '{env}'; s.dispatchEvent(new Event('change')); }}"


async def full_page_screenshot(browser: Browser, path: Path) -> None:
    height = await browser.evaluate("Math.min(1700, document.documentElement.scrollHeight)")
    await browser.send("Emulation.setDeviceMetricsOverride", width=1400, height=int(height), deviceScaleFactor=1, mobile=False)
    await browser.screenshot(path)
    await browser.send("Emulation.clearDeviceMetricsOverride")


def test_percentiles_and_histogram():
    # nearest rank: p50 of 1..10 is the 5th value, p90 the 9th, p99 the 10th
    assert percentiles([float(v) for v in range(10, 0, -1)]) == {"p50": 5.0, "p90": 9.0, "p99": 10.0}
    # 10 bins over [0, 1]: 0.0 -> bin 0, 0.55 -> bin 5, 1.0 -> the last bin
    assert histogram([0.0, 0.55, 1.0, 1.0])["counts"] == [1, 0, 0, 0, 0, 1, 0, 0, 0, 2]


def test_report_data(mixed_file):
    data = build_data([str(mixed_file)])
    assert len(data["rows"]) == 5 and len(data["details"]) == 5
    weather = data["stats"][0]["weather"]
    assert weather["rollouts"] == 3 and weather["health"]["tool_call_rate"] == 0.0 and weather["histogram"]["counts"][0] == 3
    multi = data["stats"][0]["multi_step"]
    assert multi["mean_reward"] == 0.5 and multi["tool_calls"]["p50"] == 3.0
    detail = data["details"]["0:0"]
    assert [run[0] for run in detail["runs"]] == ["model", "env"] * 3 + ["model"]
    assert "".join(data["vocabulary"][str(t)] for t in detail["runs"][-1][1]) == "The values are 407 and 711.<|im_end|>"


def test_report_samples_beyond_max_detail_and_compares_runs(mixed_file, multi_step_file, tmp_path):
    report = write_report([str(mixed_file)], output=tmp_path / "r.html", max_detail=2, seed=1)
    assert (report.rollouts, report.detailed) == (5, 2) and "a seeded sample" in report.describe()
    data = build_data([str(multi_step_file), str(mixed_file)])
    # the same two multi_step tasks in both runs (no change), the weather tasks only in B
    diffs = {(row["env"], row["task"]): row["diff"] for row in data["compare"]}
    assert diffs[("multi_step", 0)] == 0.0 and diffs[("weather", 0)] is None
    assert {row[1] for row in data["rows"]} == {0, 1}


def test_report_page_is_self_contained(mixed_file, tmp_path):
    page = write_report([str(mixed_file)], output=tmp_path / "r.html").output.read_text()
    assert "default-src 'none'" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "</script" not in page.split('id="data">', 1)[1].split("</script>", 1)[0]


def test_view_cli(capsys, mixed_file, tmp_path):
    output = tmp_path / "out" / "report.html"
    assert main(["view", str(mixed_file), "--env", "weather", "--output", str(output)]) == 0
    assert "3 rollouts" in capsys.readouterr().out and output.is_file()
    assert main(["view", str(mixed_file), str(mixed_file), str(mixed_file), "--output", str(output)]) == 2


@pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (the Makefile's test setup installs it with apt)")
def test_report_in_chromium(mixed_file, tmp_path):
    report = write_report([str(mixed_file)], output=tmp_path / "report.html")
    url = report.output.resolve().as_uri()
    shots = DOCS if os.environ.get("GYM_BRIDGE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    model_tokens = sum(sum(json.loads(line)["tokens"]["completion_mask"]) for line in mixed_file.read_text().splitlines()[:1])

    async def drive() -> dict:
        async with Browser() as browser:
            await browser.open(url)
            seen = {"all": await browser.evaluate("document.getElementById('count').textContent")}
            await full_page_screenshot(browser, shots / "report.png")
            await browser.evaluate(CHOOSE_ENV.format(env="weather"))
            seen["weather"] = await browser.evaluate("document.getElementById('count').textContent")
            seen["weather_envs"] = await browser.evaluate("[...document.querySelectorAll('#rows tr td:nth-child(2)')].map(td => td.textContent)")
            await browser.evaluate("{ const t = document.getElementById('f-text'); t.value = 'answer'; t.dispatchEvent(new Event('input')); }")
            seen["text"] = await browser.evaluate("document.getElementById('count').textContent")
            await browser.evaluate(CHOOSE_ENV.format(env="multi_step"))
            await browser.evaluate("document.querySelector('#rows tr[data-key=\"0:0\"] td').click()")
            seen["hash"] = await browser.evaluate("location.hash")
            seen["conversation"] = await browser.evaluate("document.getElementById('conversation').innerText")
            seen["head"] = await browser.evaluate("document.getElementById('rollout-head').innerText")
            seen["colours"] = await browser.evaluate(
                "['tok-p', 'tok-m', 'tok-e'].map(c => getComputedStyle(document.querySelector('.' + c)).backgroundColor)")
            seen["model_spans"] = await browser.evaluate("document.querySelectorAll('#tokens .tok-m').length")
            seen["title"] = await browser.evaluate("document.querySelector('#tokens .tok-m').title")
            await full_page_screenshot(browser, shots / "report_rollout.png")
            await browser.open("about:blank")
            await browser.open(url + "#env=weather&failed=0&sort=reward&dir=1")  # a link's fragment opens the same view
            seen["linked"] = await browser.evaluate("[document.getElementById('count').textContent, document.getElementById('f-env').value]")
            seen["requests"], seen["errors"] = list(browser.requests), list(browser.console_errors)
            return seen

    seen = asyncio.run(asyncio.wait_for(drive(), timeout=120))
    assert seen["all"].startswith("5 of 5 rollouts")
    assert seen["weather"].startswith("3 of 5 rollouts") and seen["weather_envs"] == ["weather"] * 3
    assert seen["text"].startswith("3 of 5 rollouts")  # every weather rollout finished with an answer
    assert "env=multi_step" in seen["hash"] and "rollout=0%3A0" in seen["hash"]
    conversation = seen["conversation"]
    for text in ("tool call: get_synonym_value", '{"synonym": "Warm"}', '{"synonym_value": 407}', "The values are 407 and 711."):
        assert text in conversation
    assert "multi_step, task 0, repeat 0" in seen["head"] and "reward=1" in seen["head"]
    assert seen["colours"] == ["rgb(233, 240, 255)", "rgb(187, 240, 200)", "rgb(226, 228, 233)"]
    assert seen["model_spans"] == model_tokens == 130
    assert re.fullmatch(r"id \d+, log-prob -0\.2500", seen["title"])  # the scripted log-prob of every token
    assert seen["linked"][0].startswith("3 of 5 rollouts") and seen["linked"][1] == "weather"
    assert set(seen["requests"]) <= {url, url + "#env=weather&failed=0&sort=reward&dir=1"} and seen["errors"] == []  # the page, nothing else
    assert (shots / "report_rollout.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_matches_tasks_whatever_their_completion_lengths(multi_step_file, tmp_path):
    # repeats of one task with different completion lengths are one task (the light records' token counts are no
    # part of its key): task 0 twice (reward 1, and 0 with 3 completion tokens fewer), task 1 once
    first, second = (json.loads(line) for line in multi_step_file.read_text().splitlines())
    shorter = json.loads(json.dumps(first))
    for field in ("completion_ids", "completion_mask", "completion_logprobs"):
        shorter["tokens"][field] = shorter["tokens"][field][:-3]
    shorter.update(repeat_index=1, reward=0.0)
    repeats = tmp_path / "repeats.jsonl"
    repeats.write_text("".join(json.dumps(record) + "\n" for record in (first, shorter, second)))
    itself = build_data([str(repeats), str(repeats)])["compare"]
    assert [(row["task"], row["n_a"], row["n_b"], row["diff"]) for row in itself] == [(0, 2, 2, 0.0), (1, 1, 1, 0.0)]
    # A: task 0 once with reward 1; B: mean (1 + 0) / 2 = 0.5, so B - A = -0.5
    against = {row["task"]: (row["a"], row["b"], row["diff"]) for row in build_data([str(multi_step_file), str(repeats)])["compare"]}
    assert against == {0: (1.0, 0.5, -0.5), 1: (0.0, 0.0, 0.0)}
