"""Per-call policy versions: each model call's version rides on its last output item, the record's `metrics`
summarise them, and `show` / the report read them back with the staleness at consumption."""

import asyncio
import dataclasses

from gym_bridge.core.engine import Engine
from gym_bridge.core.policy import ScriptedPolicy
from gym_bridge.core.record import with_consumed_version
from gym_bridge.view.decode import Decoder
from gym_bridge.view.show import format_rollout
from gym_bridge.view.reading import policy_versions
from tests.support.lab import call, task


def _record(template, script):
    engine = Engine(ScriptedPolicy(script), template)

    async def one():
        return await engine.rollout(task())

    return asyncio.run(one())


def test_each_call_records_its_version_and_metrics_summarise_them(smol_template, turn):
    versioned = [dataclasses.replace(turn(call(sample="ab")), policy_version=3),
                 dataclasses.replace(turn(call(sample="abc")), policy_version=3),
                 dataclasses.replace(turn("All done."), policy_version=5)]
    record = _record(smol_template, {"": versioned})
    assert record.failure_kind is None and record.policy_versions == (3, 3, 5)
    row = record.to_dict()
    calls = [item for item in row["response"]["output"] if "generation_token_ids" in item]
    assert [item["policy_version"] for item in calls] == [3, 3, 5]
    # only the last item of a call carries it: the tool-call turns' items are single function_call items
    assert all("policy_version" not in item for item in row["response"]["output"] if "generation_token_ids" not in item)
    assert (row["metrics"]["policy_version_min"], row["metrics"]["policy_version_max"]) == (3, 5)

    consumed = with_consumed_version(row, 7)
    versions = policy_versions(consumed)
    assert (versions.calls, versions.oldest, versions.newest, versions.staleness) == ((3, 3, 5), 3, 5, 4)  # 7 - 3
    shown = format_rollout(0, consumed, Decoder(None, "none"))
    assert "policy versions per call: 3, 3, 5 (oldest 3, newest 5)   consumed at version 7   staleness 4" in shown


def test_a_backend_without_versions_writes_none(smol_template, turn):
    record = _record(smol_template, {"": [turn("All done.")]})
    row = record.to_dict()
    assert record.policy_versions == ()
    assert "policy_version_min" not in row["metrics"] and "policy_version_max" not in row["metrics"]
    assert all("policy_version" not in item for item in row["response"]["output"])
    assert not policy_versions(row).known
    assert "policy versions" not in format_rollout(0, row, Decoder(None, "none"))


def test_the_html_report_carries_the_versions_line(smol_template, turn, tmp_path):
    import json

    from gym_bridge.view.report import build_data

    versioned = [dataclasses.replace(turn("All done."), policy_version=2)]
    row = with_consumed_version(_record(smol_template, {"": versioned}).to_dict(), 3)
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(row) + "\n")
    [detail] = build_data([str(path)])["details"].values()
    assert detail["versions"] == "policy versions per call: 2 (oldest 2, newest 2)   consumed at version 3   staleness 1"
