"""The docs' Model backends page (the README until issue 29) states serve-model's limits (issue 19 item 18; documentation),
and the server refuses what it says it does not do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gym_bridge.core.dialects.chat import ApiError
from gym_bridge.core.dialects.completions import CompletionBody

ROOT = Path(__file__).resolve().parents[2]


def _limits_paragraph() -> str:
    text = (ROOT / "docs" / "backends.md").read_text(encoding="utf-8")
    match = re.search(r"What `serve-model` does not do.*?\n\n", text, re.S)
    assert match, "docs/backends.md has no paragraph on serve-model's limits"
    return match.group(0)


def test_the_readme_names_every_refused_request_field():
    paragraph = _limits_paragraph()
    for field in ("stream", "top_logprobs", "best_of", "beam search", "logit_bias", "prompt_logprobs", "echo", "suffix",
                  "min_p", "min_tokens", "ignore_eos"):
        assert field in paragraph, field


@pytest.mark.parametrize("field", [{"stream": True}, {"best_of": 2}, {"logit_bias": {"1": 1.0}}, {"prompt_logprobs": 1},
                                   {"use_beam_search": True}, {"min_p": 0.1}, {"ignore_eos": True}])
def test_the_server_refuses_what_the_readme_says_it_does_not_do(field):
    body = CompletionBody.model_validate({"prompt": [1, 2], **field})
    with pytest.raises(ApiError):
        body.check_supported()
