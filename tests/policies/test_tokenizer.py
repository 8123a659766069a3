"""LightTokenizer (no transformers) against transformers on the same folder: chat templates render to the
same text (every template in ../shared/templates, many conversation shapes), texts encode to the same
ids (the piece cache included) and decode to the same text, and the EOS ids are the same."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Regex, normalizers, pre_tokenizers

from gym_bridge.core.template.render import prepared_messages
from gym_bridge.core.task import load_tasks
from gym_bridge.core.template.chat_template import ChatTemplate
from gym_bridge.core.template.messages import ToolOutput
from gym_bridge.core.template.check import check_append_only
from gym_bridge.policies.embedded import embedded_model_path
from gym_bridge.core.template.piece_encoder import _AFTER_NEWLINE, _BEFORE_LAST_NEWLINE, _Splitter
from gym_bridge.core.template.piece_encoder import splitter_for
from gym_bridge.policies.tokenizer import LightTokenizer, load_light_tokenizer
from tests.support.families import SHARED_TEMPLATES, TEMPLATES_MISSING

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [ROOT / "environments" / name / "data" / "example.jsonl" for name in ("weather", "multi_step", "math")]
TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                      "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Submit values.",
                                      "parameters": {"type": "object", "properties": {"values": {"type": "array", "items": {"type": "integer"}}}}}},
]
CALL = {"id": "call0A1b2", "type": "function", "function": {"name": "lookup", "arguments": {"word": "a"}}}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is 2+2?"}],
    "system + user": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <there> & 'you' \u00e9\u4f60"}],
    "two turns": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "And now?"}],
    "tool call and output": [{"role": "user", "content": "Look up a."}, {"role": "assistant", "content": "", "tool_calls": [CALL]},
                             {"role": "tool", "tool_call_id": "call0A1b2", "name": "lookup", "content": '{"value": 4}'},
                             {"role": "assistant", "content": "It is 4."}],
    "reasoning and a None field": [{"role": "user", "content": "Think."},
                                   {"role": "assistant", "content": "Done.", "reasoning_content": "Let me see.", "tool_calls": None},
                                   {"role": "user", "content": "Again."}],
    "reasoning in the last turn": [{"role": "user", "content": "Think."},
                                   {"role": "assistant", "content": "Done.", "reasoning_content": "Let me see."}],
}


@pytest.fixture(scope="module")
def light():
    return load_light_tokenizer(embedded_model_path())


def _templates() -> dict[str, str]:
    templates = {"embedded SmolLM2": (embedded_model_path() / "chat_template.jinja").read_text()}
    if SHARED_TEMPLATES.is_dir():
        templates.update({path.name: path.read_text() for path in sorted(SHARED_TEMPLATES.glob("*.jinja"))})
    return templates


def _render(tokenizer, template, conversation, **kwargs):
    """The rendered text, or the exception's type and message (both sides must fail alike)."""
    try:
        if not isinstance(tokenizer, LightTokenizer):  # gym_bridge prepares messages for any renderer (see prepared_messages)
            conversation = prepared_messages(conversation)
        return tokenizer.apply_chat_template(conversation, chat_template=template, tokenize=False, **kwargs)
    except Exception as error:  # templates raise for shapes they refuse (role alternation, ...)
        return f"{type(error).__name__}: {error}"


def test_every_template_renders_as_transformers_renders_it(light, smol_tokenizer):
    templates = _templates()
    if not SHARED_TEMPLATES.is_dir():
        pytest.skip(f"{TEMPLATES_MISSING} (only the embedded template was compared)")  # pragma: no cover
    compared = 0
    for name, template in templates.items():
        for shape, conversation in CONVERSATIONS.items():
            for kwargs in ({"add_generation_prompt": True}, {"add_generation_prompt": False, "tools": TOOLS},
                           {"add_generation_prompt": True, "tools": TOOLS, "enable_thinking": False}):
                ours, theirs = _render(light, template, conversation, **kwargs), _render(smol_tokenizer, template, conversation, **kwargs)
                assert ours == theirs, (name, shape, kwargs)
                compared += 1
    assert compared == len(templates) * len(CONVERSATIONS) * 3 and len(templates) >= 15


def _corpus() -> list[str]:
    texts = [path.read_text() for path in (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
                                                  *sorted((ROOT / "gym_bridge" / "cli").glob("*.py")), *EXAMPLES)]
    rng = random.Random(0)
    alphabet = list("abcXYZ 019.,!?'\"#<>{}[]():-_\n\t\r") + ["  ", "\n\n", " \n", "\u00e9", "\u4f60", "\u0301", "\U0001f600",
                                                            "<|im_start|>", "<|im_end|>", "<|endoftext|>", "token_id:5"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(400)]
    return texts


def test_encode_and_decode_match_transformers(light, smol_tokenizer):
    for text in _corpus():
        ids = smol_tokenizer.encode(text, add_special_tokens=False)
        assert light.encode(text, add_special_tokens=False) == ids, text
        assert light.encode(text, add_special_tokens=False) == ids, text  # again, from the piece cache
        assert light.encode(text) == smol_tokenizer.encode(text)
        assert light.decode(ids) == smol_tokenizer.decode(ids)
        assert light.decode(ids, skip_special_tokens=True) == smol_tokenizer.decode(ids, skip_special_tokens=True)


