"""The Slurm scripts start servers the way the trainers they feed expect (read, not run: no cluster here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def test_trl_sbatch_serves_with_vllm_serve_and_the_flags_trl_needs():
    """TRL 1.16 deprecates `trl vllm-serve`, which now only execs `vllm serve` with TRL's settings
    (`trl/scripts/vllm_serve.py::build_command`, dev mode from `main`); the script runs that directly."""
    vllm_serve = pytest.importorskip("trl.scripts.vllm_serve")
    text = (ROOT / "slurm" / "trl_grpo.sbatch").read_text()
    assert "trl vllm-serve" not in re.sub(r"#.*", "", text)
    command = re.search(r"\benv (VLLM_SERVER_DEV_MODE=.*?)&$", re.sub(r"\\\n\s*", " ", text), re.MULTILINE)
    assert command, "no `env ... vllm serve ... &` line"
    words = shlex.split(command.group(1))
    assert words[0] == "VLLM_SERVER_DEV_MODE=1" and words[1:3] == ["vllm", "serve"]
    flags = words[4:]
    expected = vllm_serve.build_command(vllm_serve.ScriptArguments(model="m"))
    imposed = expected[expected.index("--weight-transfer-config"):]  # what TRL adds beyond translating its own arguments
    for flag, value in zip(imposed[::2], imposed[1::2]):
        assert flag in flags and flags[flags.index(flag) + 1] == value, flag
