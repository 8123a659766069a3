import json

import pytest

from gym_bridge import Engine, EngineConfig, ScriptedPolicy
from gym_bridge.core.errors import TemplateError, UnknownParserError
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.messages import ToolOutput
from gym_bridge.core.template.check import check_append_only, template_report
from tests.support.families import MINI_FAMILIES, family_tokenizer

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather of a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
MINI = {family.template.removeprefix("mini_").removesuffix(".jinja"): family for family in MINI_FAMILIES}

# Like a reasoning template that drops the reasoning of earlier assistant turns: not append-only.
DROPS_REASONING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and not loop.last %}{{ m.content.split('</tool_call>')[-1] }}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TemplatedTokenizer:
    """The embedded tokenizer with another chat template (and, optionally, no end-of-turn token)."""

    def __init__(self, base, template, eos_token_id="base"):
        self.base, self.chat_template = base, template
        self.eos_token_id = base.eos_token_id if eos_token_id == "base" else eos_token_id

    def apply_chat_template(self, conversation, **kwargs):
        return self.base.apply_chat_template(conversation, chat_template=self.chat_template, **kwargs)

    def encode(self, text, add_special_tokens=True):
        return self.base.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens=False):
        return self.base.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def mini(smol_tokenizer):
    def make(name, **options):
        tokenizer, eos_ids = family_tokenizer(smol_tokenizer, MINI[name])
        return tokenizer, ChatTemplate(tokenizer, eos_token_ids=eos_ids, **options)

    return make


