"""The summary `gym-bridge eval` prints (issue 19 item 16): failure reasons under the table, `n/a` when
nothing was scored, pass@k columns that follow --num-repeats, and the request-timeout hint (item 15)."""

from gym_bridge.core.metrics import format_table, summarize


def record(task, repeat, *, reward=1.0, kind=None, reason=None, env="math"):
    return {"env": env, "task_index": task, "repeat_index": repeat, "reward": reward, "mask_sample": kind is not None,
            "failure_kind": kind, "failure_reason": reason, "metrics": {"turns": 1}}


def test_failure_reasons_are_listed_most_frequent_first_with_an_example_record():
    timeout = "generation backend: http://h:8000/v1: request timed out after 120 s (no answer; not retried)"
    rows = [record(0, 0), *(record(t, 0, kind="infra", reason=timeout) for t in (1, 2, 3)),
            record(4, 0, kind="env", reason="tool 'lookup' raised KeyError: 'x'")]
    summary = summarize(rows)
    assert summary["failure_reasons"] == [
        {"kind": "infra", "reason": timeout, "count": 3, "example": "math task_index=1 repeat_index=0"},
        {"kind": "env", "reason": "tool 'lookup' raised KeyError: 'x'", "count": 1, "example": "math task_index=4 repeat_index=0"},
    ]
    table = format_table(summary)
    assert "failures: env=1, infra=3" in table
    assert f"  3 x infra: {timeout} (e.g. math task_index=1 repeat_index=0)" in table
    assert "3 requests timed out after 120 s; raise --request-timeout-s" in table


def test_reasons_that_differ_only_in_elapsed_seconds_are_one_reason():
    rows = [record(t, 0, kind="infra", reason=f"4 attempts failed in {t}.{t}3 s; last: HTTP 503") for t in range(3)]
    [entry] = summarize(rows)["failure_reasons"]
    assert entry["count"] == 3 and entry["reason"] == "4 attempts failed in # s; last: HTTP 503"


def test_an_all_failed_run_shows_n_a_not_a_zero_reward():
    summary = summarize([record(t, 0, kind="infra", reason="down") for t in range(11)])
    assert summary["mean_reward"] is None and summary["pass@1"] is None
    lines = format_table(summary).splitlines()
    total = next(line for line in lines if line.startswith("ALL")).split()
    assert total[:4] == ["ALL", "11", "n/a", "n/a"]  # mean_reward and pass@1


def test_pass_at_k_columns_follow_num_repeats_even_when_a_repeat_failed():
    # 2 tasks x 4 repeats; task 1's last repeat failed, so it has 3 scored repeats (the old columns were pass@1, pass@3)
    rows = [record(0, r, reward=1.0 if r == 0 else 0.0) for r in range(4)]
    rows += [record(1, r, reward=0.0) for r in range(3)] + [record(1, 3, kind="infra", reason="down")]
    summary = summarize(rows, num_repeats=4)
    assert [key for key in summary if key.startswith("pass@")] == ["pass@1", "pass@4"]
    # pass@1 = mean(1/4, 0/3) = 0.125; pass@4 counts only tasks with 4 scored repeats: task 0 -> 1.0
    assert summary["pass@1"] == 0.125 and summary["pass@4"] == 1.0
    assert summarize(rows)["pass@4"] == 1.0  # without num_repeats: the most rollouts of any task (4)
    header = format_table(summary).splitlines()[0].split()
    assert header[2:5] == ["mean_reward", "pass@1", "pass@4"]


def test_pass_at_k_columns_are_in_numeric_order():
    rows = [record(0, r) for r in range(16)]
    header = format_table(summarize(rows, num_repeats=16)).splitlines()[0].split()
    assert header[3:5] == ["pass@1", "pass@16"]


def test_rollouts_past_their_deadline_get_a_hint():
    """What the laptop example of docs/backends.md printed on a loaded 2-core machine: every rollout hit the 600 s deadline."""
    rows = [record(t, 0, kind="timeout", reason="rollout exceeded its deadline of 600 s") for t in range(11)]
    table = format_table(summarize(rows))
    assert "  11 x timeout: rollout exceeded its deadline of 600 s (e.g. math task_index=0 repeat_index=0)" in table
    assert "11 rollouts ran past their deadline of 600 s; raise --deadline-s" in table
