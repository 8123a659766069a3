"""BFCL's reference answers replayed through the real engine score 1.0 by BFCL's own checkers (a sample of each
offline category here; every entry in the `slow` test, where the only misses are the known exceptions below)."""

from __future__ import annotations

import json

import pytest

from environments.bfcl import BfclEnvironment, BfclMultiTurnEnvironment
from environments.bfcl.tests.conformance import categories, category_rows, needs_bfcl, reference_script, run_rows, runner_disagreements

pytestmark = needs_bfcl

SAMPLE = 2
EXCEPTIONS = {
    # BFCL's own checker rejects its own ground truth (docs/environments-from-elsewhere.md, BFCL, has the reasons)
    "simple_java_36": "value_error:list/tuple",  # `any` elements: the Java converter makes them strings; the answer holds 42, true
    "simple_java_65": "value_error:list/tuple",  # the same
    "simple_java_64": "value_error:dict_value",  # a nested value not wrapped in a list of options: compared to its characters
    "live_simple_106-63-0": "simple_function_checker:missing_required",  # required parameters with no acceptable value ([])
    "live_simple_112-68-0": "simple_function_checker:missing_required",  # the same
    "live_multiple_507-149-4": "simple_function_checker:missing_required",  # a required parameter whose only answer is "left out"
    "live_multiple_862-181-3": "simple_function_checker:unexpected_param",  # the answer names a parameter the function lacks
    "live_multiple_964-207-0": "simple_function_checker:missing_required",  # the answer misses the function's required parameter
}


def misses(rows, smol_template, turn) -> dict[str, str]:
    """BFCL's error type for each row whose replayed reference answer did not score 1.0; BFCL's own eval runner, fed
    the same answers, must agree on every one."""
    records = run_rows(rows, [reference_script(row, turn) for row in rows], smol_template)
    assert runner_disagreements(rows, records) == {}
    assert all(record.failure_kind is None for record in records), [record.failure_reason for record in records if record.failure_kind]
    assert [record.verify_metrics["bfcl_category"] for record in records] == [row["bfcl"]["category"] for row in rows]
    return {row["bfcl"]["id"]: record.verify_metrics["bfcl_error_type"] for row, record in zip(rows, records) if record.reward != 1.0}


def example_rows() -> list[dict]:
    """The example data: the first two entries of each category, as `gym-bridge data prepare bfcl` writes them."""
    return [json.loads(line) for path in (BfclEnvironment.example_data, BfclMultiTurnEnvironment.example_data)
            for line in path.read_text().splitlines()]


def test_reference_answers_of_every_category_score_one(smol_template, turn) -> None:
    rows = example_rows()
    assert {row["bfcl"]["category"] for row in rows} == set(categories()) and len(rows) == SAMPLE * 17
    assert misses(rows, smol_template, turn) == {}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_reference_answers_of_every_entry_score_one_but_the_known_exceptions(smol_template, turn) -> None:
    rows = [row for category in categories() for row in category_rows(category, 100_000)]
    assert len(rows) == 4441
    assert misses(rows, smol_template, turn) == EXCEPTIONS
