"""Weights from an async trainer to a vLLM server without NCCL: a file and one RPC (CPU servers, any server).

vLLM 0.32's weight-transfer backends (nccl, ipc) need CUDA, so a CPU server cannot take TRL's default
`WeightTransferClient`. `FileWeightTransfer` implements TRL's `WeightTransferProtocol` instead: pause the
server (`/pause?mode=keep`: running requests freeze where they are), write the trainer's tensors to one
safetensors file (written to a temporary name, then renamed), ask every vLLM worker to load it through
the dev-mode `/collective_rpc` endpoint (an in-place reload, as vLLM's own `reload_weights`), reset the
prefix cache, resume. `FileWeightReceiver` is the vLLM worker extension that loads it (`--worker-extension-cls
gym_bridge.trl.FileWeightReceiver`, with `VLLM_SERVER_DEV_MODE=1`) and answers what the served model took: the
parameters its `load_weights` reported loaded out of all it has, so a file that misses or misnames a tensor fails
the sync instead of leaving old weights in place. The file must be on a filesystem the server sees.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from gym_bridge.core.errors import WeightSyncError

LOAD_METHOD = "gym_bridge_load_weights"
"""The worker-extension method `/collective_rpc` calls."""


class FileWeightTransfer:
    """TRL's `WeightTransferProtocol` through a safetensors file and `/collective_rpc` (see the module docstring)."""

    def __init__(self, server_url: str, *, directory: str | Path | None = None, timeout_s: float = 600.0) -> None:
        self.server_url = server_url.rstrip("/")
        self.timeout_s = timeout_s
        self._own_directory = directory is None
        self.directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="gym_bridge_weights_"))
        self.syncs = 0
        self.last_sync_s = 0.0

    def _post(self, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = httpx.post(self.server_url + path, timeout=self.timeout_s, **kwargs)
        except httpx.HTTPError as error:
            raise WeightSyncError(f"POST {self.server_url}{path} failed: {error}") from error
        if response.status_code != 200:
            hint = (" (start the server with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
                    "gym_bridge.trl.FileWeightReceiver)") if response.status_code in (404, 500) else ""
            raise WeightSyncError(f"POST {self.server_url}{path} answered {response.status_code}: {response.text[:300]}{hint}")
        return response

    def init_weight_transfer(self) -> None:
        """Check that the server's workers have the receiver (an RPC that loads nothing)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self._post("/collective_rpc", json={"method": LOAD_METHOD, "args": [""]})

    def pause(self) -> None:
        self._post("/pause", params={"mode": "keep"})

    def send_weights(self, iterator: Iterator[tuple[str, Any]]) -> None:
        """Write every `(name, tensor)` to one file and have each worker load it; raises BackendError on failure."""
        from safetensors.torch import save_file

        started = time.perf_counter()
        tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in iterator}
        path = self.directory / f"weights-{self.syncs + 1}.safetensors"
        temp = path.with_name(path.name + ".tmp")
        save_file(tensors, str(temp))
        os.replace(temp, path)
        answer = self._post("/collective_rpc", json={"method": LOAD_METHOD, "args": [str(path)]}).json()
        check_loaded(answer.get("results", []), path=path, tensors=len(tensors))
        self._post("/reset_prefix_cache")
        path.unlink()
        self.syncs += 1
        self.last_sync_s = time.perf_counter() - started

    def resume(self) -> None:
        self._post("/resume")

    def destroy(self) -> None:
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def check_loaded(results: list[Any], *, path: Path, tensors: int) -> None:
    """Raise WeightSyncError unless every worker's answer says its model loaded all of its parameters."""
    if not results:
        raise WeightSyncError(f"no vLLM worker answered the load of {path}")
    for worker, result in enumerate(results):
        loaded, parameters = (int(result.get("loaded", -1)), int(result.get("parameters", -1))) if isinstance(result, dict) else (-1, -1)
        if parameters <= 0 or loaded != parameters:
            raise WeightSyncError(f"vLLM worker {worker} loaded {loaded} of its {parameters} parameters from the {tensors} tensors "
                                  f"in {path} (answer {result!r}): the trainer's tensor names do not cover the served model")


class FileWeightReceiver:
    """The vLLM worker extension: `gym_bridge_load_weights(path)` loads a safetensors file into the served model and
    answers `{"tensors": in the file, "loaded": parameters the model reported loaded, "parameters": the model's}`
    (an empty path loads nothing: the transfer's start-up check)."""

    def gym_bridge_load_weights(self, path: str) -> dict[str, int]:
        if not path:
            return {"tensors": 0, "loaded": 0, "parameters": 0}
        from safetensors.torch import load_file

        tensors = load_file(path, device="cpu")
        runner: Any = getattr(self, "model_runner")
        model = runner.get_model()
        parameters = {name for name, _ in model.named_parameters()}
        loaded = _LoadedNames(model)
        with loaded:
            # in-place reload in checkpoint format: vLLM undoes and redoes its post-load processing (the CPU build
            # repacks linear weights, so loading straight into the live parameters fails)
            runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        return {"tensors": len(tensors), "loaded": len(loaded.names & parameters), "parameters": len(parameters)}


class _LoadedNames:
    """While open, records the parameter names `model.load_weights` reports loaded (vLLM models return them; its
    in-place reload calls it and drops the answer)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.names: set[str] = set()

    def __enter__(self) -> None:
        load = self.model.load_weights

        def recording(weights: Iterable[tuple[str, Any]]) -> Any:
            names = load(weights)
            self.names.update(names or ())
            return names

        self.model.load_weights = recording

    def __exit__(self, *exc: object) -> None:
        del self.model.load_weights
