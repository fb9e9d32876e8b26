"""scripts/benchmark_throughput.py: what its JSON claims, on the demo's small shapes (seconds on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_each_method_is_compared_with_a_bare_backbone_at_its_own_images_per_step(tmp_path):
    out = tmp_path / "throughput.json"
    subprocess.run([sys.executable, "scripts/benchmark_throughput.py", "--params", "params.yaml",
                    "workflow/profiles/demo/params.yaml", "--dataset", "toy", "--methods", "erm", "ours",
                    "--device", "cpu", "--iters", "1", "--warmup", "0", "--rounds", "1", "--num-images", "96",
                    "--json", str(out)], cwd=REPO, check=True, capture_output=True, text=True)
    info = json.loads(out.read_text())
    assert info["precision"] == "fp32" and info["device"].startswith("CPU")
    assert set(info["versions"]) >= {"torch", "torchvision", "noisymlt"}
    rows = {r["method"]: r for r in info["rows"]}
    tcfg = info["train"]
    # ERM: one random batch; Ours: anchor + Stitch-Up partner (K = 2) in both branches' batches
    assert rows["erm"]["train_images_per_step"] == tcfg["batch_size"]
    assert rows["ours"]["train_images_per_step"] == 2 * (tcfg["batch_size"] + tcfg["balanced_batch_size"])
    for method in ("erm", "ours"):
        r = rows[method]
        bare = rows[f"bare backbone ({r['trainable']}, {r['train_images_per_step']} img)"]
        assert bare["train_images_per_step"] == r["train_images_per_step"] and bare["cost_per_image_vs_bare"] == 1.0
        expected = (r["ms_per_step"] / r["train_images_per_step"]) / (bare["ms_per_step"] / bare["train_images_per_step"])
        assert abs(r["cost_per_image_vs_bare"] - expected) < 1e-9
        assert abs(r["train_images_per_s"] - r["train_images_per_step"] / (r["ms_per_step"] / 1000)) < 1e-6
        assert r["peak_gpu_mem_mib"] is None and bare["peak_gpu_mem_mib"] is None  # measured on CUDA only
    assert len(rows) == 4  # one bare reference per (trainable stages, images per step)


def test_concurrent_processes_start_timing_together_at_the_barrier(tmp_path):
    """--barrier: a process builds its nets, says it is ready and times nothing until told to go."""
    out, barrier = tmp_path / "throughput.json", tmp_path / "barrier"
    barrier.mkdir()
    proc = subprocess.Popen([sys.executable, "scripts/benchmark_throughput.py", "--params", "params.yaml",
                             "workflow/profiles/demo/params.yaml", "--dataset", "toy", "--methods", "erm", "--device",
                             "cpu", "--iters", "1", "--warmup", "0", "--rounds", "1", "--num-images", "96",
                             "--barrier", str(barrier), "--json", str(out)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(barrier.glob("*.ready")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.name for p in barrier.glob("*.ready")] == [f"{proc.pid}.ready"]
        time.sleep(1)
        assert proc.poll() is None and not out.exists()  # waiting at the barrier
        (barrier / "go").touch()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert {r["method"] for r in json.loads(out.read_text())["rows"]} >= {"erm"}
