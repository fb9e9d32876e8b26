"""The SLURM profile's train requests follow from measurements (scripts/slurm_requests.py), not from a guess."""

from __future__ import annotations

import importlib.util
import json
import sys
from argparse import Namespace
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
MEMORY = REPO / "docs/benchmarks/train_memory_cpu.json"
CHECK = REPO / "docs/benchmarks/device_check_h200.json"
REQUESTS = REPO / "docs/benchmarks/slurm_requests.json"


def load_script():
    spec = importlib.util.spec_from_file_location("slurm_requests", REPO / "scripts/slurm_requests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["slurm_requests"] = module
    spec.loader.exec_module(module)
    return module


def test_committed_requests_are_derived_from_the_committed_measurements():
    script = load_script()
    derived = script.derive(Namespace(memory=str(MEMORY), device_check=str(CHECK)))
    assert derived == json.loads(REQUESTS.read_text())
    memory = json.loads(MEMORY.read_text())
    # every method of the paper grid was measured, each with the loader processes a GPU job of the profile gets
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert script.PROFILE_THREADS == profile["set-threads"]["train"] == profile["set-threads"]["train_candidate"]
    assert set(memory["methods"]) == set(params["grid"]["methods"])
    assert all(row["loader_workers"] == script.PROFILE_THREADS - 1 for row in memory["methods"].values())
    # the largest peak is Ours' (two branches, the balanced batch of 256), as the issue's CPU run found
    assert derived["memory"]["largest"]["method"] == "ours"
    # the longest run is one of the [DB]-recipe runs on COCO-MLT (705 class-aware iterations an epoch)
    assert derived["time"]["longest"]["dataset"] == "coco"


def test_the_slurm_profile_asks_for_at_least_the_derived_requests():
    derived = json.loads(REQUESTS.read_text())
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    for rule in ("train", "train_candidate"):
        asked = profile["set-resources"][rule]
        assert asked["mem_mb"] >= derived["memory"]["request_mem_mb"], rule
        assert asked["runtime"] >= derived["time"]["request_runtime_min"], rule
    # and says where its numbers come from
    assert "scripts/slurm_requests.py" in (REPO / "workflow/profiles/slurm/config.yaml").read_text()
