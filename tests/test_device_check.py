"""scripts/device_check.sh: the CPU mode CI runs, so that the GPU check cannot rot before a GPU comes."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import helpers

REPO = Path(__file__).resolve().parents[1]


def load_script():
    return helpers.load_script("device_check")


def run_check(out: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
    return subprocess.run(["bash", "scripts/device_check.sh", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_cpu_quick_mode_runs_every_part_and_writes_the_gpu_keys_as_null(tmp_path):
    proc = run_check(tmp_path, "--device", "cpu", "--quick")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "device_check.json").read_text())
    assert result["wall_s"] < 120  # the acceptance: under 2 minutes on CPU
    assert result["mode"] == {"device": "cpu", "quick": True, "dry_run": False, "budget_s": 480.0,
                              "wheels_unpacked": []}
    env = result["environment"]
    assert env["cuda_available"] is False and isinstance(env["torch"], str)
    for key in ("gpu_name", "gpu_memory_gib", "cuda_runtime", "bf16_supported", "tf32_supported"):
        assert key in env and env[key] is None, key
    parts = result["parts"]
    keys = load_script().PART_KEYS
    assert list(parts) == ["step_profile", "cuda_tests", "throughput", "loader", "end_to_end", "grid_wall", "smoke",
                           "grid"]
    for name, record in parts.items():
        assert set(record) == {"status", "reason", "wall_s", *keys[name]}, name  # the GPU mode's keys
        if name in ("smoke", "grid_wall"):  # the suite runs the smoke profile; --dry-run plans the grid's wall
            assert record["status"] == "skipped" and "tests/test_" in record["reason"]
            continue
        assert record["status"] == "ok" and isinstance(record["wall_s"], float), (name, record["reason"])

    tests = parts["cuda_tests"]
    assert tests["passed"] == tests["failed"] == 0 and tests["skipped"] == len(tests["tests"]) >= 9
    assert "tests/test_cuda.py" in tests["files"]
    assert all(t["outcome"] == "skipped" and "CUDA" in t["reason"] for t in tests["tests"])  # each says why

    tp = parts["throughput"]
    assert set(tp["methods"]) == {"erm", "db_focal", "bbn", "dividemix", "ours"} and tp["precision"] == "fp32"
    for row in tp["methods"].values():
        assert row["train_images_per_s"] > 0 and row["peak_gpu_mem_mib"] is None
    assert parts["loader"]["best"]["img_per_s"] > 0 and set(parts["loader"]["keeps_up"]) == set(tp["methods"])

    e2e = parts["end_to_end"]
    assert e2e["cuda"] is None and e2e["cuda_reason"] == "no CUDA device"
    assert e2e["map_difference_cuda_minus_cpu"] is None
    cpu = e2e["cpu"]
    assert cpu["device"] == "cpu" and cpu["trace_ok"] is True and cpu["train_s"] > 0
    assert set(cpu["map"]) == {"ensemble", "random", "balanced"} and all(0 < v <= 1 for v in cpu["map"].values())
    assert (tmp_path / "e2e" / "cpu" / "metrics.json").exists()

    grid = parts["grid"]
    # main grid + ablations, 112 model-selection candidates (56 per dataset) and 200 cross-fitting runs (100 per
    # dataset: 5 folds of ERM on each of 20 noisy sets)
    assert grid["runs"] == 680 + 112 + 200 and grid["candidates"] == 112 and grid["crossfit_runs"] == 200
    assert grid["by_dataset"]["voc"]["runs"] == 400 + 56 + 100
    assert grid["iterations"] == sum(j["iterations"] for j in json.loads((tmp_path / "grid_plan.json").read_text()))
    assert grid["gpu_hours"] is None and "no CUDA" in grid["gpu_hours_reason"]
    assert grid["packing"]["speedup"] is None and grid["packing"]["reason"] == "no CUDA device"
    summary = (tmp_path / "device_check.md").read_text()
    assert "| end_to_end | ok |" in summary and "GPU-hours: not estimated" in summary


def test_dry_run_plans_every_part_quickly_and_measures_nothing(tmp_path):
    """The GPU reading's code paths on the CPU: one eager step profiled, the device set's loader, the packed grid
    and the smoke profile through `snakemake -n` with the resources a GPU run gives them, the paper grid's plan."""
    proc = run_check(tmp_path, "--dry-run", "--device", "cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "device_check.json").read_text())
    assert result["mode"]["dry_run"] is True and result["wall_s"] < 150
    parts = result["parts"]
    assert {n for n, p in parts.items() if p["status"] == "skipped"} == {"cuda_tests", "throughput", "end_to_end"}
    assert all(p["status"] == "ok" for n, p in parts.items() if n not in {"cuda_tests", "throughput", "end_to_end"})
    erm = parts["step_profile"]["methods"]["erm"]["eager"]
    assert erm["ms_per_step"] > 0 and erm["images_per_step"] == 32 and erm["top_ops"][0]["self_cpu_ms_per_step"] > 0
    assert erm["device_busy_share"] is None  # no device timeline on the CPU
    loader = parts["loader"]
    assert loader["device_images"]["loader"].startswith("device_images_b") and loader["device_images"]["img_per_s"] > 0
    gw = parts["grid_wall"]
    assert gw["dry_run"] is True and gw["runs_per_gpu"] == 4  # the h200 profile's packing
    assert gw["planned_jobs"] == len(gw["methods"]) == 11 and gw["grid_runs"] == 680 + 112 + 200
    assert gw["grid_wall"] is None and gw["grid_wall_reason"] == "dry run: planned only"
    assert parts["smoke"]["runs"] > 11 and parts["smoke"]["reason"] == "dry run: planned only"
    summary = (tmp_path / "device_check.md").read_text()
    assert "Grid wall time: not measured (dry run: planned only)" in summary and " h for the paper grid" not in summary


def test_a_spent_budget_skips_every_part_and_says_so(tmp_path):
    """The budget is checked before each part: none starts once it is spent."""
    proc = run_check(tmp_path, "--device", "cpu", "--quick", "--budget-min", "0.001")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = json.loads((tmp_path / "device_check.json").read_text())["parts"]
    assert all(p["status"] == "skipped" and p["reason"].startswith("time budget") for p in parts.values())


def test_only_the_selected_parts_run(tmp_path):
    proc = run_check(tmp_path, "--device", "cpu", "--quick", "--parts", "grid")
    assert proc.returncode == 0, proc.stderr[-3000:]
    parts = json.loads((tmp_path / "device_check.json").read_text())["parts"]
    assert parts["grid"]["status"] == "ok" and parts["grid"]["runs"] == 680 + 112 + 200
    assert {p["reason"] for name, p in parts.items() if name != "grid"} == {"not selected (--parts)"}
    assert parts["grid"]["gpu_hours"] is None  # nothing measured to price the runs with


def test_a_part_whose_library_is_missing_is_skipped_by_name(monkeypatch):
    script = load_script()
    monkeypatch.setitem(script.NEEDS, "grid", ["yaml", "no_such_library_here"])
    assert script.missing("grid") == ["no_such_library_here"]
    assert script.missing("loader") == []


def test_wheels_of_missing_libraries_are_unpacked_and_importable(tmp_path, monkeypatch):
    import zipfile

    script = load_script()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "devcheck_fake_lib-1.0-py3-none-any.whl", "w") as z:
        z.writestr("devcheck_fake_lib/__init__.py", "VALUE = 42\n")
    with zipfile.ZipFile(wheels / "numpy-9.9-py3-none-any.whl", "w") as z:  # importable already: left alone
        z.writestr("numpy/__init__.py", "raise ImportError('the wheel, not the installed numpy')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert script.unpack_wheels(wheels, tmp_path / "site") == ["devcheck_fake_lib"]
    assert importlib.import_module("devcheck_fake_lib").VALUE == 42
    assert not (tmp_path / "site" / "numpy").exists()
    sys.modules.pop("devcheck_fake_lib", None)


def test_the_readme_statements_about_the_first_gpu_run_follow_from_its_json():
    """The manual's GPU check page (docs/gpu-check.md) says what the H200 run found without typing its numbers;
    this keeps those words true."""
    module = load_script()
    result = json.loads((REPO / "docs/benchmarks/device_check_h200.json").read_text())
    page = (REPO / "docs" / "gpu-check.md").read_text()
    assert "NVIDIA H200" in result["environment"]["gpu_name"] and "NVIDIA H200" in page
    assert result["environment"]["torch"].startswith("2.11") and "torch 2.11" in page
    parts = result["parts"]
    assert all(p["status"] == "ok" for p in parts.values()), {k: p["status"] for k, p in parts.items()}
    assert parts["cuda_tests"]["failed"] == 0 and parts["cuda_tests"]["passed"] > 0
    e2e = parts["end_to_end"]
    assert e2e["cpu"]["trace_ok"] and e2e["cuda"]["trace_ok"] and e2e["cuda"]["device"] == "cuda"
    assert "traced clean" in page
    # "the loader did not keep up with Ours' training at paper shapes"
    assert parts["loader"]["keeps_up"]["ours"] is False
    assert parts["loader"]["best"]["img_per_s"] < parts["throughput"]["methods"]["ours"]["train_images_per_s"]
    assert "did not keep up with\nOurs' training" in page
    # the committed summary is the script's own rendering of the JSON (plus the rerun line)
    summary = (REPO / "docs/benchmarks/device_check_h200.md").read_text()
    assert summary.startswith(module.summary_markdown(result))
