"""The sbatch counts docs/slurm.md quotes are the measured ones (scripts/slurm_submissions.py), and they add up."""

from __future__ import annotations

import json
import sys
from collections import Counter
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import slurm_submissions as script  # noqa: E402


def test_the_manual_quotes_the_measured_counts():
    result = json.loads(script.JSON.read_text())
    docs = script.DOCS.read_text()
    begin, end = docs.index(script.MARK_BEGIN), docs.index(script.MARK_END) + len(script.MARK_END)
    assert docs[begin:end] == script.render(result), "rerun: python scripts/slurm_submissions.py docs"


def test_the_measured_counts_add_up_and_were_taken_with_the_pinned_plugin():
    result = json.loads(script.JSON.read_text())
    assert result["snakemake_executor_plugin_slurm"] == version("snakemake-executor-plugin-slurm")
    arrays, single = result["modes"]["arrays"], result["modes"]["one job each"]
    groups = Counter(script.profile()["groups"].values())  # a group's jobs run as one SLURM job
    for mode in (arrays, single):
        assert mode["planned_jobs"] == sum(mode["planned_jobs_by_rule"].values())
        assert sum(mode["calls_by_rule"].values()) == mode["sbatch_calls"]
        # every planned job ran, as one SLURM job (an array task is one) or inside its group's
        packed = sum((groups[name.split("_")[1]] - 1) * n for name, n in mode["calls_by_rule"].items()
                     if name.startswith("group_"))
        assert mode["jobs_submitted"] == mode["planned_jobs"] - packed
    assert single["sbatch_calls"] == single["jobs_submitted"] and single["array_calls"] == 0
    assert 0 < arrays["array_calls"] and arrays["sbatch_calls"] < single["sbatch_calls"]
    # only the rules the profile names go as arrays
    assert set(arrays["calls_by_rule"]) == set(single["calls_by_rule"])
    others = {rule: n for rule, n in single["calls_by_rule"].items() if rule not in ("rule_train", "rule_train_candidate")}
    assert all(arrays["calls_by_rule"][rule] == n for rule, n in others.items())
