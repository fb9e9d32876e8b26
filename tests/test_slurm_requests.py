"""The SLURM profile's train requests follow from measurements (scripts/slurm_requests.py), not from a guess."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from argparse import Namespace
from pathlib import Path

import yaml

import helpers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/slurm"))
import localcluster  # noqa: E402  (the workflow's local rules)
MEMORY = REPO / "docs/benchmarks/train_memory_cpu.json"
CHECK = REPO / "docs/benchmarks/device_check_h200.json"
REQUESTS = REPO / "docs/benchmarks/slurm_requests.json"


def load_script():
    return helpers.load_script("slurm_requests")


def test_committed_requests_are_derived_from_the_committed_measurements():
    script = load_script()
    derived = script.derive(Namespace(memory=str(MEMORY), device_check=str(CHECK)))
    assert derived == json.loads(REQUESTS.read_text())
    memory = json.loads(MEMORY.read_text())
    # every method of the paper grid was measured, each with the loader processes a GPU job of the profile gets
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert script.PROFILE_THREADS == profile["set-threads"]["train"] == profile["set-threads"]["train_candidate"] \
        == profile["set-threads"]["train_fold"]
    # a clean-then-retrain method trains its `of` method's recipe on a table of the same size: measured as that one
    plain = {m for m in params["grid"]["methods"] if not params["methods"][m].get("clean")}
    assert set(memory["methods"]) == plain
    assert all(row["loader_workers"] == script.PROFILE_THREADS - 1 for row in memory["methods"].values())
    # the largest peak is Ours' (two branches, the balanced batch of 256), as the issue's CPU run found
    assert derived["memory"]["largest"]["method"] == "ours"
    # the longest run is one of the [DB]-recipe runs on COCO-MLT (705 class-aware iterations an epoch)
    assert derived["time"]["longest"]["dataset"] == "coco"


def runtime_at(value, attempt: int) -> int:
    """A runtime as Snakemake evaluates the profile's value: a number, or an expression of `attempt`."""
    return value if isinstance(value, int) else eval(value, {"__builtins__": {}}, {"attempt": attempt})


def test_the_slurm_profile_asks_for_at_least_the_derived_requests():
    derived = json.loads(REQUESTS.read_text())
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["retries"] >= 1
    for rule in ("train", "train_candidate", "train_fold"):
        asked = profile["set-resources"][rule]
        assert asked["mem_mb"] >= derived["memory"]["request_mem_mb"], rule
        assert runtime_at(asked["runtime"], 1) >= derived["time"]["request_runtime_min"], rule
        # a retried run (its time limit hit) asks for more time on each attempt, and resumes its checkpoint
        times = [runtime_at(asked["runtime"], a) for a in range(1, profile["retries"] + 2)]
        assert times == sorted(set(times)), (rule, times)
    # and says where its numbers come from
    assert "scripts/slurm_requests.py" in (REPO / "workflow/profiles/slurm/config.yaml").read_text()


def rules_of(text: str) -> dict[str, str]:
    """Each rule's body in a .smk file, by name."""
    parts = re.split(r"^rule (\w+):\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_the_slurm_profile_sets_nothing_for_a_local_rule_and_routes_every_gpu_rule():
    """A local rule runs in the snakemake process on the login node: a runtime or memory set for it is never used.
    Every rule that asks for a GPU has its own set-resources entry with the partition line to edit."""
    texts = [f.read_text() for f in sorted((REPO / "workflow/rules").glob("*.smk"))]
    local = localcluster.local_rules()
    bodies = {name: body for text in texts for name, body in rules_of(text).items()}
    assert {"download", "fetch_train_images"} <= local <= set(bodies)
    gpu_rules = {name for name, body in bodies.items() if re.search(r"^\s+gpu=", body, re.M)}
    assert {"train", "train_candidate", "train_fold", "inference_time"} <= gpu_rules
    config = (REPO / "workflow/profiles/slurm/config.yaml").read_text()
    profile = yaml.safe_load(config)
    set_anywhere = set(profile["set-resources"]) | set(profile["set-threads"]) | set(profile["groups"])
    assert set_anywhere <= set(bodies), set_anywhere - set(bodies)
    assert not set_anywhere & local, set_anywhere & local
    for rule in gpu_rules:
        assert profile["set-resources"][rule]["gpu"] == 1, rule
        block = re.split(r"\n  \w", config.split("\nset-resources:", 1)[1].split(f"\n  {rule}:", 1)[1], maxsplit=1)[0]
        assert '# slurm_partition: "gpu"   # EDIT' in block, rule
    # the executor settings the manual names are the plugin's (pinned in requirements.lock)
    import snakemake_executor_plugin_slurm as plugin

    fields = {f.name.replace("_", "-") for f in dataclasses.fields(plugin.ExecutorSettings)}
    named = {key[len("slurm-"):] for key in profile if key.startswith("slurm-")}
    named |= {m for m in re.findall(r"^# (?:slurm-)?([a-z-]+): ", config, re.M)} & fields
    assert {"array-jobs", "requeue", "efficiency-report"} <= named <= fields
    assert set(profile["slurm-array-jobs"].split(",")) == {"train", "train_candidate", "train_fold"}
    assert not {"train", "train_candidate", "train_fold"} & set(profile["groups"])  # a group job cannot be an array task


def test_the_slurm_profile_never_holds_back_a_ready_run_of_the_paper_plan():
    """With job arrays, the plugin submits a rule's array once every ready job of that rule has reached it; a job
    Snakemake holds back under `jobs` never does, and the run waits forever (seen on the local cluster: 5 ready
    train runs with jobs 2 hang, with jobs 10 they finish; experiments/slurm_arrays). So `jobs` is above the
    paper plan's job count."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "rules", "--cores", "1"], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    total = int(re.search(r"^total\s+(\d+)$", out.stdout + out.stderr, re.M).group(1))
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert total > 400 and profile["jobs"] >= total, (total, profile["jobs"])
