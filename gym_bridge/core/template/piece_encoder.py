"""Exact, cached tokenization of chat prompts: a text is cut where `tokenizers` itself cuts it and
the ids of each piece are kept, so the lines every prompt of a dataset shares (the system message,
the tool list, the template's markup) are tokenized once, while the ids equal those of encoding the
whole text (checked on probe texts when the encoder is built)."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any, cast

MAX_CACHED_PIECES = 16_384
MAX_CACHED_PIECE_CHARS = 4096
"""Longer pieces (a big tool output) are encoded but not kept."""
MAX_CACHED_PARTS = 256
MAX_CACHED_PART_CHARS = 65_536
"""Whole texts between added tokens (a system message with its tool list, often shared by every row
of a dataset) are kept too, up to this size, so they are looked up once instead of line by line."""
GIL_FREE_CHARS = 8192
"""New text of at least this many characters is encoded in a call that releases the GIL."""
_SPLIT_PROBES = (
    "<A>system\nBe brief.\n\n# Tools\n<tools>\n{\"a\": [1, 2]}\n</tools><Z>\n<A>user\nHi!\n  indented\n\tTab\r\nCRLF<Z>",
    " lead and trail \n.\nx\n\n\nY 12 3456.7\n\u00e9\u4f60\n\u0301mark<A><A> a  b\n\n c<Z>\n",
)


class PieceEncoder:
    """`encode(text)` with `add_special_tokens=False` through a `tokenizers.Tokenizer`, piece by piece
    where that is exact (see `splitter_for`), else in one call."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._lock = threading.Lock()
        self._vocab_size = -1
        self._refresh()

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (a Ray worker gets the template): everything but the lock, which is per process."""
        return {key: value for key, value in self.__dict__.items() if key != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        """Cut points and cache for the tokenizer's current added tokens (a token added later changes both)."""
        self._vocab_size = self.backend.get_vocab_size(with_added_tokens=True)
        self.splitter = splitter_for(self.backend)
        self._piece_ids: dict[str, list[int]] = {}
        self._part_ids: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """The ids of `text`; new pieces of `GIL_FREE_CHARS` or more in all are encoded in one batch
        call, which releases the GIL (other rollouts go on meanwhile)."""
        if self.backend.get_vocab_size(with_added_tokens=True) != self._vocab_size:
            self._refresh()
        if self.splitter is None:
            whole: list[int]  # the backend is untyped (tokenizers' Tokenizer)
            if len(text) >= GIL_FREE_CHARS:
                whole = self.backend.encode_batch([text], add_special_tokens=False)[0].ids
            else:
                whole = self.backend.encode(text, add_special_tokens=False).ids
            return whole
        parts = self.splitter.added.split(text)
        part_ids = self._part_ids
        if self.splitter.lines is None:
            joined: list[int] = self._encode_pieces([part for part in parts if part])
            return joined
        known_parts = [part_ids.get(part) for part in parts]
        if None not in known_parts:  # every part known (the common case: no list built to check it)
            return [token for ids in cast("list[list[int]]", known_parts) for token in ids]
        new_parts = {part: [piece for piece in self.splitter.pieces_of_part(part) if piece]
                     for part, ids in zip(parts, known_parts) if ids is None and part}
        encoded = iter(self._encode_pieces([piece for pieces in new_parts.values() for piece in pieces], per_piece=True))
        fresh = {part: [token for _ in pieces for token in next(encoded)] for part, pieces in new_parts.items()}
        self._keep(part_ids, MAX_CACHED_PARTS, MAX_CACHED_PART_CHARS, fresh, refill={})
        ids: list[int] = []
        for part, known in zip(parts, known_parts):
            if known is not None:
                ids += known
            elif part:
                ids += fresh[part]
        return ids

    def _encode_pieces(self, pieces: list[str], *, per_piece: bool = False) -> Any:
        """The ids of `pieces` joined (or, `per_piece`, a list of each piece's ids), new pieces encoded
        in one GIL-releasing batch call when they are long, and kept when short."""
        cache = self._piece_ids
        unique = dict.fromkeys(pieces)
        found = {piece: ids for piece in unique if (ids := cache.get(piece)) is not None}
        new = [piece for piece in unique if piece not in found]
        if new:
            if sum(map(len, new)) >= GIL_FREE_CHARS:
                encoded = [encoding.ids for encoding in self.backend.encode_batch(new, add_special_tokens=False)]
            else:
                encoded = [self.backend.encode(piece, add_special_tokens=False).ids for piece in new]
            fresh = dict(zip(new, encoded))
            self._keep(cache, MAX_CACHED_PIECES, MAX_CACHED_PIECE_CHARS, fresh, refill=found)
            found.update(fresh)
        each = [found[piece] for piece in pieces]
        if per_piece:
            return each
        return [token for ids in each for token in ids]

    def _keep(self, cache: dict[str, list[int]], max_entries: int, max_chars: int, fresh: dict[str, list[int]],
              refill: dict[str, list[int]]) -> None:
        """Add the `fresh` texts of one call to `cache`. A cache that would pass `max_entries` is emptied first
        and then holds this call's texts, `refill` (those it found in the cache: the markup every call shares)
        and `fresh`. The call has read every text it needs by then, so emptying never loses one; the lock keeps
        threads that share the encoder from emptying the cache in the middle of each other's update."""
        with self._lock:
            if len(cache) + len(fresh) > max_entries:
                cache.clear()
                cache.update(refill)
            room = max_entries - len(cache)  # never past the cap, however many a call brings
            for text, ids in fresh.items():
                if room <= 0:
                    break
                if len(text) <= max_chars:
                    cache[text] = ids
                    room -= 1


