"""Token ids back to text, for showing what the model was shown and what it wrote.

Records name their model (`response.model`) but not a tokenizer folder, so the tokenizer is
the one passed (`--tokenizer PATH`), else the model's own folder when the name is one, else the
embedded SmolLM2 tokenizer for records of the embedded model. With none of these, ids are shown
as ids: decoding with a guessed tokenizer would print confident nonsense.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EMBEDDED_NAME = "SmolLM2-135M-Instruct"


@dataclass
class Decoder:
    """Decodes ids with `tokenizer` (anything with `decode(ids)`); without one, writes the ids."""

    tokenizer: Any | None
    source: str = ""
    """Where the tokenizer came from (shown to the reader)."""
    _pieces: dict[int, str] = field(default_factory=dict)

    @property
    def can_decode(self) -> bool:
        return self.tokenizer is not None

    def text(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens included; `[ids: 1 2 3]` when there is no tokenizer."""
        if self.tokenizer is None:
            return "[ids: " + " ".join(str(token) for token in ids) + "]"
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def piece(self, token: int) -> str:
        """One token's own text (cached); its id in brackets without a tokenizer."""
        if token not in self._pieces:
            self._pieces[token] = f"[{token}]" if self.tokenizer is None else self.text([token])
        return self._pieces[token]


def decoder_for(records: Sequence[Mapping[str, Any]], *, tokenizer: str | None = None) -> Decoder:
    """The decoder for these records (see the module docstring). Raises TokenizerLoadError for a
    `tokenizer` folder that cannot be loaded; an unidentifiable model gives an id-only decoder."""
    from gym_bridge.policies.tokenizer import load_light_tokenizer

    if tokenizer is not None:
        return Decoder(load_light_tokenizer(tokenizer), source=tokenizer)
    models = {str((record.get("response") or {}).get("model") or "") for record in records}
    for model in models:
        if model and (Path(model) / "tokenizer.json").is_file():
            return Decoder(load_light_tokenizer(model), source=model)
    if models and all(model.startswith(EMBEDDED_NAME) for model in models):
        try:
            from gym_bridge.policies.embedded import embedded_model_path

            return Decoder(load_light_tokenizer(embedded_model_path()), source=f"{EMBEDDED_NAME} (embedded)")
        except Exception:  # the embedded model cannot be built here: show ids
            pass
    return Decoder(None, source="none (pass --tokenizer PATH to decode token ids)")
