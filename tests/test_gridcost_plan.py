"""The paper grid's cost plan (scripts/gridcost.py): its runs are the workflow's, its iterations the trainer's own."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from noisymlt.data.labels import LabelTable, write_class_split, write_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.data.kinds import kind_of
from noisymlt.pipeline import paths
from noisymlt.config import load_params, resolve_run
from helpers import load_script

PROJECT = Path(__file__).resolve().parents[1]
gridcost = load_script("gridcost")


@pytest.fixture(scope="module")
def paper_params() -> dict:
    return load_params(PROJECT / "params.yaml")


def test_synthetic_labels_have_the_published_counts_and_no_empty_image():
    voc = kind_of("voc").published_subset
    y = gridcost.synthetic_labels(voc["images"], voc["counts"])
    assert y.shape == (1142, 20) and y.sum(0).tolist() == voc["counts"]
    assert y.any(1).all()
    with pytest.raises(NoisyMLTError, match="cannot fill 10 images"):
        gridcost.synthetic_labels(10, [11, 3])


def test_all_runs_are_the_main_grid_then_each_ablation_once(paper_params):
    runs = paths.all_runs(paper_params)
    main = paths.grid_runs(paper_params)
    assert runs[:len(main)] == main and len(main) == 2 * 4 * 5 * 14  # 10 baselines, 3 clean-then-retrain, Ours
    assert len(runs) == len(set(runs))
    for name in paper_params["grid"]["ablations"]:
        assert set(paths.ablation_runs(paper_params, name)) <= set(runs)
    # ours at gamma 0.5 is in the main grid and in ab_components: planned once
    assert runs.count(("voc", 0.5, 0, "ours", "cooccurrence")) == 1


def small_model(params: dict) -> dict:
    """A scratch model and no download: the backbone does not change how many iterations a run has."""
    params = copy.deepcopy(params)
    params["train"].update({"backbone": "smallcnn", "pretrained": False, "weights_path": None, "trainable": "all",
                            "frozen_bn": False, "workers": 0, "loader": "pil"})
    return params


@pytest.mark.parametrize("method", ["db_focal", "ours"])
def test_planned_iterations_are_the_trainers_own_for_a_voc_run(paper_params, tmp_path, method):
    """db_focal: [DB]'s class-aware epoch (reads the noisy class counts); ours: [CL]'s floor(N / 32)."""
    from noisymlt.training.trainer import Trainer

    params = small_model(paper_params)
    noisy, split, source = gridcost.planned_noisy_labels(params, "voc", 0.5, 0, data_root=tmp_path / "none")
    assert source.startswith("synthetic voc")
    planned = gridcost.run_iterations(resolve_run(params, "voc", method, 0.5, 0), noisy, split)
    classes = [f"c{i}" for i in range(20)]
    table = LabelTable(image_ids=[str(i) for i in range(len(noisy))], classes=classes, labels=noisy,
                       paths=[f"{i}.jpg" for i in range(len(noisy))])
    write_labels(table, tmp_path / "noisy.parquet")
    write_labels(table.subset(range(8)), tmp_path / "test.parquet")
    write_class_split(split, tmp_path / "split.json")
    trainer = Trainer(resolve_run(params, "voc", method, 0.5, 0), train_labels=tmp_path / "noisy.parquet",
                      test_labels=tmp_path / "test.parquet", split=tmp_path / "split.json", train_images=tmp_path,
                      test_images=tmp_path, out_dir=tmp_path / "run", device="cpu", progress=False)
    assert planned["iterations_per_epoch"] == trainer.iters
    assert planned["iterations"] == trainer.iters * trainer.cfg["train"]["epochs"]
    if method == "ours":
        assert trainer.iters == 1142 // 32
    else:  # one pass of the class-aware sampler over the noisy labels
        assert trainer.iters == int(noisy.sum(0).max() * 20 / 4) // 32


def test_the_plan_reads_the_pipelines_noisy_labels_when_they_exist(paper_params, tmp_path):
    y = np.zeros((40, 20), dtype=np.uint8)
    y[:, 0] = 1
    y[:5, 1] = 1
    table = LabelTable(image_ids=[str(i) for i in range(40)], classes=[f"c{i}" for i in range(20)], labels=y)
    write_labels(table, tmp_path / "voc" / "noisy" / "g0.5_s0.parquet")
    write_class_split({"head": [], "medium": [0], "tail": list(range(1, 20))}, tmp_path / "voc" / "class_split.json")
    noisy, split, source = gridcost.planned_noisy_labels(paper_params, "voc", 0.5, 0, data_root=tmp_path)
    assert source.endswith("g0.5_s0.parquet") and noisy.sum() == 45 and split["medium"] == [0]
    plan = gridcost.run_iterations(resolve_run(paper_params, "voc", "db_focal", 0.5, 0), noisy, split)
    assert plan["iterations_per_epoch"] == int(40 * 20 / 4) // 32 and plan["images_per_step"] == 32


def test_gpu_hours_price_each_run_by_its_family_per_image_cost():
    jobs = [{"dataset": "voc", "method": "erm", "family": "single", "iterations": 100, "images_per_step": 32},
            {"dataset": "voc", "method": "ours_k3", "family": "colearning", "iterations": 10, "images_per_step": 864},
            {"dataset": "coco", "method": "bbn", "family": "bbn", "iterations": 50, "images_per_step": 64}]
    measured = {"erm": {"ms_per_step": 36.0, "train_images_per_step": 32},
                "ours": {"ms_per_step": 576.0, "train_images_per_step": 576}}
    est = gridcost.gpu_hours(jobs, measured, packing_speedup=1.5)
    # erm: 100 x 36 ms; ours_k3 at ours' 1 ms per image: 10 x 864 ms; bbn: no measured proxy
    assert est["by_dataset"] == {"voc": pytest.approx((3600 + 8640) / 3.6e6)}
    assert est["total"] == pytest.approx((3600 + 8640) / 3.6e6)
    assert est["packed_total"] == pytest.approx(est["total"] / 1.5)
    assert est["unpriced_methods"] == ["bbn"]
    assert gridcost.gpu_hours(jobs, measured)["packed_total"] is None


def test_the_plan_counts_the_model_selection_candidates(paper_params):
    """The paper's selection: ten baselines x 4 lr, Ours 4 lr + 3 alpha x 4 beta, per dataset, at one noise rate
    and seed; a candidate trains on the fit part, so it has fewer iterations than the final run of its method."""
    jobs = gridcost.plan_grid(small_model(paper_params), data_root="no-data-here")
    candidates = [j for j in jobs if "candidate" in j]
    assert len(candidates) == 2 * (10 * 4 + 4 + 12) == gridcost.summarise(jobs)["candidates"]
    # the cross-fitting: 5 folds of ERM on each of the 20 noisy sets of each dataset, each on four fifths of it
    folds = [j for j in jobs if "crossfit" in j]
    assert len(folds) == 2 * 20 * 5 == gridcost.summarise(jobs)["crossfit_runs"]
    assert {j["method"] for j in folds} == {"erm"}
    assert len(jobs) - len(candidates) - len(folds) == len(paths.all_runs(paper_params))
    final = {(j["dataset"], j["method"]): j for j in jobs if "candidate" not in j and j["gamma"] == 0.5 and j["seed"] == 0}
    for job in candidates + [j for j in folds if j["gamma"] == 0.5 and j["seed"] == 0]:
        assert job["iterations"] < final[job["dataset"], job["method"]]["iterations"], job
    assert {j["candidate"] for j in candidates if j["method"] == "ours"} >= {"stage1/lr0.2", "stage2/alpha0.7_beta0.4"}
