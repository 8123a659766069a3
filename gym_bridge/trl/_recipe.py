"""What the TRL recipes (`recipes/trl_grpo.py`, `recipes/trl_async_grpo.py`) share: their YAML config with `--set`
overrides, and their console: one readable line per logged step, TRL's vLLM-version warning at most once, and
line-buffered output so a log file gets each step as it happens. Recipes are scripts nothing imports; these parts
live here so both read a config and print a step the same way. Nothing heavy is imported at module level."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's exponent floats (`1e-5`, `3E4`): PyYAML alone reads them
    as strings, which then fail deep inside the learning-rate scheduler."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"), list("-+0123456789."))


def _read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


def load_recipe_config(path: str | Path, overrides: list[str]) -> dict[str, Any]:
    """The YAML config at `path` with `--set section.key=value` overrides applied (VALUE read as YAML; a number
    indexes a list: `datasets.0.weight=2`). Raises SystemExit naming the override that cannot apply."""
    config = _read_yaml(Path(path).read_text()) or {}
    for override in overrides:
        dotted, sep, raw = override.partition("=")
        if not sep:
            raise SystemExit(f"--set expects KEY=VALUE, got {override!r}")
        *parents, leaf = dotted.split(".")
        node: Any = config
        for part in parents:
            if isinstance(node, list):
                node = node[_index(node, part, dotted)]
                continue
            if not isinstance(node.get(part), (dict, list)):
                node[part] = {}
            node = node[part]
        if isinstance(node, list):
            node[_index(node, leaf, dotted)] = _read_yaml(raw)
        else:
            node[leaf] = _read_yaml(raw)
    return config


def _index(node: list[Any], part: str, dotted: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise SystemExit(f"--set {dotted}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


HEADLINE = (("loss", "loss"), ("reward", "reward"), ("completions/mean_length", "len"), ("entropy", "entropy"), ("kl", "kl"),
            ("grad_norm", "grad"), ("learning_rate", "lr"), ("step_time", "s/step"), ("perf/step_s", "s/step"))
"""TRL's per-step log keys shown first, with their short names (the reward with its `reward_std`); `step_time` is
GRPOTrainer's, `perf/step_s` AsyncGRPOTrainer's."""
ALWAYS_SHOWN = ("failed", "tool_calls", "parse_errors")
"""gym_bridge metrics shown even at 0; the others (failures by kind, per-environment rates) only when not 0."""


def compact_log_line(step: int, max_steps: int, logs: dict[str, Any]) -> str:
    """One readable line for a logging step: `step 3/30 | loss 0.012 | reward 0.41 ± 0.2 | ... | gym_bridge: failed 0,
    ...`. TRL's other keys (clip ratios, per-reward-function stats, token counts, the async trainer's queue and
    packing figures) and gym_bridge's zeros outside `ALWAYS_SHOWN` are left to the trainer's log history."""
    def number(value: Any) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    parts = [f"step {step}/{max_steps}"]
    for key, short in HEADLINE:
        if logs.get(key) is not None:
            spread = f" ± {number(logs['reward_std'])}" if key == "reward" and logs.get("reward_std") is not None else ""
            parts.append(f"{short} {number(logs[key])}{spread}")
    ours = [f"{key.removeprefix('gym_bridge/')} {number(value)}" for key, value in logs.items()
            if key.startswith("gym_bridge/") and value is not None and (value != 0 or key.removeprefix("gym_bridge/") in ALWAYS_SHOWN)]
    if ours:
        parts.append("gym_bridge: " + ", ".join(ours))
    if len(parts) == 1:  # not a training step (the end-of-training summary, say): its own keys
        parts += [f"{key} {number(value)}" for key, value in logs.items() if key != "total_flos"]
    return " | ".join(parts)


def quiet_vllm_version_warning(*, use_vllm: bool) -> None:
    """TRL warns about the installed vLLM's version from each module that asks whether vLLM is there (five times
    in one run): once when the run uses vLLM, never when it does not. Call before importing trl."""
    warnings.filterwarnings("once" if use_vllm else "ignore", message=r"TRL currently supports vLLM versions", category=UserWarning)


def use_compact_log(trainer: Any) -> None:
    """Print each logging step of `trainer` (a transformers `Trainer`: TRL's GRPO and async GRPO trainers) as
    `compact_log_line`, in place of the dict of 40 to 60 keys its console callbacks print."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class CompactProgress(ProgressCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            if state.is_world_process_zero and self.training_bar is not None and logs:
                self.training_bar.write(compact_log_line(state.global_step, state.max_steps, logs))

    class CompactPrinter(PrinterCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
            if state.is_local_process_zero and logs:
                print(compact_log_line(state.global_step, state.max_steps, logs), flush=True)

    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(CompactProgress)
    if trainer.pop_callback(PrinterCallback) is not None:
        trainer.add_callback(CompactPrinter)


def line_buffered_output() -> None:
    """Flush stdout and stderr at each line: redirected to a file they would otherwise hold the per-step
    metrics until the end of training."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
