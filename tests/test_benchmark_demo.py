"""The demo's recorded timing (docs/benchmarks/demo.json, scripts/benchmark_demo.py): the demo and the demo of an
earlier commit, timed in one sitting (issue 37), and the README's block stating both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIMING = json.loads((REPO / "docs" / "benchmarks" / "demo.json").read_text())


def calibration_s(timing: dict) -> float:
    cal = timing["calibration"]
    return (cal["before"]["torch_s"] + cal["after"]["torch_s"]) / 2


def test_the_timing_compares_with_an_earlier_commit_timed_in_the_same_sitting():
    before = TIMING["previous"]
    assert before["commit"] != TIMING["commit"] and TIMING["cores"] == before["cores"]
    # one sitting: the machine ran the calibration workload at about the same speed beside both demos
    assert 0.8 < calibration_s(TIMING) / calibration_s(before) < 1.25
    assert TIMING["runs"] > before["runs"]  # the clean column's runs


def test_the_readme_states_the_recorded_timing():
    sys.path.insert(0, str(REPO / "scripts"))
    from benchmark_demo import readme_timing

    numbers = json.loads((REPO / "docs" / "demo_numbers.json").read_text())
    assert numbers["timing"] == readme_timing(TIMING)
    assert numbers["timing"]["previous"]["commit"] == TIMING["previous"]["commit"]
