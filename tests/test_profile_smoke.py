"""The smoke profile: the paper's configuration (ResNet-50 at 224, fresh views, loader workers, fp32, selection,
GloVe through its asset rule) through the whole workflow, every method and every ablation code path once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import project_copy, snakemake, write_layer

PROFILE = "workflow/profiles/smoke"


@pytest.mark.slow
def test_smoke_profile_runs_every_method_at_paper_shapes(tmp_path: Path) -> None:
    from noisymlt.data.classes import VOC_CLASSES
    from noisymlt.pipeline import paths
    from noisymlt.config import load_params, resolve_run

    wf = project_copy(tmp_path)
    # The profile's stand-in, drawn to under half its training images and 8 test images instead of 16, batches of 2
    # instead of 4, and 6 epochs instead of 8 (lr x0.1 at 4 and 5 instead of 5 and 7): every run's per-image shapes
    # and code path are the profile's (paper scale, 224 px, one iteration an epoch; DivideMix warms up, then
    # co-divides twice instead of three times; [DB]'s lr warm-up still outlasts the first lr step), while its
    # predictions (test set, training set for the fit record and DivideMix's co-divide, the suspect labels) and its
    # steps are fewer or smaller (its 26 trainings took 393 job seconds instead of `make smoke`'s 566, read from
    # their timing files before the test set was halved). The profile's own length is checked below without it.
    # The timing table times batch 1 only: its batch of 8 was most of that job's 30 s (12 methods at 224 px); the
    # demo run of tests/test_workflow.py times two batch sizes through the same code.
    write_layer(wf, {"datasets": {"voc_smoke": {"toy": {"n_test": 8}, "longtail": {"max": 6, "min": 2}}},
                     "train": {"batch_size": 2, "balanced_batch_size": 2, "epochs": 6, "lr_steps": [4, 5]},
                     "timing": {"batch_sizes": [1]}},
                "smaller.yaml")
    # Three trainings at once instead of the profile's two (each claims 2 cores): a run's numbers do not depend on
    # how many run beside it, and in `make test` the SLURM tests, which mostly wait on their cluster, run beside it.
    snakemake(wf, "--profile", PROFILE, "--configfile", f"{PROFILE}/params.yaml", "smaller.yaml", "--cores", "6",
              timeout=1800)

    # the profile keeps every run's recipe length (8 epochs, lr x0.1 at 5 and 7); the layer above shortens it here
    profile = load_params(wf / "params.yaml", wf / PROFILE / "params.yaml")
    for dataset, gamma, seed, method, noise in paths.all_runs(profile):
        train = resolve_run(profile, dataset, method, gamma, seed, noise=noise)["train"]
        assert (train["epochs"], train["lr_steps"], train["max_iters_per_epoch"]) == (8, [5, 7], 1), method
    params = load_params(wf / "params.yaml", wf / PROFILE / "params.yaml", wf / "smaller.yaml")
    runs = paths.all_runs(params)
    methods = {r.method for r in runs}
    # every method block of params.yaml that is not a number-only variant of another ran
    assert set(params["grid"]["methods"]) <= methods and "ours_shared_backbone" in methods
    assert {"ours_stitch_feature_concat", "ours_stitch_image_concat", "ours_mixup", "ours_single_random",
            "ours_single_balanced_stitchup", "ours_k3", "ours_p05", "ours_self", "ours_no_pseudo"} <= methods
    for dataset, gamma, seed, method, noise in runs:
        run = wf / paths.run_dir(dataset, gamma, seed, method, noise)
        config = json.loads((run / "run_config.json").read_text())
        train = config["train"]
        # the paper's shapes and code path, shortened in iterations per epoch and (the layer) in epochs
        assert (train["backbone"], train["image_size"], train["cache_size"]) == ("resnet50", 224, 256)
        assert (train["trunk_cache_views"], train["cpu_precision"], train["loader"]) == (0, "fp32", "cache")
        assert train["epochs"] == 6 and train["lr_steps"] == [4, 5] and train["max_iters_per_epoch"] == 1
        assert train["warmup_iters"] < 4 or train["long_warmup"], method  # [DB]'s warm-up outlasts the first step
        manifest = json.loads((run / "manifest.json").read_text())
        timing = json.loads((run / "manifest.timing.json").read_text())
        assert manifest["iterations_per_epoch"] == 1 and timing["loader_workers"] >= 1, method
        maps = json.loads((run / "map.json").read_text())  # the method's heads, its reported one first
        total = next(iter(maps.values()))["total"]
        assert 0 < total <= 100, (method, total)
        with np.load(run / "predictions.npz") as npz:
            for head in npz["heads"]:
                scores = npz[f"scores_{head}"]
                assert scores.shape == (8, len(VOC_CLASSES)) and np.isfinite(scores).all(), (method, head)
    mlgcn = json.loads((wf / paths.run_dir("voc_smoke", 0.5, 0, "mlgcn") / "run_config.json").read_text())
    glove = mlgcn["method_cfg"]["embeddings_file"]
    assert glove.startswith("data/assets/glove/glove_voc_fixture-") and (wf / glove).is_file()
    # DivideMix warms up to the first lr step (4 epochs here, 5 at the profile's length), then co-divides
    log = (wf / "logs/train/voc_smoke_g0.5_s0_dividemix.log").read_text()
    assert "dividemix: 4 warm-up epoch(s) of 6 before the first co-divide" in log, log[-2000:]
    # the selection chose ERM's lr and Ours' alpha x beta; the tables and figures of the paper exist
    for method, stage in (("erm", 1), ("ours", 1)):
        choice = json.loads((wf / f"runs/voc_smoke/select/{method}/stage{stage}.choice.json").read_text())
        assert choice["chosen"], choice
    for name in ("table_total.tex", "results.parquet", "ablation_ab_components.tex", "ablation_ab_k.png",
                 "inference_time_voc_smoke.tex", "fit_voc_smoke.tex"):
        assert (wf / "reports" / name).stat().st_size > 0, name
