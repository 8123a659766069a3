"""The learning-curve plot's legend covers none of the curves (issue 19 item 18), checked on the drawn figure
with made-up curves (the 50-minute benchmark is not run)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_the_legend_lies_outside_the_axes(tmp_path):
    pytest.importorskip("matplotlib")
    module = load_script(ROOT / "benchmarks" / "learning_curve.py")
    rng = random.Random(0)
    curves = {seed: [min(1.0, 0.1 + step / 60 + rng.uniform(-0.1, 0.1)) for step in range(50)] for seed in (0, 1, 2)}
    grpo = {"per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "num_generations": 8}
    figure = module.plot(tmp_path / "curve.png", curves, 0.12, {0: 0.8, 1: 0.75, 2: 0.9}, 50, grpo)
    figure.canvas.draw()
    [axis] = figure.axes
    legend, plot_area = axis.get_legend().get_window_extent(), axis.get_window_extent()
    assert legend.y1 <= plot_area.y0 or legend.x0 >= plot_area.x1  # below or beside the axes, not over the curves
    assert (tmp_path / "curve.png").stat().st_size > 10_000
    from PIL import Image  # the saved image holds the axes and the whole legend under them (bbox_inches="tight")

    assert Image.open(tmp_path / "curve.png").size[1] >= plot_area.y1 - legend.y0
