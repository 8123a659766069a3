"""Model families for template-conformance tests: the real chat templates in ../shared/templates
(copied unchanged from public sources) and small self-written templates that reproduce each
behaviour, each with its turn markers, end-of-turn tokens and the way its models write calls.

`family_tokenizer` copies the embedded SmolLM2 tokenizer, registers the family's markers as
special tokens (so a turn ends on one id, as with the real tokenizer) and assigns the template.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SHARED_TEMPLATES = Path(os.environ.get("GYM_BRIDGE_TEMPLATES") or Path(__file__).resolve().parents[2].parent / "shared" / "templates")
"""Real chat templates (Jinja files copied unchanged from llama.cpp's `models/templates/` and vLLM's `examples/`,
listed with their sources in that folder's README.md): `../shared/templates` beside the checkout, or
`$GYM_BRIDGE_TEMPLATES`. A fresh clone has neither, and the tests on them skip saying so."""
TEMPLATES_MISSING = (
    f"real chat templates not found at {SHARED_TEMPLATES}: they are Jinja files copied from llama.cpp's models/templates/ "
    "(Qwen, Llama 3, Mistral, DeepSeek, Granite, gpt-oss) and vLLM's examples/ (Mistral, Phi-4-mini), kept outside the "
    "repository in ../shared/templates (its README.md lists each file's source); put copies there or set GYM_BRIDGE_TEMPLATES=DIR"
)
MINI_TEMPLATES = Path(__file__).resolve().parents[1] / "core" / "template" / "templates"
REASONING = "The user wants the values; I call the tools in order."

CHATML = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
LLAMA = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|python_tag|>")
MISTRAL = ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
           "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[CALL_ID]", "[ARGS]", "[TOOL_CONTENT]")
DEEPSEEK = ("<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>", "<\uff5cAssistant\uff5c>",
            "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>", "<\uff5ctool\u2581call\u2581begin\uff5c>",
            "<\uff5ctool\u2581call\u2581end\uff5c>", "<\uff5ctool\u2581sep\uff5c>", "<\uff5ctool\u2581outputs\u2581begin\uff5c>",
            "<\uff5ctool\u2581outputs\u2581end\uff5c>", "<\uff5ctool\u2581output\u2581begin\uff5c>", "<\uff5ctool\u2581output\u2581end\uff5c>")
DS_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"
GRANITE = ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>")
PHI4 = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|tool|>", "<|endoftext|>")
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")


def _args(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments)


# How each family's models write one call (name, arguments, the call's 9-character id where the family has ids).
def hermes(name, arguments, call_id):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {_args(arguments)}}}\n</tool_call>'


def llama3(name, arguments, call_id):
    return f'{{"name": "{name}", "parameters": {_args(arguments)}}}'


def mistral_v3(name, arguments, call_id):
    return f'[TOOL_CALLS][{{"name": "{name}", "arguments": {_args(arguments)}, "id": "{call_id}"}}]'


def mistral_v13(name, arguments, call_id):
    return f"[TOOL_CALLS]{name}[CALL_ID]{call_id}[ARGS]{_args(arguments)}"


def mistral_plain(name, arguments, call_id):
    return f'[TOOL_CALLS][{{"name": "{name}", "arguments": {_args(arguments)}}}]'


def deepseek_v3(name, arguments, call_id):
    return ("<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>function<\uff5ctool\u2581sep\uff5c>"
            f"{name}\n```json\n{_args(arguments)}\n```<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>")


def deepseek_v31(name, arguments, call_id):
    return (f"<\uff5ctool\u2581calls\u2581begin\uff5c><\uff5ctool\u2581call\u2581begin\uff5c>{name}<\uff5ctool\u2581sep\uff5c>"
            f"{_args(arguments)}<\uff5ctool\u2581call\u2581end\uff5c><\uff5ctool\u2581calls\u2581end\uff5c>")


def granite(name, arguments, call_id):
    return f'<|tool_call|>[{{"name": "{name}", "arguments": {_args(arguments)}}}]'


def phi4(name, arguments, call_id):
    return f'functools[{{"name": "{name}", "arguments": {_args(arguments)}}}]'


def harmony(name, arguments, call_id):
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{_args(arguments)}"


def harmony_template_style(name, arguments, call_id):
    return f" to=functions.{name}<|channel|>commentary json<|message|>{_args(arguments)}"


def qwen3_coder(name, arguments, call_id):
    params = "".join(f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
                     for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def think(reasoning):
    return f"<think>\n{reasoning}\n</think>\n\n"


def opened_think(reasoning):
    return f"{reasoning}\n</think>\n\n"


def analysis(reasoning):
    return f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant"


def final_channel(text):
    return f"<|channel|>final<|message|>{text}"


@dataclass(frozen=True)
class Family:
    label: str
    template: str
    """File name, under ../shared/templates (real) or tests/core/template/templates (mini)."""
    markers: tuple[str, ...]
    eos: str
    """The tokenizer's own end-of-turn token."""
    write_call: Callable[[str, dict[str, Any], str], str]
    tool_parser: str
    reasoning_parser: str
    append_only: bool
    """The check's expected verdict (every shape append-only or not renderable)."""
    extra_eos: tuple[str, ...] = ()
    """More end-of-turn tokens of the generation config (listed first, as in the real configs)."""
    bos: str | None = None
    reason: Callable[[str], str] | None = None
    """How its models write reasoning before a turn (None: the family does not reason)."""
    call_end: str | None = None
    """The token that ends a turn with a call, where it is not `eos` (gpt-oss: <|call|>)."""
    write_answer: Callable[[str], str] = field(default=lambda text: text)
    raw_turns: bool = False
    """The template gets assistant turns as raw text (it does not render tool_calls readably)."""
    writes_ids: bool = False
    """Its models write each call's id (Mistral v3 and v13 syntaxes)."""
    mini: bool = False
    note: str = ""
    """What the table says about the family beyond the check's verdicts."""

    @property
    def path(self) -> Path:
        return (MINI_TEMPLATES if self.mini else SHARED_TEMPLATES) / self.template


REAL_FAMILIES = [
    Family("Qwen2.5", "llamacpp__Qwen-Qwen2.5-7B-Instruct.jinja", CHATML, "<|im_end|>", hermes, "hermes", "none", True,
           extra_eos=("<|endoftext|>",)),
    Family("Qwen3", "llamacpp__Qwen-Qwen3-0.6B.jinja", CHATML, "<|im_end|>", hermes, "hermes", "qwen3", False,
           extra_eos=("<|endoftext|>",), reason=think,
           note='drops the `<think>` block of turns before the last user message; `enable_thinking=False` is no way out (its template then drops the empty think block of earlier turns)'),
    Family("QwQ", "llamacpp__Qwen-QwQ-32B.jinja", CHATML, "<|im_end|>", hermes, "hermes", "deepseek_r1", False,
           extra_eos=("<|endoftext|>",), reason=opened_think,
           note='the generation prompt opens `<think>`; earlier turns lose their reasoning'),
    Family("Hermes-3", "llamacpp__NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", CHATML + ("<|begin_of_text|>",),
           "<|im_end|>", hermes, "hermes", "none", False, bos="<|begin_of_text|>",
           note='adds a newline after the last tool response once another turn follows; iterates `tools` on every render (gym_bridge passes `tools=[]` when there are none)'),
    Family("Hermes-2-Pro", "llamacpp__NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", CHATML + ("<|begin_of_text|>",),
           "<|im_end|>", hermes, "hermes", "none", False, bos="<|begin_of_text|>",
           note='same template as Hermes-3'),
    Family("Llama-3.1", "llamacpp__meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA, "<|eot_id|>", llama3, "llama3_json", "none",
           True, extra_eos=("<|end_of_text|>", "<|eom_id|>"), bos="<|begin_of_text|>",
           note='one call per turn (the template refuses parallel calls); tool outputs written as JSON strings'),
    Family("Llama-3.2", "llamacpp__meta-llama-Llama-3.2-3B-Instruct.jinja", LLAMA, "<|eot_id|>", llama3, "llama3_json", "none",
           True, extra_eos=("<|end_of_text|>", "<|eom_id|>"), bos="<|begin_of_text|>",
           note='as Llama-3.1'),
    Family("Mistral-Nemo", "llamacpp__mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL, "</s>", mistral_v3, "mistral", "none",
           False, bos="<s>", writes_ids=True,
           note='moves the system message into the last user turn; call ids of 9 letters and digits (ids the model writes are kept)'),
    Family("Mistral-Small-3.2", "llamacpp__Mistral-Small-3.2-24B-Instruct-2506.jinja", MISTRAL, "</s>", mistral_v13, "mistral",
           "none", False, bos="<s>", writes_ids=True,
           note='moves `[AVAILABLE_TOOLS]` before the last user turn; append-only for calls only if the model writes `[CALL_ID]` as the template renders it'),
    Family("Mistral (vLLM example)", "vllm__mistral.jinja", MISTRAL, "</s>", mistral_plain, "mistral", "none", False, bos="<s>",
           raw_turns=True,
           note='renders `content`, not `tool_calls`, after `[TOOL_CALLS]` and pads plain answers with spaces'),
    Family("DeepSeek-R1-Distill", "llamacpp__deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", DEEPSEEK, DS_EOS, deepseek_v3,
           "deepseek_v3", "deepseek_r1", False, bos=DEEPSEEK[0], reason=opened_think, raw_turns=True,
           note='renders calls only for `content: None`, a key transformers 5 drops before rendering, so turns are given as sampled; earlier reasoning dropped'),
    Family("DeepSeek-V3.1", "llamacpp__deepseek-ai-DeepSeek-V3.1.jinja", DEEPSEEK, DS_EOS, deepseek_v31, "deepseek_v31", "qwen3",
           True, bos=DEEPSEEK[0],
           note='arguments as JSON text; thinking is off by default: with `thinking: true` in chat_template_kwargs the prompt opens `<think>` and earlier reasoning is dropped (rewrites history)'),
    Family("Granite-3.3", "llamacpp__ibm-granite-granite-3.3-2B-Instruct.jinja", GRANITE, "<|end_of_text|>", granite, "granite",
           "qwen3", True, raw_turns=True,
           note='ignores `tool_calls`: turns are given as sampled'),
    Family("Phi-4-mini", "vllm__phi4_mini.jinja", PHI4, "<|end|>", phi4, "phi4_mini_json", "none", True,
           extra_eos=("<|endoftext|>",), raw_turns=True,
           note='renders `tool_calls` without the `functools` marker: turns are given as sampled'),
    Family("gpt-oss", "llamacpp__openai-gpt-oss-120b.jinja", HARMONY, "<|return|>", harmony, "openai", "openai_gptoss", False,
           extra_eos=("<|call|>",), reason=analysis, call_end="<|call|>", write_answer=final_channel,
           note='drops the analysis channel once a final answer follows; one call per turn; a model that writes the recipient in the channel header (`<|channel|>commentary to=functions.X`) is shown it in the role header on later turns'),
]


def family_tokenizer(base: Any, family: Family) -> tuple[Any, list[int]]:
    """A copy of `base` with the family's markers, end-of-turn token and template; and the ids of
    the generation config's end-of-turn list (extra ones first, then the tokenizer's own)."""
    tokenizer = copy.deepcopy(base)
    tokenizer.add_special_tokens({"additional_special_tokens": list(family.markers)})
    tokenizer.eos_token = family.eos
    if family.bos is not None:
        tokenizer.bos_token = family.bos
    tokenizer.chat_template = family.path.read_text()
    eos_ids = [tokenizer.convert_tokens_to_ids(token) for token in (*family.extra_eos, family.eos)]
    return tokenizer, eos_ids
MINI_FAMILIES = [
    Family("mini Qwen2.5-like", "mini_qwen25.jinja", CHATML, "<|im_end|>", hermes, "hermes", "none", True,
           extra_eos=("<|endoftext|>",), mini=True),
    Family("mini Hermes-like", "mini_hermes.jinja", CHATML, "<|im_end|>", hermes, "hermes", "none", True, mini=True),
    Family("mini Mistral-like", "mini_mistral.jinja", MISTRAL, "</s>", mistral_v3, "mistral", "none", True, bos="<s>",
           writes_ids=True, mini=True),
    Family("mini gpt-oss-like", "mini_harmony.jinja", HARMONY, "<|return|>", harmony, "openai", "openai_gptoss", False,
           extra_eos=("<|call|>",), reason=analysis, call_end="<|call|>", write_answer=final_channel, mini=True),
    Family("mini Qwen3-like", "mini_think.jinja", CHATML, "<|im_end|>", hermes, "hermes", "qwen3", False, reason=think, mini=True),
    Family("mini QwQ-like", "mini_opened_think.jinja", CHATML, "<|im_end|>", hermes, "hermes", "deepseek_r1", False,
           reason=opened_think, mini=True),
    Family("mini Llama-3-like", "mini_llama.jinja", LLAMA, "<|eot_id|>", llama3, "llama3_json", "none", True,
           extra_eos=("<|end_of_text|>", "<|eom_id|>"), bos="<|begin_of_text|>", mini=True),
    Family("mini Granite-like", "mini_granite.jinja", GRANITE, "<|end_of_text|>", granite, "granite", "none", True,
           raw_turns=True, mini=True),
    Family("mini Phi-4-like", "mini_phi4.jinja", PHI4, "<|end|>", phi4, "phi4_mini_json", "none", True, raw_turns=True, mini=True),
    Family("mini DeepSeek-V3.1-like", "mini_deepseek.jinja", DEEPSEEK, DS_EOS, deepseek_v31, "deepseek_v31", "none", True,
           bos=DEEPSEEK[0], mini=True),
    Family("mini Qwen3-Coder-like", "mini_qwen3_coder.jinja", CHATML, "<|im_end|>", qwen3_coder, "qwen3_coder", "none", True,
           mini=True),
]


def written_id(index: int) -> str:
    return f"c{index}xYz90Qa"  # nine letters and digits, as Mistral ids


SYNONYMS = ("Warm", "Blazing")


def scripted_turns(family: Family, tokenizer: Any) -> tuple[list[tuple[str, dict[str, Any]]], list[Any]]:
    """The calls of a multi_step solution (two lookups, one submission) and the model turns that make
    them, written in the family's own syntax (with reasoning where the family reasons), then an answer."""
    from gym_bridge import Generation

    def turn(text: str, end: str) -> Generation:
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(end)]
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    reason = family.reason(REASONING) if family.reason else ""
    calls = [("get_synonym_value", {"synonym": word}) for word in SYNONYMS]
    calls.append(("extract_synonym_values", {"synonym_values": [sum(map(ord, word)) for word in SYNONYMS]}))
    turns = [turn(reason + family.write_call(name, arguments, written_id(index)), family.call_end or family.eos)
             for index, (name, arguments) in enumerate(calls)]
    turns.append(turn(reason + family.write_answer("I submitted the values."), family.eos))
    return calls, turns


