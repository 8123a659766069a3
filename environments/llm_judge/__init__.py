"""llm_judge: free-form answers judged equivalent to the expected answer by a judge model (NeMo Gym's `equivalence_llm_judge`).

The judge sees the question and the two answers and must end with `[[A=B]]` (equivalent) or
`[[A!=B]]`. It is asked twice, with the expected and the model's answer in both positions, and
the reward is 1.0 only when both verdicts say equal, so a judge that favours one position
cannot hand out reward. A judge that fails (backend error, no verdict) masks the sample as a
`verifier` failure instead of scoring it 0. The judge is any backend: by default the embedded
model; `judge_model`, `judge_base_url`, `judge_api` pick another, or `judge` takes a `TextModel`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import regex

from gym_bridge import ConfigError, Environment, TextModel, Item, RolloutError, Task, VerifyResult, final_text

EQUAL, NOT_EQUAL = "[[A=B]]", "[[A!=B]]"

JUDGE_SYSTEM = f"""You are a strict grader. You are given a question and two answers to it, A and B.
Decide whether A and B give the same final answer: the same value, entity or claim, allowing different
wording, formatting, units written differently, or equivalent mathematical forms. Extra explanation
does not matter; a different, missing, hedged or contradictory final answer does.
Think briefly, then end your reply with exactly one verdict:
{EQUAL} if the answers are equivalent,
{NOT_EQUAL} if they are not."""

JUDGE_PROMPT = "QUESTION:\n{question}\n\nANSWER A:\n{first}\n\nANSWER B:\n{second}\n\nAre A and B equivalent? End with {equal} or {not_equal}."


class JudgeFailure(RolloutError):
    """The judge gave no usable verdict."""

    failure_kind = "verifier"


@dataclass(frozen=True)
class Verdict:
    """One judge call: whether it said equal, and its reply."""

    equal: bool
    reply: str


class LLMJudgeEnvironment(Environment):
    name = "llm_judge"
    aliases = ("equivalence_llm_judge", "equivalence_llm_judge_simple_agent")
    description = "Answer a question in free form; reward 1 if an LLM judge finds the answer equivalent to the expected one in both orders."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    resume = "replay"  # no tools; the judge runs once, in verify
    settings = ("judge", "judge_model", "judge_base_url", "judge_api", "judge_tokenizer", "judge_max_new_tokens",
                "judge_request_timeout_s", "judge_max_retries", "response_extract_regex", "regex_timeout_s")
    verify_timeout_s: ClassVar[float] = 600.0
    judge: ClassVar[TextModel | None] = None
    """The judge itself; when None it is built from the settings below."""
    judge_model: ClassVar[str | None] = None
    """A local model folder, or with `judge_base_url` the served model's name (None: the embedded model)."""
    judge_base_url: ClassVar[str | None] = None
    """An OpenAI-compatible server for the judge, e.g. http://127.0.0.1:8000/v1."""
    judge_api: ClassVar[str] = "completions"
    """With `judge_base_url`: `completions` (token ids, needs `judge_tokenizer`), `chat` or `responses`."""
    judge_tokenizer: ClassVar[str | None] = None
    judge_max_new_tokens: ClassVar[int] = 256
    judge_request_timeout_s: ClassVar[float] = 60.0
    """With `judge_base_url`: the bound on one attempt of one judge call."""
    judge_max_retries: ClassVar[int] = 2
    """With `judge_base_url`: attempts after the first (transport errors, timeouts, 5xx, 429)."""
    response_extract_regex: ClassVar[str | None] = None
    """Judge only the last match in the model's answer (its first non-empty group); rows can
    override it with `template_metadata.output_regex`."""
    regex_timeout_s: ClassVar[float] = 1.0
    """CPU seconds the answer regex may run (in a worker thread) before the sample is masked."""

    @classmethod
    def check_ready(cls) -> None:
        if cls.judge is None and cls.judge_api not in ("completions", "chat", "responses"):
            raise ConfigError(f"llm_judge: judge_api must be completions, chat or responses, got {cls.judge_api!r}")
        if cls.judge is None and cls.judge_base_url and not cls.judge_model:
            raise ConfigError("llm_judge: judge_base_url needs judge_model, the served model's name")

    @classmethod
    async def judge_model_instance(cls) -> TextModel:
        """The configured judge; the first call loads it (in a thread, once per process)."""
        if cls.judge is not None:
            return cls.judge
        from gym_bridge import load_text_model

        return await asyncio.to_thread(
            load_text_model, cls.judge_model, base_url=cls.judge_base_url, api=cls.judge_api, tokenizer=cls.judge_tokenizer,
            request_timeout_s=cls.judge_request_timeout_s, max_retries=cls.judge_max_retries,
        )

    async def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        expected = task.get("expected_answer")
        if expected is None:
            expected = (task.get("metadata") or {}).get("expected_answer")
        if expected is None or str(expected).strip() == "":
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=f"{task.source}: expected_answer: missing")
        pattern = (task.get("template_metadata") or {}).get("output_regex") or self.response_extract_regex
        try:
            answer = await asyncio.to_thread(extract_answer, final_text(output), pattern, timeout_s=self.regex_timeout_s)
        except TimeoutError:
            reason = f"the answer regex {pattern!r} ran past regex_timeout_s ({self.regex_timeout_s:g} s) on the model's answer"
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=reason)
        metrics: dict[str, Any] = {"extracted_answer": answer, "verdicts": []}
        if not answer:
            return VerifyResult(reward=0.0, reward_components={"equivalent": 0.0}, metrics=metrics)
        question = last_user_text(task)
        try:
            judge = await self.judge_model_instance()
            verdicts = await asyncio.gather(
                self._ask(judge, question, str(expected), answer, session_id=f"judge-{task.index}-ab"),
                self._ask(judge, question, answer, str(expected), session_id=f"judge-{task.index}-ba"),
            )
        except Exception as error:  # any judge failure is the verifier's, not the policy's
            return VerifyResult(
                reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=f"judge failed: {type(error).__name__}: {error}", metrics=metrics
            )
        metrics["verdicts"] = ["equal" if verdict.equal else "not_equal" for verdict in verdicts]
        metrics["judge_replies"] = [verdict.reply[-300:] for verdict in verdicts]
        equivalent = all(verdict.equal for verdict in verdicts)
        return VerifyResult(reward=float(equivalent), reward_components={"equivalent": float(equivalent)}, metrics=metrics)

    async def _ask(self, judge: TextModel, question: str, first: str, second: str, *, session_id: str) -> Verdict:
        prompt = JUDGE_PROMPT.format(question=question, first=first, second=second, equal=EQUAL, not_equal=NOT_EQUAL)
        messages = [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": prompt}]
        reply = await judge.complete(messages, max_new_tokens=self.judge_max_new_tokens, session_id=session_id)
        return Verdict(equal=parse_verdict(reply), reply=reply)


def parse_verdict(reply: str) -> bool:
    """True for `[[A=B]]`, False for `[[A!=B]]`, whichever comes last; raises JudgeFailure for neither."""
    equal_at, not_equal_at = reply.rfind(EQUAL), reply.rfind(NOT_EQUAL)
    if equal_at < 0 and not_equal_at < 0:
        raise JudgeFailure(f"the judge's reply has neither {EQUAL} nor {NOT_EQUAL}: {reply[-200:]!r}")
    return equal_at > not_equal_at


def extract_answer(text: str, pattern: str | None, *, timeout_s: float = 1.0) -> str:
    """`text` stripped, or with `pattern` its last match (first non-empty group); '' when nothing matches.

    The pattern comes from data and the text from the policy, so a nested quantifier can backtrack
    for minutes: matching uses the `regex` package, which gives up after `timeout_s` of CPU time
    (raising TimeoutError) and releases the GIL while it matches, so it can run in a worker thread.
    """
    text = text.strip()
    if not pattern or not text:
        return text
    try:
        matches = list(regex.finditer(pattern, text, flags=regex.MULTILINE | regex.DOTALL, timeout=timeout_s, concurrent=True))
    except regex.error:
        return text
    if not matches:
        return ""
    last = matches[-1]
    groups = [group for group in last.groups() if isinstance(group, str) and group.strip()]
    return (groups[0] if groups else last.group(0)).strip()


def last_user_text(task: Task) -> str:
    """The question: the last user message of the prompt."""
    for message in reversed(task.messages):
        if message["role"] == "user":
            return str(message.get("content") or "").strip()
    return ""
