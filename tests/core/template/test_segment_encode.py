"""`ChatTemplate.encode` cuts a text into pieces (see `gym_bridge.core.template.piece_encoder`) and keeps
each piece's ids: it must give exactly the ids of `tokenizer.encode(text, add_special_tokens=False)`,
for every family's template and markers, on the first and on repeated calls."""

import pytest

from gym_bridge import get_environment, load_tasks
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.messages import ToolOutput
from tests.support.families import MINI_FAMILIES, REAL_FAMILIES, SHARED_TEMPLATES, family_tokenizer

real_present = pytest.mark.skipif(not SHARED_TEMPLATES.is_dir(), reason=f"real chat templates not found at {SHARED_TEMPLATES}")
FAMILIES = [pytest.param(f, id=f.label, marks=real_present) for f in REAL_FAMILIES] + [
    pytest.param(f, id=f.label) for f in MINI_FAMILIES]

EDGE_TEXTS = [
    "", " ", "\n", "\n\n\n", "  leading and trailing  ", "\t tabs\tand\r\nCRLF\r\n", "x" * 3000, "a  b   c    d",
    "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001f600\U0001f44d\U0001f3fd z\u0301", "\u2063invisible\u200bjoiner\ufeff",
    "<|im_start|>", "<|im_start|><|im_end|>", "<|im_start|>user\nhi<|im_end|>\n", "x<|im_end|>y<|im_end|> z ",
    "<|im_start", "|im_start|>", "<<|im_start|>>", "<|im_end|><|im_start|>assistant\n", " <|endoftext|> ", "<|endoftext|>\n\n",
    "12345678901234567890 3.14159 -42 1e10", '{"name": "f", "arguments": {"a": [1, 2, {"b": "\\u00e9\\n"}]}}',
    "<tool_call>\n{}\n</tool_call>", "  \n  \n", "word<empty_output>word", "'s 're 've 'll 'd 't",
]


def texts_for(template: ChatTemplate, markers) -> list[str]:
    """Rendered prompts of the weather and multi_step rows (tools included), tool deltas, edge
    cases and the family's markers glued to text, spaces and each other."""
    texts = list(EDGE_TEXTS)
    for name in ("weather", "multi_step"):
        for task in load_tasks(get_environment(name).example_data)[:4]:
            texts.append(template.prompt_text(task.messages, task.tools))
    for outputs in ([ToolOutput("get_weather", '{"city": "Paris", "t": "  cold\\n"}', "call_1")],
                    [ToolOutput("a", "one", "call_1"), ToolOutput("b", " two \n", "call_2")]):
        texts.append(template.delta_text(template.tool_messages(outputs), closing_sampled=""))
    for marker in markers:
        texts += [marker, f" {marker} ", f"a{marker}b", f"{marker}{marker}", f"\n{marker}\n\u00e9", marker[:-1], f"{marker[1:]} x"]
    texts.append("".join(markers))
    return texts


def check(template: ChatTemplate, tokenizer, texts) -> None:
    for attempt in range(2):  # the second pass reads the kept pieces
        for text in texts:
            assert template.encode(text) == tokenizer.encode(text, add_special_tokens=False), (attempt, text)


def test_embedded_tokenizer_uses_the_split_path_and_matches(smol_tokenizer):
    template = ChatTemplate(smol_tokenizer)
    assert template.codec.pieces is not None and template.codec.pieces.splitter is not None
    check(template, smol_tokenizer, texts_for(template, ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<empty_output>")))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_matches_plain_encode(family, smol_tokenizer):
    tokenizer, eos_ids = family_tokenizer(smol_tokenizer, family)
    template = ChatTemplate(tokenizer, eos_token_ids=eos_ids)
    assert template.codec.pieces is not None and template.codec.pieces.splitter is not None
    check(template, tokenizer, texts_for(template, family.markers))


def test_tokens_added_later_are_split_on(smol_tokenizer):
    import copy

    tokenizer = copy.deepcopy(smol_tokenizer)
    template = ChatTemplate(tokenizer)
    text = "before [NEW_MARK] after"
    check(template, tokenizer, [text])
    tokenizer.add_special_tokens({"additional_special_tokens": ["[NEW_MARK]"]})
    assert template.encode(text) == tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("[NEW_MARK]") in template.encode(text)


def test_a_normalizing_tokenizer_still_matches(smol_tokenizer):
    import copy

    from tokenizers import normalizers

    tokenizer = copy.deepcopy(smol_tokenizer)
    tokenizer._tokenizer.normalizer = normalizers.Lowercase()
    template = ChatTemplate(tokenizer)
    check(template, tokenizer, ["MiXeD <|im_start|>CaSe", *EDGE_TEXTS[:8]])