def run_scripted(family: Family, tokenizer: Any, template: Any, *, repeats: int = 2) -> list[Any]:
    """Records of scripted multi_step rollouts, under the template_check documented for the family's verdict."""
    import asyncio
    import warnings

    from gym_bridge import Engine, EngineConfig, Limits, ScriptedPolicy, get_environment, load_tasks

    _, turns = scripted_turns(family, tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # families that rewrite history run with the documented 'warn'
        engine = Engine(ScriptedPolicy({"": turns}), template, EngineConfig(
            template_check="error" if family.append_only else "warn", limits=Limits(max_turns=6, max_completion_tokens=4096)))
    tasks = load_tasks(get_environment("multi_step").example_data, limit=1)

    async def run() -> list[Any]:
        return [record async for record in engine.stream(tasks, repeats=repeats)]

    return asyncio.run(run())


def prompt_mismatches(record: Any, template: Any, tokenizer: Any) -> list[int]:
    """The model calls (0-based) whose prompt text differs from the template's rendering of the
    structured conversation before them."""
    messages, tools, start, call, bad = list(record.task.messages), list(record.task.tools or ()), 0, 0, []
    for position, item in enumerate(record.output):
        if item["type"] == "function_call_output" or (item["type"] == "message" and item.get("role") == "user"):
            start = position + 1  # what the environment added: the next model call's items start after it
        elif "generation_token_ids" in item:  # the last item of a model call, whose items began at `start`
            expected = template.render(messages + template.conversation(record.output[:start]), tools=tools, add_generation_prompt=True)
            if tokenizer.decode(item["prompt_token_ids"], skip_special_tokens=False) != expected:
                bad.append(call)
            start, call = position + 1, call + 1
    return bad


THINK = ("<think>", "</think>")
"""Reasoning markers, single added tokens in the tokenizers of the families that reason."""
MISTRAL_V3 = tuple(marker for marker in MISTRAL if marker not in ("[CALL_ID]", "[ARGS]"))
"""A pre-v11 Mistral tokenizer's markers (no `[ARGS]`): vLLM reads `[TOOL_CALLS][...]` JSON lists with it."""
PARSER_MARKERS = {
    "hermes": CHATML, "llama3_json": LLAMA, "mistral": MISTRAL, "mistral_v3": MISTRAL_V3, "deepseek_v3": DEEPSEEK, "deepseek_v31": DEEPSEEK,
    "granite": GRANITE, "phi4_mini_json": PHI4, "openai": HARMONY, "qwen3_coder": CHATML,
}
"""The special tokens of a tokenizer of each tool parser's family (and of a pre-v11 Mistral one)."""


def parser_tokenizer(base: Any, markers: tuple[str, ...]) -> Any:
    """A copy of `base` with `markers` and the reasoning markers as special tokens, as vLLM's
    parsers look their markers up in the vocabulary."""
    tokenizer = copy.deepcopy(base)
    tokenizer.add_special_tokens({"additional_special_tokens": list(markers) + [m for m in THINK if m not in markers]})
    return tokenizer
