"""FileWeightTransfer -> `/collective_rpc` -> FileWeightReceiver over real HTTP on loopback: the receiver answers what
the served model loaded, so a file that misses or misnames a parameter fails the sync (issue 36: it answered the file's
tensor count, which the transfer then compared with itself). vLLM's model runner cannot be built without an engine
here, so a runner with its interface (`get_model`, `reload_weights(weights_iterator=, is_checkpoint_format=)`, a model
whose `load_weights` answers the parameter names it loaded and skips names it does not know) stands in."""

from __future__ import annotations

import pytest
import torch
from fastapi import FastAPI, Request

from gym_bridge.core.errors import WeightSyncError
from gym_bridge.trl._async.weights import FileWeightReceiver, FileWeightTransfer
from tests.support.http_server import app_in_thread


class TinyModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(2, 2)

    def load_weights(self, weights):  # vLLM's contract: the names of the parameters loaded
        params, loaded = dict(self.named_parameters()), set()
        for name, tensor in weights:
            if name in params:  # vLLM's loaders skip names they do not map (e.g. rotary buffers)
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded


class Runner:
    def __init__(self) -> None:
        self.model = TinyModel()

    def get_model(self):
        return self.model

    def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
        self.model.load_weights(weights_iterator)  # vLLM's in-place reload drops load_weights' answer


class Worker(FileWeightReceiver):
    def __init__(self) -> None:
        self.model_runner = Runner()


def server(worker: Worker) -> FastAPI:
    app = FastAPI()

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request):
        body = await request.json()
        return {"results": [getattr(worker, body["method"])(*body["args"])]}

    for path in ("/pause", "/resume", "/reset_prefix_cache"):
        app.post(path)(lambda: {})
    return app


def test_the_receiver_answers_the_parameters_the_model_loaded(tmp_path):
    worker = Worker()
    with app_in_thread(server(worker)) as url:
        transfer = FileWeightTransfer(url, directory=tmp_path)
        transfer.init_weight_transfer()
        weights = {"proj.weight": torch.full((2, 2), 3.0), "proj.bias": torch.ones(2)}
        transfer.send_weights(iter(weights.items()))
        assert torch.equal(worker.model_runner.model.proj.weight, weights["proj.weight"])
        # a misnamed tensor: two tensors in the file, one parameter loaded; the sync fails naming the counts
        with pytest.raises(WeightSyncError, match="loaded 1 of its 2 parameters from the 2 tensors"):
            transfer.send_weights(iter({"proj.weight": torch.zeros(2, 2), "module.proj.bias": torch.zeros(2)}.items()))
        # a file missing a parameter fails too
        with pytest.raises(WeightSyncError, match="loaded 1 of its 2 parameters from the 1 tensors"):
            transfer.send_weights(iter({"proj.weight": torch.zeros(2, 2)}.items()))
    assert worker.gym_bridge_load_weights("") == {"tensors": 0, "loaded": 0, "parameters": 0}
    assert "load_weights" not in vars(worker.model_runner.model)  # the recording wrapper is gone again
