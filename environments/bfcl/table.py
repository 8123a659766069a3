"""BFCL's per-category accuracy table from `gym-bridge eval` records: `python -m environments.bfcl.table out.jsonl`.

Each BFCL rollout's record carries BFCL's category (`metrics.verify.bfcl_category`); accuracy is the mean reward over
the scored rollouts of a category (BFCL's verdict: 1 valid, 0 not), failed (masked) rollouts counted apart.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable


def category_of(record: dict[str, Any]) -> str:
    verify = (record.get("metrics") or {}).get("verify") or {}
    bfcl = record.get("bfcl") or {}
    return str(verify.get("bfcl_category") or bfcl.get("category") or "?")


def accuracy_table(records: Iterable[dict[str, Any]]) -> list[tuple[str, int, int, float | None]]:
    """(category, rollouts, failed, accuracy) per BFCL category, in name order; accuracy None when none was scored."""
    by_category: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        if record.get("env") in ("bfcl", "bfcl_multi_turn"):
            by_category[category_of(record)].append(record)
    table = []
    for category, rows in sorted(by_category.items()):
        scored = [row["reward"] for row in rows if not row.get("mask_sample")]
        table.append((category, len(rows), len(rows) - len(scored), sum(scored) / len(scored) if scored else None))
    return table


def format_table(table: list[tuple[str, int, int, float | None]]) -> str:
    lines = ["| BFCL category | rollouts | failed | accuracy |", "|---|---|---|---|"]
    for category, rollouts, failed, accuracy in table:
        lines.append(f"| {category} | {rollouts} | {failed} | {'n/a' if accuracy is None else f'{accuracy:.3f}'} |")
    return "\n".join(lines)


def main(paths: list[str]) -> int:
    records = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines() if line.strip()]
    print(format_table(accuracy_table(records)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
