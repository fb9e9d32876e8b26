"""The grid's wall time on one card from measured runs (scripts/gridcost.py): the arithmetic, the files."""

from __future__ import annotations

import json

import pytest

from noisymlt.errors import NoisyMLTError
from helpers import load_script

gridcost = load_script("gridcost")
grid_wall, planned_run_seconds = gridcost.grid_wall, gridcost.planned_run_seconds
read_benchmark_seconds, run_cost = gridcost.read_benchmark_seconds, gridcost.run_cost

COST = {"fixed_s": 20.0, "s_per_iteration": 0.05, "predict_images_per_s": 1000.0}


def job(method="erm", family="single", **kw):
    return {"dataset": "voc", "test_images": 4952, "method": method, "family": family, "iterations": 280, "epochs": 8,
            "train_images": 1142, "held_out_images": 0, **kw}


def test_a_planned_run_costs_start_up_steps_and_prediction():
    assert planned_run_seconds(job(), COST) == pytest.approx(20 + 280 * 0.05 + (1142 + 4952) / 1000)
    cand = job(candidate="stage1/lr0.02", train_images=914, held_out_images=228)
    assert planned_run_seconds(cand, COST) == pytest.approx(20 + 14 + 1142 / 1000)  # no test set
    dm = job("dividemix", "dividemix")  # co-divide: two nets over the training images every epoch
    assert planned_run_seconds(dm, COST) == pytest.approx(20 + 14 + (1142 + 4952 + 2 * 1142 * 8) / 1000)


def test_grid_wall_divides_the_packed_runs_by_k_and_prices_a_method_by_its_family():
    jobs = [job(), job("focal"), job("ours_k3", "colearning"), job("ours", "colearning", dataset="coco", test_images=5000),
            job("mystery", "unknown")]
    costs = {"erm": COST, "ours": {**COST, "s_per_iteration": 0.2}}
    one = planned_run_seconds(jobs[0], COST)
    ours_voc = planned_run_seconds(jobs[2], costs["ours"])
    ours_coco = 20 + 280 * 0.2 + (1142 + 5000) / 1000
    out = grid_wall(jobs, costs, 4)
    assert out["hours"] == pytest.approx((2 * one + ours_voc + ours_coco) / 4 / 3600)
    assert out["by_dataset"]["coco"] == pytest.approx(ours_coco / 4 / 3600)
    assert out["unpriced_methods"] == ["mystery"] and out["runs_per_gpu"] == 4
    assert grid_wall(jobs, costs, 1)["hours"] == pytest.approx(4 * out["hours"])


def test_run_cost_reads_a_finished_run(tmp_path):
    """The files as a run writes them (tests/test_device_check.py reads real ones through the dry path)."""
    (tmp_path / "manifest.json").write_text(json.dumps({
        "iterations_per_epoch": 25, "run": {"train": {"epochs": 8}, "method_cfg": {"family": "single"}},
        "environment": {"device": "cuda:0"}}))
    (tmp_path / "manifest.timing.json").write_text(json.dumps({
        "epoch_seconds": [2.0] * 8, "predict_seconds": 4.0, "predicted_images": 2000, "seconds": 49}))
    cost = run_cost(tmp_path, 50.0)
    assert cost["s_per_iteration"] == pytest.approx(16 / 200) and cost["predict_images_per_s"] == 500
    assert cost["fixed_s"] == pytest.approx(30.0) and cost["device"] == "cuda:0"
    bench = tmp_path / "b.tsv"
    bench.write_text("s\th:m:s\tmax_rss\n50.1234\t0:00:50\t100\n")
    assert read_benchmark_seconds(bench) == pytest.approx(50.1234)
    bench.write_text("nothing\n")
    with pytest.raises(NoisyMLTError, match="not a Snakemake benchmark file"):
        read_benchmark_seconds(bench)


def test_run_cost_reads_what_a_trainer_writes(tiny_toy, tmp_path):
    from helpers import tiny_params, toy_trainer
    from noisymlt.config import resolve_run

    resolved = resolve_run(tiny_params("erm"), "toy", "erm", 0.5, 0)
    trainer = toy_trainer(tiny_toy, resolved, tmp_path / "run")
    trainer.run()
    timing = json.loads((tmp_path / "run" / "manifest.timing.json").read_text())
    assert timing["predicted_images"] == len(trainer.test_table) + len(trainer.train_table) == 200 + len(trainer.train_table)
    cost = run_cost(tmp_path / "run", timing["seconds"] + 5.0)
    assert cost["iterations"] == trainer.iters * 2 and cost["s_per_iteration"] > 0
    assert cost["predict_images_per_s"] > 0 and cost["fixed_s"] > 0 and cost["device"] == "cpu"