@dataclass(frozen=True)
class _Splitter:
    """Where a text may be cut so that encoding the pieces one by one gives the ids of the whole."""

    added: re.Pattern[str]
    """Matches the added tokens (kept as pieces by `pieces`)."""
    lines: re.Pattern[str] | None = None
    """Where to cut within a piece as well: around a newline that a non-whitespace character follows."""

    def pieces(self, text: str) -> list[str]:
        parts = self.added.split(text)
        if self.lines is None:
            return parts
        return [line for part in parts for line in self.pieces_of_part(part)]

    def pieces_of_part(self, part: str) -> list[str]:
        """The pieces of a text that holds no added token."""
        return self.lines.split(part) if self.lines is not None and "\n" in part else [part]


_BEFORE_LAST_NEWLINE = re.compile(r"(?=\n\S)")
r"""GPT-2's pattern splits a whitespace run before a word as `\s+(?!\S)` then the last character, so a
piece may end just before that newline (at the end of a text, the same run is matched whole)."""
_AFTER_NEWLINE = re.compile(r"(?<=\n)(?=\S)")
r"""The Llama 3 / Qwen2 patterns end a pre-token at a newline (`\s*[\r\n]+`, punctuation then newlines)."""
_LINE_SAFE_SPLITS = (
    # Qwen2 / Qwen3 and Llama 3: no pre-token holds a newline followed by a non-whitespace character
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)


def splitter_for(backend: Any) -> _Splitter | None:
    """How to cut texts for `PieceEncoder`, or None when no cut is known to be exact.

    `tokenizers` cuts a text at added tokens first (leftmost-longest) and normalizes and pre-tokenizes
    every other piece on its own, so cutting there is exact unless an added token strips its
    neighbours' spaces or matches normalized text, or a step depends on a piece's place in the text
    (Metaspace, a Prepend normalizer), or truncation or padding is on. Within a piece, the GPT-2
    byte-level pattern and the Llama 3 / Qwen2 split patterns never join a newline to the
    non-whitespace character after it, so with one of them (and no prefix space, no normalizer but
    NFC) a piece is also cut at line starts. Both claims are checked on probe texts at load.
    """
    added = [token for token in backend.get_added_tokens_decoder().values() if token.content]
    if not added or backend.truncation is not None or backend.padding is not None:
        return None
    if any(token.lstrip or token.rstrip or token.single_word or (token.normalized and backend.normalizer is not None) for token in added):
        return None
    pre, normalizer = repr(backend.pre_tokenizer), repr(backend.normalizer)
    if "Metaspace" in pre or "Prepend" in normalizer:
        return None
    contents = sorted({token.content for token in added}, key=len, reverse=True)
    added_pattern = re.compile("(" + "|".join(map(re.escape, contents)) + ")")
    byte_level_gpt2 = pre == "ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)"
    known_split = pre.startswith("Sequence(") and "use_regex=False" in pre and "add_prefix_space=True" not in pre and any(
        f'Split(pattern=Regex("{pattern}"), behavior=Isolated, invert=False)' in pre for pattern in _LINE_SAFE_SPLITS)
    candidates = [_Splitter(added_pattern)]
    if normalizer in ("None", "NFC()") and (byte_level_gpt2 or known_split):
        candidates.insert(0, _Splitter(added_pattern, lines=_BEFORE_LAST_NEWLINE if byte_level_gpt2 else _AFTER_NEWLINE))
    for splitter in candidates:
        if all(_splits_exactly(backend, splitter, probe.replace("<A>", contents[0]).replace("<Z>", contents[-1])) for probe in _SPLIT_PROBES):
            return splitter
    return None


def _splits_exactly(backend: Any, splitter: _Splitter, text: str) -> bool:
    pieces = [backend.encode(piece, add_special_tokens=False).ids for piece in splitter.pieces(text) if piece]
    whole: list[int] = backend.encode(text, add_special_tokens=False).ids
    return [token for ids in pieces for token in ids] == whole
