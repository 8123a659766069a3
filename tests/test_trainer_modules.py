"""`gym_bridge.trl`, `gym_bridge.verl` and `gym_bridge.nemo_rl` are real modules: every spelling the docs use
imports, and importing one loads no trainer until a name is used (issue 19, item 19)."""

import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from tests.test_imports_lint import _module_name as module_name
from tests.test_imports_lint import bindings

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAVY = ["torch", "transformers", "trl", "verl", "vllm", "ray", "nemo_rl", "datasets"]
ADAPTERS = {"trl": "gym_bridge.trl._rollout", "verl": "gym_bridge.verl._agent_loop", "nemo_rl": "gym_bridge.nemo_rl._environment"}
"""Where each package's `__all__` comes from (its private module)."""
SPELLING = re.compile(r"gym_bridge\.(trl|verl|nemo_rl)\.([A-Za-z_]\w*)|from gym_bridge\.(trl|verl|nemo_rl) import ([\w, ]+)")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()


def _documented() -> set[tuple[str, str]]:
    """(module, name) for every `gym_bridge.X.name` and `from gym_bridge.X import a, b` in the docs, recipes and configs."""
    files = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("recipes/**/*.py"), *ROOT.glob("recipes/**/*.sh"),
             *ROOT.glob("recipes/**/*.yaml"), *ROOT.glob("gym_bridge/**/*.yaml")]
    found = set()
    for path in files:
        for match in SPELLING.finditer(path.read_text(encoding="utf-8")):
            if match.group(1):
                found.add((match.group(1), match.group(2)))
            else:
                found.update((match.group(3), name.strip()) for name in match.group(4).split(",") if name.strip())
    return found


def test_import_statements_work_and_stay_light():
    code = (
        "import sys\n"
        "import gym_bridge.trl, gym_bridge.verl, gym_bridge.nemo_rl\n"
        "from gym_bridge import trl, verl, nemo_rl\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert _run(code) == ""


def test_from_trl_import_rollout_is_the_adapters_and_loads_no_trl_or_torch():
    code = (
        "import sys\n"
        "from gym_bridge.trl import rollout, make_rollout, load_dataset, env_reward\n"
        "import gym_bridge.trl._rollout as adapter, gym_bridge.trl._rewards as rewards\n"
        "assert rollout is adapter.rollout and make_rollout is adapter.make_rollout and env_reward is rewards.env_reward\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert _run(code) == ""


def test_package_attribute_is_the_module():
    import gym_bridge
    import gym_bridge.trl

    assert gym_bridge.trl is sys.modules["gym_bridge.trl"]
    assert gym_bridge.trl.rollout is importlib.import_module("gym_bridge.trl._rollout").rollout


@pytest.mark.parametrize("module", ["trl", "verl", "nemo_rl"])
def test_every_public_name_resolves(module):
    if module == "verl":
        pytest.importorskip("verl")
    public = importlib.import_module(f"gym_bridge.{module}")
    adapter = importlib.import_module(ADAPTERS[module])
    assert set(adapter.__all__) <= set(public.__all__)  # a name added to the adapter is added here too
    folder = ROOT / "gym_bridge" / module
    homes = {name: path for path in [*folder.glob("_*.py"), *folder.glob("_*/[!_]*.py")] for name in bindings(module_name(path))[0]}
    for name in public.__all__:  # each is the object its home module defines (issue 37: no re-export in between)
        assert getattr(public, name) is getattr(importlib.import_module(module_name(homes[name])), name), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        public.nope  # noqa: B018


def test_the_async_recipes_parts_resolve_from_the_package_and_stay_light():
    code = (
        "import sys\n"
        "import gym_bridge.trl as trl\n"
        "from gym_bridge.trl._async.weights import FileWeightReceiver, FileWeightTransfer\n"
        "from gym_bridge.trl._async.seams import async_seams\n"
        "from gym_bridge.trl._async.cpu import cpu_async_grpo_trainer\n"
        "assert trl.FileWeightReceiver is FileWeightReceiver and trl.FileWeightTransfer is FileWeightTransfer\n"
        "assert trl.async_seams is async_seams and trl.cpu_async_grpo_trainer is cpu_async_grpo_trainer\n"
        "assert {'FileWeightReceiver', 'async_seams'} <= set(dir(trl)) and 'FileWeightReceiver' not in trl.__all__\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    assert _run(code) == ""


def test_every_documented_spelling_imports():
    documented = _documented()
    assert ("trl", "rollout") in documented and ("verl", "GymBridgeAgentLoop") in documented  # the scan finds them
    if importlib.util.find_spec("verl") is None:
        documented = {(module, name) for module, name in documented if module != "verl"}
    missing = []
    for module, name in sorted(documented):
        try:
            getattr(importlib.import_module(f"gym_bridge.{module}"), name)
        except AttributeError:
            missing.append(f"gym_bridge.{module}.{name}")
    assert missing == []


def test_verl_from_import_in_a_fresh_process():
    pytest.importorskip("verl")
    code = "from gym_bridge.verl import GymBridgeAgentLoop\nprint(GymBridgeAgentLoop.__module__)"
    assert _run(code) == "gym_bridge.verl._agent_loop"
