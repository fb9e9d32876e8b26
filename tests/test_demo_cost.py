"""experiments/demo_cost: its README's table is the rendering of its frozen result, and the sums add up."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

FOLDER = Path(__file__).resolve().parents[1] / "experiments" / "demo_cost"


def test_the_readme_shows_the_frozen_cost_estimate():
    spec = importlib.util.spec_from_file_location("estimate_cost", FOLDER / "estimate_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = json.loads((FOLDER / "result.json").read_text())
    assert module.table(result) in (FOLDER / "README.md").read_text()
    for regime in ("today", "candidate"):
        part = result[regime]
        assert part["train_seconds"] > part["runs"] * min(part["seconds_per_method"].values())
    assert result["ratio"] == round(result["candidate"]["train_seconds"] / result["today"]["train_seconds"], 2)
