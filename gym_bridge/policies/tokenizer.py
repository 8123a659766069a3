"""A Hugging Face tokenizer folder loaded without transformers: `tokenizers` for the ids, jinja2 for the chat template.

`gym-bridge eval --base-url` needs a tokenizer only to render prompts; transformers would import
torch for that, seconds before the first rollout. `LightTokenizer` reads the same files
(`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, `additional_chat_templates/`,
`generation_config.json`) and renders chat templates as transformers' `apply_chat_template` does:
the same sandboxed jinja2 environment, filters and globals, special tokens as template variables,
None-valued message keys dropped, reasoning fields aliased (tests/policies/test_tokenizer.py pins
the equality on every template in ../shared/templates). `load_tokenizer` is the one way gym_bridge
loads a tokenizer folder: this light tokenizer where the folder allows it, else transformers'.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from gym_bridge.core.template.render import render_chat
from gym_bridge.core.errors import UserError
from gym_bridge.core.template.piece_encoder import PieceEncoder

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
GENERIC_TOKENIZER_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
"""Classes for which transformers itself uses `tokenizer.json` as it is; model-specific classes
(`Qwen2Tokenizer`, `LlamaTokenizerFast`, ...) may rebuild parts of the pipeline in code."""
class TokenizerLoadError(UserError):
    """A tokenizer folder cannot be used without transformers (no `tokenizer.json`, unreadable files)."""


class LightTokenizer:
    """What gym_bridge needs of a tokenizer (`gym_bridge.core.template.codec.Tokenizer`) and a little more."""

    def __init__(self, backend: Tokenizer, *, config: dict[str, Any], chat_template: str | dict[str, str] | None,
                 generation_eos_ids: Sequence[int] = (), name_or_path: str = "") -> None:
        self.backend_tokenizer = backend
        """The `tokenizers.Tokenizer`."""
        self._pieces = PieceEncoder(backend)
        self.name_or_path = name_or_path
        self.tokenizer_class = str(config.get("tokenizer_class") or "")
        self.chat_template = chat_template
        self.special_tokens_map: dict[str, str] = {}
        for name in SPECIAL_TOKEN_NAMES:
            value = config.get(name)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                self.special_tokens_map[name] = value
        for name, value in self.special_tokens_map.items():
            setattr(self, name, value)
            setattr(self, f"{name}_id", backend.token_to_id(value))
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self._cleanup = self.clean_up_tokenization_spaces and type(backend.model).__name__ != "BPE"
        eos = {self.eos_token_id} if isinstance(getattr(self, "eos_token_id", None), int) else set()
        self.eos_token_ids = sorted(eos | set(generation_eos_ids))
        """The tokenizer's EOS id plus those of `generation_config.json`."""

    def __getattr__(self, name: str) -> Any:
        if name in {f"{token}{suffix}" for token in SPECIAL_TOKEN_NAMES for suffix in ("", "_id")}:
            return None  # a special token the folder does not define, as in transformers
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    # -- ids -------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`. Without special tokens added, the text is cut where `tokenizers` itself would
        cut it (at added tokens, and at line starts for the common byte-level patterns; see `gym_bridge.core.template.piece_encoder`)
        and the ids of each piece are kept for reuse: the lines of a chat prompt's system and tool
        block, the same in every rollout, are tokenized once."""
        if add_special_tokens:
            return self.backend_tokenizer.encode(text, add_special_tokens=True).ids
        return self._pieces.encode(text)

    def decode(self, token_ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        text = self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._cleanup else text

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> Any:
        if isinstance(tokens, str):
            return self.backend_tokenizer.token_to_id(tokens)
        return [self.backend_tokenizer.token_to_id(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> Any:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(token) for token in ids]

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    @property
    def all_special_ids(self) -> list[int]:
        return sorted({getattr(self, f"{name}_id") for name in self.special_tokens_map} - {None})

    # -- chat template ---------------------------------------------------------------------

    def get_chat_template(self, chat_template: str | None = None, tools: Any = None) -> str:
        """The template text to render, chosen as transformers chooses it (named templates included)."""
        if isinstance(self.chat_template, dict):
            templates = self.chat_template
            if chat_template is not None and chat_template in templates:
                return templates[chat_template]
            if chat_template is None:
                if tools is not None and "tool_use" in templates:
                    return templates["tool_use"]
                if "default" in templates:
                    return templates["default"]
                raise ValueError(f"this tokenizer has several chat templates and no default; name one of {sorted(templates)}")
        if chat_template is not None:
            return chat_template
        if not isinstance(self.chat_template, str):  # None: a dict of templates was handled above
            raise ValueError("the tokenizer has no chat template")
        return self.chat_template

    def apply_chat_template(
        self,
        conversation: Sequence[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Render `conversation` (one conversation) as transformers would; `tokenize=True` gives
        `{"input_ids": [...]}` (or the list, with `return_dict=False`)."""
        if continue_final_message:
            raise NotImplementedError("continue_final_message is not supported by LightTokenizer; use transformers")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        template = self.get_chat_template(chat_template, tools)
        if tools is not None:
            for tool in tools:
                if not isinstance(tool, dict):
                    raise ValueError("LightTokenizer takes tools as JSON schemas (dicts), not as functions")
        if documents is not None:
            for document in documents:
                if not isinstance(document, dict):
                    raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
        text = render_chat(template, conversation, tools=tools, documents=documents, add_generation_prompt=add_generation_prompt,
                           variables={**self.special_tokens_map, **kwargs})
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids} if return_dict else ids