def test_embedded_template_is_append_only_and_gets_tools_in_the_system_message(smol_template):
    check_append_only(smol_template)
    assert smol_template.tool_format == "hermes_system"
    assert smol_template.profile.tool_parser == "hermes" and not smol_template.profile.style.tool_calls  # raw turns
    text = smol_template.prompt_text([{"role": "user", "content": "Weather in Oslo?"}], TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools")
    assert json.dumps({"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                                        "parameters": TOOLS[0]["parameters"]}}) in text
    assert text.endswith("<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n")


def test_tool_delta_continues_after_the_sampled_eos(smol_template, smol_tokenizer):
    eos = smol_tokenizer.eos_token_id
    outputs = [ToolOutput(name="get_weather", content='{"t": 3}', call_id="c1")]
    delta = smol_template.tool_delta_ids(outputs, last_token_id=eos)
    assert smol_tokenizer.decode(delta) == '\n<|im_start|>tool\n{"t": 3}<|im_end|>\n<|im_start|>assistant\n'
    # A turn that ended without sampling EOS (a stop string) gets the whole closing.
    assert smol_tokenizer.decode(smol_template.tool_delta_ids(outputs, last_token_id=None)).startswith("<|im_end|>\n<|im_start|>tool")


@pytest.mark.parametrize("name", ["smol", "llama", "harmony", "mistral"])
def test_fast_delta_path_matches_full_rendering_for_awkward_contents(name, smol_template, mini):
    # Llama-like templates write tool outputs with tojson and trim user turns, gpt-oss-like ones use tojson,
    # Mistral-like ones render the call id: the fast path must reproduce each exactly.
    template = smol_template if name == "smol" else mini(name)[1]
    call_id = "a1B2c3D4e" if name == "mistral" else "call_7"
    for content in ['  {"a": "b"}\n', "tab\there & <tag> 'q' \u00e9 \"x\" \\", "", "{{ not jinja }}"]:
        for messages in ([{"role": "tool", "name": "f", "content": content, "tool_call_id": call_id}] * 2,
                         [{"role": "user", "content": content}]):
            if name == "mistral" and messages[0]["role"] == "user":
                continue  # tool-call turns only: the template allows no user turn after a call here
            fast = template.delta_text(messages, closing_sampled="")
            plan = template.deltas.plans[tuple((m["role"], m.get("name", "")) for m in messages)]
            assert plan.pieces is not None  # the cached fast path, not a render per delta
            assert fast == template.deltas.render(messages, structured=plan.structured)
            if messages[0]["role"] == "tool" and name == "mistral":
                assert call_id in fast


def test_native_tool_template_groups_results_like_qwen(mini):
    _, template = mini("qwen25")
    assert template.tool_format == "native"
    check_append_only(template)
    two = [ToolOutput(name="a", content="1", call_id="x"), ToolOutput(name="b", content="2", call_id="y")]
    delta = template.delta_text(template.tool_messages(two), closing_sampled="<|im_end|>")
    assert delta.count("<|im_start|>user") == 1  # both results grouped in one user turn
    assert delta.index("<tool_response>\n1") < delta.index("<tool_response>\n2") and delta.endswith("<|im_start|>assistant\n")


def test_template_that_rewrites_history_is_refused_with_the_reason(smol_tokenizer):
    template = ChatTemplate(TemplatedTokenizer(smol_tokenizer, DROPS_REASONING_TEMPLATE))
    with pytest.raises(TemplateError, match="not append-only for .* conversation shapes"):
        check_append_only(template)


def test_reasoning_template_is_judged_per_shape_with_an_offered_fix(mini):
    _, template = mini("think")
    report = template_report(template)
    verdicts = {result.shape: result.verdict for result in report.shapes}
    assert verdicts["two tool-call turns in a row"] == "append-only"
    assert verdicts["new user message after an answer"] == "rewrites history"
    assert "drops the reasoning of earlier turns" in report.message()
    assert report.alternatives == ({"preserve_thinking": True},)  # checked, not guessed
    assert "chat_template_kwargs={'preserve_thinking': True}" in report.message()
    check_append_only(mini("think", chat_template_kwargs={"preserve_thinking": True})[1])


def test_hermes_like_template_gets_tools_on_every_render(mini):
    tokenizer, template = mini("hermes")
    with pytest.raises(TypeError):  # what a render without tools does to this template
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=None, tokenize=False)
    assert template.prompt_text([{"role": "user", "content": "hi"}], None).endswith("<|im_start|>assistant\n")
    check_append_only(template)


def test_mistral_ids_are_nine_letters_and_digits(mini):
    _, template = mini("mistral")
    assert template.profile.style.short_ids
    derived = {template.call_id(f"0-{n}_{n}") for n in range(50)}
    assert len(derived) == 50 and all(len(i) == 9 and i.isalnum() for i in derived)
    assert template.call_id("0-0_1") == template.call_id("0-0_1")  # deterministic
    assert template.call_id("0-0_1", written="a1B2c3D4e") == "a1B2c3D4e"  # the model's own id is kept
    assert template.call_id("0-0_1", written="call_1") != "call_1"  # not a valid Mistral id: replaced


def test_tokenizer_without_template_or_end_of_turn_token_is_refused(smol_tokenizer):
    with pytest.raises(TemplateError, match="no chat template"):
        ChatTemplate(TemplatedTokenizer(smol_tokenizer, None))
    with pytest.raises(TemplateError, match="no end-of-turn token"):
        ChatTemplate(TemplatedTokenizer(smol_tokenizer, DROPS_REASONING_TEMPLATE, eos_token_id=None))


def test_template_ending_turns_with_another_token_is_refused_at_start(smol_tokenizer):
    ends_with_newline = "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n\n{%- endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    template = ChatTemplate(TemplatedTokenizer(smol_tokenizer, ends_with_newline))
    with pytest.raises(TemplateError, match="ends an assistant turn with .* none of the end-of-turn tokens .* eos_token_ids"):
        Engine(ScriptedPolicy({}), template, EngineConfig())


@pytest.mark.parametrize("body, requirement", [
    ("{{ raise_exception('Conversations must start with a user message!') }}", "Conversations must start with a user message!"),
    ("{{ m.content + 1 }}", "TypeError"),
])
def test_template_errors_become_template_errors_naming_the_requirement(smol_tokenizer, body, requirement):
    text = "{%- for m in messages %}{% if m.role == 'assistant' %}" + body + "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}" \
           "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    template = ChatTemplate(TemplatedTokenizer(smol_tokenizer, text))
    with pytest.raises(TemplateError, match=requirement):
        Engine(ScriptedPolicy({}), template, EngineConfig(template_check="off"))


def test_parser_override_and_unknown_names(smol_template):
    engine = Engine(ScriptedPolicy({}), smol_template, EngineConfig(tool_parser="mistral"))
    assert engine.template.profile.tool_parser == "mistral" and smol_template.profile.tool_parser == "hermes"
    with pytest.raises(UnknownParserError, match="known tool parsers: hermes, llama3_json"):
        Engine(ScriptedPolicy({}), smol_template, EngineConfig(tool_parser="nope"))


class ShoutingTokenizer(TemplatedTokenizer):
    """A tokenizer whose own rendering is not its template's jinja rendering (upper-cased)."""

    special_tokens_map = {"eos_token": "<|im_end|>"}

    def apply_chat_template(self, conversation, **kwargs):
        return super().apply_chat_template(conversation, **kwargs).upper()


def test_direct_rendering_only_where_it_gives_the_tokenizers_own_text(smol_tokenizer, smol_template):
    """`ChatTemplate` renders with gym_bridge's jinja renderer (no per-call transformers conversion) only
    when that equals the tokenizer's `apply_chat_template` on probes; otherwise every call goes to the tokenizer."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"}]
    assert smol_template._direct_template() == smol_tokenizer.chat_template
    for tools in (None, TOOLS):
        rendered = smol_template.render(messages, tools=tools, add_generation_prompt=True)
        expected_messages = smol_template._with_tool_system(messages, tools)
        assert rendered == smol_tokenizer.apply_chat_template(expected_messages, tokenize=False, add_generation_prompt=True)

    shouting = ChatTemplate(ShoutingTokenizer(smol_tokenizer, smol_tokenizer.chat_template))
    assert shouting._direct_template() is None
    assert shouting.render(messages, tools=None, add_generation_prompt=True).startswith("<|IM_START|>SYSTEM\nBE BRIEF.")
    with_argument = ChatTemplate(smol_tokenizer, chat_template_kwargs={"documents": []})
    assert with_argument._direct_template() is None  # an apply_chat_template parameter, not a template variable


@pytest.mark.parametrize("tool_format", ["hermes", "Native", ""])
def test_an_unknown_tool_format_is_refused(smol_tokenizer, tool_format):
    """A NeMo RL config's `tool_format` reaches the template as a plain string: an unknown one used to
    render the prompt with no tools at all (neither `native` nor `hermes_system`)."""
    with pytest.raises(TemplateError, match=rf"tool_format must be one of native, hermes_system \(or unset\), got '{tool_format}'"):
        ChatTemplate(smol_tokenizer, tool_format=tool_format)
