"""The token invariants every rollout record must satisfy (checked on scripted and real rollouts)."""

from __future__ import annotations

from typing import Any


def assert_token_invariants(record: dict[str, Any]) -> None:
    """Equal lengths; model tokens are exactly the calls' generations in order; each call's
    prompt is the prompt plus every completion token before it; env tokens have log-prob 0."""
    tokens = record["tokens"]
    ids, mask, logprobs = tokens["completion_ids"], tokens["completion_mask"], tokens["completion_logprobs"]
    assert len(ids) == len(mask) == len(logprobs), "completion ids, mask and log-probs differ in length"
    assert set(mask) <= {0, 1}
    calls = [item for item in record["response"]["output"] if "generation_token_ids" in item]
    model_ids = [token for token, m in zip(ids, mask) if m == 1]
    assert model_ids == [token for item in calls for token in item["generation_token_ids"]]
    model_logprobs = [lp for lp, m in zip(logprobs, mask) if m == 1]
    assert model_logprobs == [lp for item in calls for lp in item["generation_log_probs"]]
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
    position = 0
    for item in calls:
        # this call's tokens start at `start` in the completion; its prompt must be everything before
        start = _find_run(mask, ids, item["generation_token_ids"], position)
        assert item["prompt_token_ids"] == tokens["prompt_ids"] + ids[:start]
        position = start + len(item["generation_token_ids"])


def _find_run(mask: list[int], ids: list[int], run: list[int], position: int) -> int:
    for start in range(position, len(ids) - len(run) + 1):
        if mask[start] == 1 and ids[start : start + len(run)] == run and all(mask[start : start + len(run)]):
            return start
    raise AssertionError("a model call's generation is not in the completion where expected")


def nemo_rl_token_view(result: dict[str, Any]) -> dict[str, list]:
    """The flat token view NeMo RL builds from a `/run` result, step by step as
    `nemo_rl/environments/nemo_gym.py::NemoGym._postprocess_nemo_gym_to_nemo_rl_result` does: the
    output items with non-empty `generation_token_ids` are the trainable turns; each one's
    `prompt_token_ids` must start with every token seen so far (else NeMo RL stops with
    "Non-contiguous messages found!"), its new prompt tokens become a non-trainable message and its
    generation a trainable one."""
    seen: list[int] = []
    prompt_ids: list[int] | None = None
    ids, mask, logprobs = [], [], []
    for item in result["response"]["output"]:
        if not item.get("generation_token_ids"):
            continue
        assert seen == item["prompt_token_ids"][: len(seen)], "Non-contiguous messages found!"
        new_prompt = item["prompt_token_ids"][len(seen):]
        if prompt_ids is None:
            prompt_ids = list(new_prompt)
        else:
            ids += new_prompt
            mask += [0] * len(new_prompt)
            logprobs += [0.0] * len(new_prompt)
        ids += item["generation_token_ids"]
        mask += [1] * len(item["generation_token_ids"])
        logprobs += item["generation_log_probs"]
        seen += new_prompt + item["generation_token_ids"]
    return {"prompt_ids": prompt_ids or [], "completion_ids": ids, "completion_mask": mask, "completion_logprobs": logprobs}
