"""BFCL's reference answers replayed through the real engine score 1.0 by BFCL's own checkers (a sample of each
offline category here; every entry in the `slow` test), and wrong answers score 0."""

from __future__ import annotations

from environments.bfcl.tests.conformance import categories, category_rows, needs_bfcl, reference_script, run_rows

pytestmark = needs_bfcl

SAMPLE = 2

def replay(rows, smol_template, turn):
    records = run_rows(rows, [reference_script(row, turn) for row in rows], smol_template)
    return {row["bfcl"]["id"]: record for row, record in zip(rows, records)}

def test_reference_answers_of_every_category_score_one(smol_template, turn) -> None:
    rows = [row for category in categories() for row in category_rows(category, SAMPLE)]
    records = replay(rows, smol_template, turn)
    failed = {key: (r.failure_kind, r.failure_reason, r.verify_metrics) for key, r in records.items() if r.reward != 1.0}
    assert failed == {}
    assert {r.verify_metrics["bfcl_category"] for r in records.values()} == set(categories())
