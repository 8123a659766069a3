"""Text to token ids and back for one tokenizer: the `Tokenizer` protocol and `TokenCodec`.

Every prompt and delta a rollout appends is encoded here without special tokens added. With a
`tokenizers` backend (a fast tokenizer), the pieces every prompt shares are tokenized once
(`PieceEncoder`) and decoding skips the Python wrapper's per-id checks; any other tokenizer is
called as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from gym_bridge.core.template.piece_encoder import PieceEncoder


class Tokenizer(Protocol):
    """What gym_bridge needs of a (Hugging Face) tokenizer."""

    chat_template: Any
    eos_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def special_tokens(tokenizer: Any) -> Mapping[str, Any]:
    """The tokenizer's special tokens as template variables (`bos_token`, ...); empty when it has none."""
    tokens = getattr(tokenizer, "special_tokens_map", None)
    return tokens if isinstance(tokens, Mapping) else {}


class TokenCodec:
    """Encodes and decodes for one tokenizer, through its fast backend where that gives the same ids and text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's `tokenizers.Tokenizer`
        fast = backend is not None and hasattr(backend, "encode_batch")
        self.pieces = PieceEncoder(backend) if fast else None
        """The piece cache of a fast tokenizer (None: the tokenizer encodes every text)."""
        plain = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._decode_backend: Callable[..., str] | None = getattr(backend, "decode", None) if fast and plain else None
        """A fast tokenizer's own decode, which gives `tokenizer.decode`'s text when it cleans up no spaces (its
        Python wrapper checks every id's type first, on every model turn)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without special tokens added. With a `tokenizers` backend, the pieces
        every prompt shares (system message, tool list, markup) are tokenized once (exact: see
        `gym_bridge.core.template.piece_encoder`); long new texts go in a call that releases the GIL."""
        if self.pieces is not None:
            return self.pieces.encode(text)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, special tokens kept (as `tokenizer.decode(..., skip_special_tokens=False)`)."""
        if self._decode_backend is not None:
            return self._decode_backend(list(token_ids), skip_special_tokens=False)
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)