def test_chat_templates_on_either_tokenizer_give_the_same_ids(light, smol_tokenizer):
    ours, theirs = ChatTemplate(light, eos_token_ids=light.eos_token_ids), ChatTemplate(smol_tokenizer)
    check_append_only(ours)
    assert ours.eos_token_ids == theirs.eos_token_ids == frozenset({smol_tokenizer.eos_token_id})
    for path in EXAMPLES:
        for task in load_tasks(path, default_env="math"):
            assert ours.prompt_ids(task.messages, task.tools) == theirs.prompt_ids(task.messages, task.tools)
    outputs = [ToolOutput(name="lookup", content='{"value": 4}\nline two', call_id="call_1")]
    eos = smol_tokenizer.eos_token_id
    assert ours.tool_delta_ids(outputs, last_token_id=eos) == theirs.tool_delta_ids(outputs, last_token_id=eos)
    assert ours.user_delta_ids("And b?", last_token_id=None) == theirs.user_delta_ids("And b?", last_token_id=None)


def test_special_tokens_and_eos_ids_are_read_from_the_folder(light, smol_tokenizer):
    assert light.special_tokens_map == smol_tokenizer.special_tokens_map
    assert (light.eos_token, light.eos_token_id, light.bos_token_id) == (smol_tokenizer.eos_token, smol_tokenizer.eos_token_id,
                                                                         smol_tokenizer.bos_token_id)
    assert light.sep_token is None and light.sep_token_id is None
    assert len(light) == len(smol_tokenizer)
    assert light.chat_template == smol_tokenizer.chat_template


def test_prompts_are_cut_only_where_tokenizers_itself_cuts(light):
    backend = light.backend_tokenizer
    assert light._pieces.splitter is not None and light._pieces.splitter.lines is _BEFORE_LAST_NEWLINE  # GPT-2 byte-level pattern
    # cutting after the newline instead would not be exact for this pattern: "\n\n#" is "\n" + "\n" + "#"
    # inside a text but "\n\n" at the end of a piece
    text = "Be brief.\n\n# Tools"
    wrong = _Splitter(light._pieces.splitter.added, lines=_AFTER_NEWLINE)
    assert [t for piece in wrong.pieces(text) for t in backend.encode(piece, add_special_tokens=False).ids] != backend.encode(
        text, add_special_tokens=False).ids


def test_a_qwen2_style_pre_tokenizer_is_cut_after_newlines_and_a_metaspace_one_only_at_added_tokens(light):
    from tokenizers import Tokenizer

    pattern = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
    qwen = Tokenizer.from_str(light.backend_tokenizer.to_str())
    qwen.normalizer = normalizers.NFC()
    qwen.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    splitter = splitter_for(qwen)
    assert splitter is not None and splitter.lines is _AFTER_NEWLINE
    for text in _corpus():
        pieces = [qwen.encode(piece, add_special_tokens=False).ids for piece in splitter.pieces(text) if piece]
        assert [token for ids in pieces for token in ids] == qwen.encode(text, add_special_tokens=False).ids, text

    metaspace = Tokenizer.from_str(light.backend_tokenizer.to_str())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    assert splitter_for(metaspace) is None  # "first" prepends to the first piece only: no cut is exact


def test_the_chat_templates_piece_cache_gives_the_ids_of_a_whole_encode(smol_tokenizer):
    """ChatTemplate.encode (every prompt and delta of the engine) caches pieces the same way."""
    from gym_bridge.core.template.chat_template import ChatTemplate

    template = ChatTemplate(smol_tokenizer)
    assert template.codec.pieces is not None and template.codec.pieces.splitter is not None
    long_text = "\n".join(_corpus()[:3]) * 3  # over the batch-call threshold
    for text in [*_corpus(), long_text]:
        expected = smol_tokenizer.encode(text, add_special_tokens=False)
        assert template.encode(text) == expected, text[:200]
        assert template.encode(text) == expected, text[:200]  # again, from the cache


def test_one_load_tokenizer_for_the_whole_package(light):
    """Issue 29: a tokenizer folder is loaded one way. `load_tokenizer` is defined once (policies/tokenizer.py) and
    the old import path (`gym_bridge.policies.remote`) no longer gives it (issue 37: imports point at the home)."""
    from gym_bridge.policies import remote, tokenizer

    defined = [path.relative_to(ROOT).as_posix() for path in (ROOT / "gym_bridge").rglob("*.py")
               if "def load_tokenizer(" in path.read_text(encoding="utf-8")]
    assert defined == ["gym_bridge/policies/tokenizer.py"]
    assert not hasattr(remote, "load_tokenizer") and not hasattr(remote, "LoadedTokenizer")
    loaded = tokenizer.load_tokenizer(str(embedded_model_path()))
    assert loaded.light and isinstance(loaded.tokenizer, LightTokenizer)
    assert loaded.eos_token_ids == light.eos_token_ids and loaded.tokenizer.encode("Seattle") == light.encode("Seattle")
