"""The model-family table of docs/model-families.md, generated from the conformance tests' own checks: for each real chat
template in ../shared/templates (tests/support/families.py), the append-only check per shape, the parsers and
scripted three-call multi_step rollouts (reward, token invariants, prompts against the template).
Prints the Markdown table; `--write` puts it into docs/model-families.md between the `template-compat` markers,
`--check` exits 1 when it is stale. Run: `.venv/bin/python tools/template_compat.py [--write|--check]`
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from gym_bridge.core.template.chat_template import ChatTemplate  # noqa: E402
from gym_bridge.core.template.check import template_report  # noqa: E402
from tests.support.families import REAL_FAMILIES, SHARED_TEMPLATES, Family, family_tokenizer, prompt_mismatches, run_scripted  # noqa: E402
from tests.support.invariants import assert_token_invariants  # noqa: E402

BEGIN, END = "<!-- template-compat:begin -->", "<!-- template-compat:end -->"
SHAPES = {
    "tool call, tool output, answer": "call",
    "same without a system message": "no system",
    "two calls in one turn": "parallel",
    "two tool-call turns in a row": "chain",
    "new user message after an answer": "user follow-up",
}
HEADER = ("| family (template) | append-only shapes | check verdict | tool parser | reasoning parser | notes |\n"
          "|---|---|---|---|---|---|")


def _rollouts(family: Family, tokenizer, template: ChatTemplate) -> str:
    records = run_scripted(family, tokenizer, template)
    if any(record.reward != 1.0 or record.tool_calls != 3 or record.failure_kind for record in records):
        return "3-call rollout FAILS"
    for record in records:
        try:
            assert_token_invariants(record.to_dict())
        except AssertionError:
            return "3-call rollout breaks the token invariants"
    if family.append_only and any(prompt_mismatches(record, template, tokenizer) for record in records):
        return "3-call rollout: a prompt differs from the template's rendering"
    return "3-call rollout: reward 1, token-exact" + (", every prompt = the template's rendering" if family.append_only else "")


def row(family: Family, base_tokenizer) -> str:
    tokenizer, eos_ids = family_tokenizer(base_tokenizer, family)
    template = ChatTemplate(tokenizer, eos_token_ids=eos_ids)
    report, style = template_report(template), template.profile.style
    appends = [SHAPES[r.shape] for r in report.shapes if r.verdict == "append-only"]
    rewrites = [r for r in report.shapes if r.verdict == "rewrites history"]
    unsupported = [SHAPES[r.shape] for r in report.shapes if r.verdict == "not supported by the template"]
    if rewrites:
        how = sorted({r.detail.split(";")[0].removeprefix("the template ") for r in rewrites})
        verdict = f"rewrites history ({', '.join(SHAPES[r.shape] for r in rewrites)}: {'; '.join(how)}): `template_check='warn'`"
    else:
        verdict = "append-only"
    tool = f"`{report.tool_parser}`" + (" (9-character call ids)" if style.short_ids else "")
    reasoning = f"`{report.reasoning_parser}`" + (" (the prompt opens `<think>`)" if report.prompt_opens_reasoning else "")
    notes = [family.note] if family.note else []
    if unsupported:
        notes.append(f"template cannot render: {', '.join(unsupported)}")
    if report.alternatives:
        notes.append("append-only with " + " or ".join(f"`chat_template_kwargs={kwargs}`" for kwargs in report.alternatives))
    notes.append(_rollouts(family, tokenizer, template))
    shapes = "all" if len(appends) == len(SHAPES) else (", ".join(appends) or "none")
    cells = [f"{family.label} (`{family.template}`)", shapes, verdict, tool, reasoning, "; ".join(notes)]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def table() -> str:
    from gym_bridge.policies.embedded import load_embedded_tokenizer

    base = load_embedded_tokenizer()
    return "\n".join([HEADER, *(row(family, base) for family in REAL_FAMILIES)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="replace the table in docs/model-families.md")
    group.add_argument("--check", action="store_true", help="exit 1 when docs/model-families.md's table is out of date")
    args = parser.parse_args()
    if not SHARED_TEMPLATES.is_dir():
        print(f"the real chat templates are not at {SHARED_TEMPLATES}", file=sys.stderr)
        return 2
    text = table()
    page = ROOT / "docs" / "model-families.md"
    current = page.read_text()
    if args.write or args.check:
        if BEGIN not in current or END not in current:
            print(f"docs/model-families.md has no {BEGIN} ... {END} block", file=sys.stderr)
            return 2
        head, rest = current.split(BEGIN, 1)
        updated = f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}"
        if args.check:
            if updated != current:
                print("docs/model-families.md's table is out of date: run tools/template_compat.py --write", file=sys.stderr)
                return 1
            return 0
        page.write_text(updated)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
