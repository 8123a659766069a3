"""benchmarks/engine_overhead.py's headline mode gives every rollout its own prompt."""

from pathlib import Path
from tests.support.scripts import load_script

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_overhead.py"


def load_bench():
    return load_script(BENCH)


def test_distinct_mode_yields_one_prompt_per_rollout_and_cached_mode_reuses_them():
    bench = load_bench().Bench(concurrency=8)
    for case, rows in (("single", len(bench.weather)), ("multi", len(bench.multi_step))):
        count = 3 * rows  # cycles through the example rows three times
        _, _, records = bench.run(case, count, prompts="distinct")
        prompts = {tuple(record.tokens.prompt_ids) for record in records}
        assert len(records) == count and len(prompts) == count, case
        _, _, records = bench.run(case, count, prompts="distinct")  # a later run never repeats an earlier prompt
        assert not prompts & {tuple(record.tokens.prompt_ids) for record in records}
        _, _, records = bench.run(case, count, prompts="cached")
        assert len({tuple(record.tokens.prompt_ids) for record in records}) <= rows
