"""scripts/compare_runs.py: tells a change of results from a change of the code that produced them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from helpers import load_script

compare_runs = load_script("compare_runs")


def _run(root: Path, scores: np.ndarray, code: str, metrics: str = '{"map": 1}', weight: float = 0.5) -> None:
    import torch

    run = root / "runs" / "toy" / "g0.5" / "s0" / "erm"
    run.mkdir(parents=True)
    np.savez_compressed(run / "predictions.npz", image_ids=np.array(["a", "b"]), scores_main=scores,
                        code_digest=np.array(code), checkpoint_sha256=np.array(f"hash of {code}"))
    torch.save({"code": code, "content_sha256": f"hash of {code}", "epoch": 2,
                "model": {"head.weight": torch.full((2, 3), weight)}}, run / "checkpoint.pt")
    (run / "metrics.json").write_text(metrics)


def test_same_results_under_other_code_are_identical_and_any_other_change_is_not(tmp_path):
    scores = np.array([[0.25, 0.5], [0.125, 1.0]], dtype=np.float32)
    _run(tmp_path / "a", scores, "code-a")
    _run(tmp_path / "b", scores.copy(), "code-b")
    same = compare_runs.compare(tmp_path / "a", tmp_path / "b")
    assert same["identical"] and same["runs"] == 1 and same["identity_differs"] == 1 and same["checkpoints"] == 1

    nudged = scores.copy()
    nudged[1, 0] = np.nextafter(nudged[1, 0], np.float32(1))  # one ulp
    _run(tmp_path / "c", nudged, "code-a")
    differ = compare_runs.compare(tmp_path / "a", tmp_path / "c")
    assert not differ["identical"] and differ["predictions_differ"] == {
        "runs/toy/g0.5/s0/erm/predictions.npz": ["scores_main"]}

    _run(tmp_path / "d", scores, "code-a", metrics='{"map": 2}')
    assert compare_runs.compare(tmp_path / "a", tmp_path / "d")["metrics_differ"] == ["runs/toy/g0.5/s0/erm/metrics.json"]
    _run(tmp_path / "f", scores, "code-a", weight=0.25)
    assert compare_runs.compare(tmp_path / "a", tmp_path / "f")["checkpoints_differ"] == {
        "runs/toy/g0.5/s0/erm/checkpoint.pt": ["model"]}
    (tmp_path / "e" / "runs").mkdir(parents=True)
    assert compare_runs.compare(tmp_path / "a", tmp_path / "e")["missing"] == ["runs/toy/g0.5/s0/erm/predictions.npz"]
