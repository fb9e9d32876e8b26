"""What the one-change experiments on the demo share (experiments/ldam_cause, experiments/ours_spread): a run of the
demo's configuration with changes, trained by experiment_new_layer_lr.py in a process of its own, and the demo's
own runs and selected values, read from a clone where `make demo` has finished."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "experiments/new_layer_lr/experiment_new_layer_lr.py"
HEAD = {"ours": "ensemble"}  # the head the tables report per method (default: main)


def variant_map(method: str, gamma: float, seed: int, flags: list[str], train_seed: int | None = None) -> float:
    """Test mAP (%) of ``method`` at the demo's configuration (new layers at 10x, as the demo) with ``flags``
    (experiment_new_layer_lr.py options); ``train_seed``: the training's own seed, ``seed`` naming the labels."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "run.json"
        argv = [sys.executable, SCRIPT, "--gamma", f"{gamma:g}", "--seed", str(seed), "--mults", "10",
                "--methods", method, "--json", str(out), *flags]
        if train_seed is not None:
            argv += ["--train-seed", str(train_seed)]
        subprocess.run(argv, cwd=REPO, check=True, capture_output=True, text=True)
        return json.loads(out.read_text())["runs"][method]["x10"]["test_map"][HEAD.get(method, "main")]


def demo_map(method: str, gamma: float, seed: int) -> float:
    """Test mAP (%) of the demo's own run, from its metrics.json."""
    metrics = json.loads((REPO / "runs" / "toy" / f"g{gamma:g}" / f"s{seed}" / method / "metrics.json").read_text())
    return round(100 * metrics["heads"][HEAD.get(method, "main")]["map"]["total"], 2)


def ours_values() -> list[str]:
    """The values the demo's selection chose for Ours, as experiment_new_layer_lr.py's --values KEY=VALUE words."""
    numbers = json.loads((REPO / "reports" / "readme_numbers.json").read_text())
    chosen = next(s for s in numbers["selection"] if s["method"] == "ours")["chosen"]
    return [f"{k}={v:g}" for k, v in sorted(chosen.items())]
