"""What `gym-bridge eval --base-url` does before its first rollout: it imports neither torch nor
transformers (the tokenizer is loaded without them), and the tokenizer it renders with is checked
against the server's `/tokenize`, falling back to transformers where the light one cannot be trusted."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from gym_bridge.cli.eval_engine import _matching_tokenizer
from gym_bridge.core.errors import GymBridgeError
from gym_bridge.policies.embedded import embedded_model_path
from gym_bridge.policies.tokenizer import load_light_tokenizer
from tests.support.http_server import app_in_thread

ROOT = Path(__file__).resolve().parents[2]


def vllm_like_app(*, root: str, tokenize_offset: int = 0, has_tokenize: bool = True) -> FastAPI:
    """`/v1/models`, `/tokenize` (ids shifted by `tokenize_offset`: a server with another tokenizer) and a
    `/v1/completions` that always answers "It is cold." and EOS."""
    tokenizer = load_light_tokenizer(root)
    answer = tokenizer.encode("It is cold.", add_special_tokens=False) + [tokenizer.eos_token_id]
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "served", "root": root, "max_model_len": 8192}]}

    if has_tokenize:
        @app.post("/tokenize")
        async def tokenize(request: Request) -> dict:
            body = await request.json()
            return {"tokens": [token + tokenize_offset for token in tokenizer.encode(body["prompt"], add_special_tokens=False)]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        body = await request.json()
        choice = {"index": 0, "text": "It is cold.", "finish_reason": "stop",
                  "logprobs": {"token_logprobs": [-0.5] * len(answer), "tokens": [f"token_id:{t}" for t in answer]}}
        if body.get("return_token_ids"):
            choice.update(prompt_token_ids=body["prompt"], token_ids=answer)
        return {"choices": [choice], "usage": {"prompt_tokens": len(body["prompt"])}}

    return app


def test_eval_against_a_server_imports_neither_torch_nor_transformers(tmp_path):
    output = tmp_path / "out.jsonl"
    script = (
        "import sys\nfrom gym_bridge.cli import main\n"
        f"code = main({['eval', '--env', 'weather', '--limit', '2', '--no-progress', '--output', str(output), '--base-url', '{url}']!r})\n"
        "heavy = sorted(name for name in ('torch', 'transformers') if name in sys.modules)\n"
        "print('heavy modules:', heavy)\nsys.exit(code or (3 if heavy else 0))\n"
    )
    with app_in_thread(vllm_like_app(root=str(embedded_model_path()))) as url:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run([sys.executable, "-c", script.replace("{url}", url)], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "heavy modules: []" in done.stdout
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(records) == 2 and all(record["failure_kind"] is None for record in records)


def _matching(url: str, path: str):
    return asyncio.run(_matching_tokenizer(url, path, model="served", api_key=None, source=f"the tokenizer in {path}", server_up=True))


def test_the_light_tokenizer_is_used_when_the_server_agrees_and_refused_when_it_does_not():
    root = str(embedded_model_path())
    with app_in_thread(vllm_like_app(root=root)) as url:
        assert _matching(url + "/v1", root).light
    with app_in_thread(vllm_like_app(root=root, tokenize_offset=1)) as url:
        with pytest.raises(GymBridgeError, match="does not tokenize like the server's model 'served'"):
            _matching(url + "/v1", root)  # neither the light nor the transformers tokenizer agrees


def test_a_model_specific_tokenizer_class_that_cannot_be_checked_is_loaded_with_transformers(tmp_path):
    folder = tmp_path / "tok"
    shutil.copytree(embedded_model_path(), folder, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "GPT2Tokenizer"}))
    with app_in_thread(vllm_like_app(root=str(folder), has_tokenize=False)) as url:
        loaded = _matching(url + "/v1", str(folder))  # transformers may rebuild GPT2Tokenizer's pipeline in code
    assert not loaded.light and loaded.eos_token_ids == [config_eos(folder)]
    with app_in_thread(vllm_like_app(root=str(folder))) as url:
        assert _matching(url + "/v1", str(folder)).light  # checked against the server: the light one will do


def config_eos(folder: Path) -> int:
    return load_light_tokenizer(folder).eos_token_id