def _clean_up_tokenization(text: str) -> str:
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TokenizerLoadError(f"cannot read {path}: {error}") from None
    return data if isinstance(data, dict) else {}


def load_light_tokenizer(path: str | Path) -> LightTokenizer:
    """The tokenizer in a local folder (`tokenizer.json` required), with its chat templates and EOS ids.

    Raises `TokenizerLoadError` when the folder has no `tokenizer.json` or a file cannot be read.
    """
    from tokenizers import Tokenizer

    folder = Path(path)
    tokenizer_file = folder / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise TokenizerLoadError(f"{folder} has no tokenizer.json")
    config = _read_json(folder / "tokenizer_config.json")
    try:
        backend = Tokenizer.from_file(str(tokenizer_file))
    except Exception as error:  # the Rust side raises its own exception type
        raise TokenizerLoadError(f"cannot load {tokenizer_file}: {error}") from None
    backend.encode_special_tokens = bool(config.get("split_special_tokens", False))
    templates: dict[str, str] = {}
    if (folder / "chat_template.jinja").is_file():
        templates["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for file in sorted(extra.glob("*.jinja")):
            templates[file.name.removesuffix(".jinja")] = file.read_text(encoding="utf-8")
    chat_template: str | dict[str, str] | None
    if templates:
        chat_template = templates["default"] if list(templates) == ["default"] else templates
    else:
        configured = config.get("chat_template")
        if isinstance(configured, list):
            configured = {entry["name"]: entry["template"] for entry in configured}
        chat_template = configured
    generation = _read_json(folder / "generation_config.json").get("eos_token_id")
    generation_eos = [generation] if isinstance(generation, int) else [token for token in generation or [] if isinstance(token, int)]
    return LightTokenizer(backend, config=config, chat_template=chat_template, generation_eos_ids=generation_eos, name_or_path=str(folder))


@dataclass(frozen=True)
class LoadedTokenizer:
    """A tokenizer to render prompts with, and the EOS ids (the tokenizer's plus `generation_config.json`'s)."""

    tokenizer: Any
    eos_token_ids: list[int]
    light: bool
    """Loaded without transformers (`LightTokenizer`)."""


def load_tokenizer(path: str, *, light: bool = True) -> LoadedTokenizer:
    """A local tokenizer folder's tokenizer: the one way gym_bridge loads one.

    `light`: without transformers, which would import torch only to render prompts (seconds of
    start-up), when the folder has a `tokenizer.json` (`load_light_tokenizer`); else with
    transformers' `AutoTokenizer`.
    """
    if light and (Path(path) / "tokenizer.json").is_file():
        tokenizer = load_light_tokenizer(path)
        return LoadedTokenizer(tokenizer=tokenizer, eos_token_ids=tokenizer.eos_token_ids, light=True)
    from transformers import AutoTokenizer, GenerationConfig

    auto = AutoTokenizer.from_pretrained(path)
    eos = {auto.eos_token_id} if isinstance(auto.eos_token_id, int) else set()
    try:
        configured = GenerationConfig.from_pretrained(path).eos_token_id
    except (OSError, ValueError):
        configured = None
    eos.update([configured] if isinstance(configured, int) else (configured or []))
    return LoadedTokenizer(tokenizer=auto, eos_token_ids=sorted(eos), light=False)
