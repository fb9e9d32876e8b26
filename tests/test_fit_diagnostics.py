"""Fit diagnostics (noisymlt.training.fit_diagnostics), the warm-up check, pseudo-label change counts, and the two
report tables that read them (fit, paired differences)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import tiny_params, toy_trainer
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.base import PublishedTargets
from noisymlt.config import resolve_run
from noisymlt.report.aggregate import aggregate
from noisymlt.report.fit import fit_summary, paired_differences, write_fit_table, write_paired_table
from noisymlt.training.fit_diagnostics import bce, diagnose, noisy_map, prior_bce, pseudo_label_changes
from noisymlt.training.noise_monitor import NoiseMonitor
from noisymlt.training.schedule import check_warmup, lr_at


def test_bce_and_prior_bce_follow_their_formulas():
    rng = np.random.default_rng(0)
    y = (rng.random((50, 6)) < 0.3).astype(float)
    p = rng.random((50, 6))
    by_hand = -np.mean([[math.log(p[i, c]) if y[i, c] else math.log(1 - p[i, c]) for c in range(6)] for i in range(50)])
    assert bce(y, p) == pytest.approx(by_hand, rel=1e-12)
    # the prior-only BCE is the mean binary entropy of the class frequencies
    f = y.mean(0)
    assert prior_bce(y) == pytest.approx(np.mean(-(f * np.log(f) + (1 - f) * np.log(1 - f))), rel=1e-9)
    # no better constant exists: nudging any class's constant raises the loss
    for delta in (-0.05, 0.05):
        assert bce(y, np.broadcast_to(np.clip(f + delta, 0.01, 0.99), y.shape)) > prior_bce(y)
    # a class that is always 0 costs nothing (clipped, finite)
    y[:, 0] = 0
    assert np.isfinite(prior_bce(y))


def test_noisy_map_equals_sklearn():
    from sklearn.metrics import average_precision_score

    rng = np.random.default_rng(1)
    y = (rng.random((80, 5)) < 0.25).astype(int)
    y[:, 4] = 0  # no positive: left out, as the test-set evaluation does
    s = rng.random((80, 5))
    expected = np.mean([average_precision_score(y[:, c], s[:, c]) for c in range(4)])
    assert noisy_map(y, s) == pytest.approx(expected, rel=1e-12)


def test_diagnose_reports_peak_lr_and_quantiles():
    cfg = {"lr": 0.02, "lr_gamma": 0.1, "lr_steps": [4], "warmup_iters": 101, "warmup_ratio": 1 / 3, "epochs": 5}
    rates = [lr_at(cfg, e, i, 11) for e in range(5) for i in range(11)]
    y = np.array([[1, 0], [0, 1], [1, 1], [0, 0]])
    scores = {"main": np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.6], [0.1, 0.3]])}
    test = {"main": np.linspace(0, 1, 101).reshape(-1, 1)}
    fit = diagnose(train_cfg=cfg, lr_rates=rates, history=[{"loss": 0.5}], noisy=y, train_scores=scores,
                   test_scores=test)
    # the demo's old ERM: a warm-up of 101 iterations in a 55-iteration run, stepped at iteration 44
    assert fit["lr_peak"] == pytest.approx(0.02 * (1 / 3 + 2 / 3 * 43 / 101))
    assert fit["lr_peak"] < fit["lr_nominal"] and fit["warmup_share"] == 1.0
    h = fit["heads"]["main"]
    assert (h["test_score_p05"], h["test_score_p50"], h["test_score_p95"]) == pytest.approx((0.05, 0.5, 0.95))
    assert h["train_map"] == 1.0 and h["train_bce"] < fit["prior_bce"] and fit["final_loss"] == 0.5


def test_warmup_that_outlasts_the_first_step_is_refused_unless_declared():
    cfg = {"lr": 0.02, "lr_steps": [4], "warmup_iters": 101, "epochs": 5}
    with pytest.raises(NoisyMLTError, match=r"warmup_iters=101 outlasts the 44 iterations before the first lr step"):
        check_warmup(cfg, 11, "method 'erm' on toy")
    check_warmup({**cfg, "long_warmup": True}, 11, "x")  # a reference that does this, declared
    check_warmup(cfg, 31, "x")  # class-aware epochs: 124 iterations before the step
    check_warmup({**cfg, "lr_steps": [], "warmup_iters": 50}, 11, "x")  # no step: it ends within the 55
    with pytest.raises(NoisyMLTError, match="outlasts the 55 iterations of the run"):
        check_warmup({**cfg, "lr_steps": [], "warmup_iters": 56}, 11, "x")


def paper_iterations(resolved: dict, n: int, largest: int, classes: int) -> int:
    """Iterations per epoch of a paper-scale run, from the trainer's own code (the method's streams and
    ``epoch_iterations``) on a label matrix of the dataset's size and largest class count."""
    from noisymlt.methods import load_family
    from noisymlt.methods.base import TrainContext
    from noisymlt.training.schedule import epoch_iterations

    labels = torch.zeros(n, classes)
    labels[torch.arange(n), 1 + torch.arange(n) % (classes - 1)] = 1  # every other class has positives
    labels[:, 0] = 0
    labels[:largest, 0] = 1  # the largest class
    ctx = TrainContext(resolved, labels, {"head": [0], "medium": [], "tail": list(range(1, classes))},
                       torch.device("cpu"), 0)
    method = load_family(resolved["method_cfg"]["family"])(ctx)
    t = resolved["train"]
    return epoch_iterations(t["epoch_length"], method.streams(), n, t["batch_size"])


@pytest.fixture(scope="module")
def paper():
    from pathlib import Path

    from noisymlt.config import load_params

    return load_params(Path(__file__).resolve().parents[1] / "params.yaml")


# Largest class of VOC-MLT / COCO-MLT: clean, and the smallest it gets on the noisy copies (gamma 0.3-0.9,
# seeds 0-4, the project's noise generator on the published subsets): a class-aware epoch shrinks with it.
@pytest.mark.parametrize("dataset,n,classes,clean_largest,noisy_largest",
                         [("voc", 1142, 20, 775, 525), ("coco", 1909, 80, 1128, 776)])
def test_paper_recipes_reach_their_lr(paper, dataset, n, classes, clean_largest, noisy_largest):
    """Every method of the paper grid reaches its lr before the first step at the real epoch lengths, except
    the class-aware [DB] recipe, whose published 500-iteration warm-up runs into the first step on VOC's
    noisy copies: declared (long_warmup) and still at >= 85% of its lr; [DB]'s warm-up on a uniform
    epoch would not be (hence db_random)."""
    for largest in (clean_largest, noisy_largest):
        seen = {}
        for method in paper["grid"]["methods"]:
            r = resolve_run(paper, dataset, method, 0.5, 0)
            iters = paper_iterations(r, n, largest, classes)
            check_warmup(r["train"], iters, f"{method} on {dataset}")
            seen[method] = iters
            t = r["train"]
            peak = max(lr_at(t, e, i, iters) for e in range(t["epochs"]) for i in range(iters))
            assert peak >= (0.85 if r["schedule"] == "db" else 1.0) * t["lr"] - 1e-12, (method, largest)
        assert seen["erm"] == n // 32 and seen["ours"] == n // 32
        assert seen["db_focal"] == int(largest * classes / 4) // 32  # [DB]: one pass over the class-aware sampler
    db = resolve_run(paper, dataset, "db_focal", 0.5, 0)["train"]
    assert db["long_warmup"] is True and db["warmup_iters"] == 500
    if dataset == "voc":  # the declaration is needed: without it the noisy copies are refused
        with pytest.raises(NoisyMLTError, match="never reach"):
            check_warmup({**db, "long_warmup": False}, int(noisy_largest * classes / 4) // 32, "db_focal")
    erm = resolve_run(paper, dataset, "erm", 0.5, 0)["train"]
    with pytest.raises(NoisyMLTError, match="never reach"):
        check_warmup({**erm, "warmup_iters": 500}, n // 32, "erm")


def test_trainer_refuses_the_old_demo_erm_schedule(tiny_toy, tmp_path):
    resolved = resolve_run(tiny_params("erm", epochs=2, lr_steps=[1], warmup_iters=50), "toy", "erm", 0.5, 0)
    with pytest.raises(NoisyMLTError, match="never reach train.lr"):
        toy_trainer(tiny_toy, resolved, tmp_path / "run")
    resolved["train"]["long_warmup"] = True
    toy_trainer(tiny_toy, resolved, tmp_path / "run2")


def test_pseudo_label_changes_are_counted_against_the_clean_labels():
    clean = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1]])
    monitor = NoiseMonitor(clean, {"head": [0], "medium": [1], "tail": [2]}, torch.device("cpu"), iterations=4)
    noisy = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 1]], dtype=torch.float32)
    corrected = torch.tensor([[1, 0, 1], [0, 1, 0], [0, 0, 1]], dtype=torch.float32)
    # row 0: removes 1 (right: clean 0), adds 2 (wrong); row 1: removes 0 (right), adds 1 (right)
    record = PublishedTargets("random", torch.tensor([[0], [1], [2]]), torch.tensor([False] * 3), noisy, corrected)
    monitor.observe(0, 0, [record])
    monitor.observe(0, 1, [PublishedTargets("balanced", torch.tensor([[2]]), torch.tensor([False]),
                                            noisy[2:], noisy[2:].clone())])
    recs = monitor.records()
    got = {(r["branch"], r["targets"]): r for r in recs}
    c = got[("random", "corrected")]
    assert (c["added"], c["added_correct"], c["removed"], c["removed_correct"]) == (2, 1, 2, 2)
    assert "added" not in got[("random", "noisy")]
    assert got[("balanced", "corrected")]["added"] == 0
    summary = pseudo_label_changes("".join(json.dumps(r) + "\n" for r in recs))
    by_branch = {s["branch"]: s for s in summary}
    assert by_branch["random"]["changed"] == 4 and by_branch["random"]["precision"] == 0.75
    assert by_branch["balanced"]["changed"] == 0 and by_branch["balanced"]["precision"] is None


def test_trained_run_records_its_fit(tiny_toy, tmp_path):
    resolved = resolve_run(tiny_params("ours", epochs=2, lr_steps=[2]), "toy", "ours", 0.5, 0)
    trainer = toy_trainer(tiny_toy, resolved, tmp_path / "run", limit_iters=3, clean_labels=tiny_toy["train"])
    trainer.run()
    fit = json.loads((tmp_path / "run" / "manifest.json").read_text())["fit"]
    assert set(fit["heads"]) == {"ensemble", "random", "balanced"}
    noisy = pd.read_parquet(tiny_toy["noisy"])
    assert fit["prior_bce"] == pytest.approx(prior_bce(noisy[trainer.train_table.classes].to_numpy()), abs=1e-6)
    scores = trainer.predict(part="train")
    assert fit["heads"]["random"]["train_bce"] == pytest.approx(bce(trainer.train_table.labels, scores["random"]),
                                                                abs=1e-6)
    assert [(r["epoch"], r["branch"]) for r in fit["pseudo_labels"]] == [
        (1, "balanced"), (1, "random"), (2, "balanced"), (2, "random")]
    for r in fit["pseudo_labels"]:
        batch = resolved["train"]["batch_size" if r["branch"] == "random" else "balanced_batch_size"]
        assert r["anchors"] == 3 * batch
        assert r["added_correct"] <= r["added"] and r["removed_correct"] <= r["removed"]
    # the epoch log's own pseudo-label counts (the method's, per iteration) agree with the monitor's
    history = json.loads((tmp_path / "run" / "manifest.json").read_text())["history"]
    for r in fit["pseudo_labels"]:
        epoch = history[r["epoch"] - 1]
        assert epoch[f"pl_added_{r['branch']}"] * 3 == pytest.approx(r["added"])
        assert epoch[f"pl_removed_{r['branch']}"] * 3 == pytest.approx(r["removed"])


def _results(maps: dict[tuple[str, float, int], float], fit: bool = True) -> pd.DataFrame:
    rows = []
    for (method, gamma, seed), value in maps.items():
        head = "ensemble" if method == "ours" else "main"
        base = {"run_id": f"{method}-{gamma}-{seed}", "dataset": "toy", "method": method, "gamma": gamma,
                "seed": seed, "class_name": None, "git_commit": "c", "git_dirty": False, "code_digest": "d",
                "noisy_labels_sha256": "n", "manifest": "m", "epoch": None}
        rows.append({**base, "head": head, "group": "total", "metric": "mAP", "value": value})
        if fit:
            rows += [{**base, "head": None, "group": "total", "metric": "fit_prior_bce", "value": 0.2},
                     {**base, "head": None, "group": "total", "metric": "fit_lr_peak", "value": 0.02},
                     {**base, "head": None, "group": "total", "metric": "fit_lr_nominal", "value": 0.02},
                     {**base, "head": head, "group": "total", "metric": "fit_train_bce", "value": 0.1 + seed / 100}]
            if method == "ours":
                for epoch in (1, 2):
                    rows += [{**base, "head": "random", "group": "total", "epoch": epoch, "metric": f"fit_pl_{k}",
                              "value": v} for k, v in (("changed", 10 * epoch), ("added_correct", 3 * epoch),
                                                       ("removed_correct", 4 * epoch), ("anchors", 100))]
    return pd.DataFrame(rows).astype({"epoch": "Int64"})


def test_paired_differences_equal_an_independent_computation(tmp_path):
    from scipy import stats

    rng = np.random.default_rng(3)
    maps = {}
    for seed in range(4):
        shared = rng.normal(0.5, 0.1)  # what a seed's noisy labels do to every method
        maps[("ours", 0.5, seed)] = shared + 0.03 + rng.normal(0, 0.005)
        maps[("erm", 0.5, seed)] = shared + rng.normal(0, 0.005)
        maps[("clean_erm", 0.5, seed)] = shared + 0.01 + rng.normal(0, 0.005)
    maps[("erm", 0.5, 9)] = 0.1  # a seed Ours did not run: not paired
    res = _results(maps)
    diffs = paired_differences(res, "ours", "toy", methods=["erm"])
    d = np.array([100 * (maps[("ours", 0.5, s)] - maps[("erm", 0.5, s)]) for s in range(4)])
    mean, ci, n, runs = diffs[("erm", 0.5)]
    assert n == 4 and mean == pytest.approx(d.mean())
    assert ci == pytest.approx(stats.t.ppf(0.975, 3) * d.std(ddof=1) / 2)
    assert [r["seed"] for r in runs] == [0, 1, 2, 3]
    # pairing removes the shared seed effect: far narrower than the unpaired spread
    assert ci < 0.2 * stats.t.ppf(0.975, 3) * np.std([100 * maps[("erm", 0.5, s)] for s in range(4)], ddof=1) / 2
    labels = {"ours": "Ours", "erm": "ERM", "clean_erm": "Clean-ERM"}
    sidecar = write_paired_table(res, tmp_path / "paired.tex", labels, "ours", "toy", ["erm", "clean_erm"],
                                 pairs=[("clean_erm", "erm")])
    md = (tmp_path / "paired.tex").with_suffix(".md").read_text()
    assert f"| Ours − ERM | **{d.mean():.2f} ± {ci:.2f}** |" in md  # CI above 0: bold
    assert sidecar["cells"]["erm/0.5"]["seeds"] == 4
    # a further pair after the reference's rows: the cleaned method minus the one it cleans for, paired alike
    e = np.array([100 * (maps[("clean_erm", 0.5, s)] - maps[("erm", 0.5, s)]) for s in range(4)])
    half = stats.t.ppf(0.975, 3) * e.std(ddof=1) / 2
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| Ours − ERM", "| Ours − Clean-ERM", "| Clean-ERM − ERM"]
    assert f"{e.mean():.2f} ± {half:.2f}" in rows[-1]
    assert sidecar["cells"]["clean_erm-erm/0.5"]["mean"] == pytest.approx(e.mean())
    with pytest.raises(NoisyMLTError, match="no 'ours' runs"):
        paired_differences(res[res["method"] != "ours"], "ours", "toy")


def test_fit_table_summarises_seeds_and_pools_pseudo_label_precision(tmp_path):
    res = _results({("erm", 0.5, 0): 0.4, ("erm", 0.5, 1): 0.5, ("ours", 0.5, 0): 0.6, ("ours", 0.5, 1): 0.7})
    summary = fit_summary(res, "toy")
    erm = summary[summary["method"] == "erm"].iloc[0]
    assert erm["train_bce"] == pytest.approx(0.105) and erm["prior_bce"] == pytest.approx(0.2)
    ours = summary[summary["method"] == "ours"].iloc[0]
    # last epoch (2): per seed 20 changed, 6 + 8 toward the clean label
    assert ours["pl_random_changed"] == 20 and ours["pl_random_precision"] == pytest.approx(14 / 20)
    write_fit_table(res, tmp_path / "fit.tex", {"ours": "Ours", "erm": "ERM"}, "toy")
    md = (tmp_path / "fit.md").read_text()
    assert "| Ours | 0.5 |" in md and "random: 20.0 (70%)" in md
    assert md.count("random:") == 1  # ERM has no pseudo labels: no such column text
    assert "70\\%" in (tmp_path / "fit.tex").read_text()
    with pytest.raises(NoisyMLTError, match="no fit diagnostics"):
        fit_summary(_results({("erm", 0.5, 0): 0.4}, fit=False), "toy")


def test_aggregate_carries_the_manifest_fit_record(tmp_path):
    from fakes import fake_run

    path = fake_run(tmp_path, "ours", 0.5, 0, [0.5, 0.4, 0.3], heads=("ensemble", "random", "balanced"))
    manifest = json.loads(path.with_name("manifest.json").read_text())
    manifest["fit"] = {"prior_bce": 0.23, "final_loss": 0.2, "lr_nominal": 0.02, "lr_peak": 0.02, "warmup_share": 0.3,
                       "heads": {"ensemble": {"train_bce": 0.15, "train_map": 0.6}},
                       "pseudo_labels": [{"epoch": 1, "branch": "random", "anchors": 96, "added": 3,
                                          "added_correct": 2, "removed": 1, "removed_correct": 1, "changed": 4,
                                          "precision": 0.75}]}
    path.with_name("manifest.json").write_text(json.dumps(manifest))
    frame = aggregate([path])
    fit = frame[frame["metric"].str.startswith("fit_")]
    assert fit.loc[fit["metric"] == "fit_prior_bce", "value"].item() == 0.23
    assert fit.loc[fit["metric"] == "fit_prior_bce", "head"].isna().all()
    pl = fit[fit["metric"] == "fit_pl_precision"]
    assert pl["head"].item() == "random" and pl["epoch"].item() == 1 and pl["value"].item() == 0.75
    # the tables read mAP rows only
    assert frame[frame["metric"] == "mAP"]["epoch"].isna().all()


def test_readme_claims_are_paired_differences_and_fit_of_the_results():
    from noisymlt.report.readme import paper_claims, render_claims

    rng = np.random.default_rng(5)
    maps = {}
    for gamma, level in ((0.3, 0.6), (0.9, 0.3)):
        for seed in range(3):
            shared = level + rng.normal(0, 0.05)
            maps[("erm", gamma, seed)] = shared
            maps[("rs", gamma, seed)] = shared + 0.04 + rng.normal(0, 0.002)
            maps[("ours", gamma, seed)] = shared + 0.02 + rng.normal(0, 0.002)
    res = _results(maps)
    labels = {"erm": "ERM", "rs": "RS", "ours": "Ours"}
    claims = paper_claims(res, ["erm", "rs", "ours"], labels, "toy", 0.3)
    ours_rs = next(r for r in claims["ours_minus"] if r["method"] == "rs" and r["gamma"] == 0.3)
    expected = np.mean([100 * (maps[("ours", 0.3, s)] - maps[("rs", 0.3, s)]) for s in range(3)])
    assert ours_rs["mean"] == pytest.approx(round(expected, 2)) and ours_rs["mean"] < 0
    rs_erm = next(r for r in claims["balanced_minus_erm"] if r["gamma"] == 0.9)
    assert rs_erm["reference"] == "rs" and rs_erm["mean"] == pytest.approx(
        round(np.mean([100 * (maps[("rs", 0.9, s)] - maps[("erm", 0.9, s)]) for s in range(3)]), 2))
    drop = {r["method"]: r for r in claims["noise_drop"]["rows"]}
    assert drop["erm"]["mean"] == pytest.approx(
        round(np.mean([100 * (maps[("erm", 0.3, s)] - maps[("erm", 0.9, s)]) for s in range(3)]), 2))
    assert claims["fit"]["runs"] == 18 and claims["fit"]["runs_below_lr"] == 0
    assert claims["fit"]["bce_ratio"]["erm"] == pytest.approx(0.11 / 0.2, abs=1e-3)  # seeds: 0.10, 0.11, 0.12
    assert claims["fit"]["pseudo_labels"]["random"]["precision"] == pytest.approx(0.7)
    text = "\n".join(render_claims(claims, [0.3, 0.9]))
    assert "Here, over the noise rates: 2 of 4 above 0, 2 below, 0 undecided" in text  # Ours above ERM, below RS, at both rates
    assert f"| RS | **{ours_rs['mean']:+.2f} ± {ours_rs['ci95']:.2f}** |" in text
    assert "18 of 18 runs reached their nominal learning rate" in text


def test_readme_claims_say_when_a_branch_got_no_pseudo_labels():
    from noisymlt.report.readme import render_claims

    claims = {"fit": {"gamma": 0.5, "bce_ratio": {"erm": 2.0}, "runs": 3, "runs_below_lr": 1,
                      "pseudo_labels": {"random": {"changed": 0.0, "anchors": 352.0, "precision": float("nan")},
                                        "balanced": {"changed": 61.3, "anchors": 704.0, "precision": 0.83}}}}
    text = "\n".join(render_claims(claims, [0.5]))
    assert "nan" not in text and "2 of 3 runs reached" in text
    assert "changed 0.0 labels of 352 random-branch anchors in the last epoch (mean over seeds)." in text
    assert "changed 61.3 labels of 704 balanced-branch anchors in the last epoch (mean over seeds), 83%" in text


def test_the_fit_report_and_readme_set_clean_runs_beside_their_probe(tmp_path):
    from noisymlt.report.fit import probe_comparison
    from noisymlt.report.readme import paper_claims, render_claims

    maps = {("erm", g, s): 0.6 + s / 100 for g in (0.0, 0.5) for s in range(3)}
    res = _results(maps)
    base = res[(res["gamma"] == 0.0) & (res["metric"] == "mAP")].drop(columns=["metric", "value", "head"])
    probe = base.assign(head=None, metric="fit_probe_map", value=[0.615, 0.605, 0.5])  # seed 0 above ERM's 0.60
    res = pd.concat([res, probe], ignore_index=True)
    rows = probe_comparison(res, "toy")
    assert [(r["seed"], round(r["finetuned"], 2), round(r["probe"], 2)) for r in rows] == [
        (0, 60.0, 61.5), (1, 61.0, 60.5), (2, 62.0, 50.0)]
    write_fit_table(res, tmp_path / "fit.tex", {"erm": "ERM"}, "toy")
    md = (tmp_path / "fit.md").read_text()
    assert "| ERM | 60.0 / 61.5 | 61.0 / 60.5 | 62.0 / 50.0 | 2 of 3 |" in md
    text = "\n".join(render_claims(paper_claims(res, ["erm"], {"erm": "ERM"}, "toy", 0.5), [0.5]))
    assert "ERM is above the probe on 2 of 3 seeds (ERM 60.0 to 62.0 mAP, the probe 50.0 to 61.5" in text


def test_the_readmes_paired_table_heads_the_clean_column_and_judges_the_claim_over_the_noise_rates():
    from noisymlt.report.readme import paper_claims, render_claims

    maps = {}
    for seed in range(3):
        maps[("erm", 0.0, seed)] = 0.70 + seed / 100
        maps[("ours", 0.0, seed)] = 0.60 + seed / 100 + 0.001 * seed ** 2  # far below ERM on clean labels
        maps[("erm", 0.5, seed)] = 0.40 + seed / 100
        maps[("ours", 0.5, seed)] = 0.45 + seed / 100 + 0.001 * seed ** 2  # above ERM at the noise rate
    claims = paper_claims(_results(maps), ["erm", "ours"], {"erm": "ERM", "ours": "Ours"}, "toy", 0.5)
    text = "\n".join(render_claims(claims, [0.0, 0.5]))
    assert "| Ours − | clean | γ = 0.5 |" in text
    assert "Here, over the noise rates: 1 of 1 above 0, 0 below, 0 undecided" in text  # the clean gap is not counted


def test_the_readmes_verdicts_leave_out_an_oracle_that_reads_the_clean_labels():
    """An oracle's cleaning reads the clean labels: an upper bound, shown in the paired table but not counted as a
    baseline Ours should beat, nor as a cleaning a user could run first."""
    from noisymlt.report.readme import paper_claims, render_claims

    maps = {}
    for seed in range(3):
        maps[("erm", 0.5, seed)] = 0.40 + seed / 100
        maps[("clean_erm", 0.5, seed)] = 0.38 + seed / 100 + 0.001 * seed ** 2
        maps[("oracle_erm", 0.5, seed)] = 0.60 + seed / 100 + 0.002 * seed ** 2  # far above Ours
        maps[("ours", 0.5, seed)] = 0.45 + seed / 100 + 0.001 * seed ** 2
    labels = {"erm": "ERM", "clean_erm": "Clean-ERM", "oracle_erm": "Oracle-ERM", "ours": "Ours"}
    methods = list(labels)
    pairs = [("clean_erm", "erm"), ("oracle_erm", "erm")]
    text = "\n".join(render_claims(paper_claims(_results(maps), methods, labels, "toy", 0.5, pairs, ["oracle_erm"]),
                                   [0.5]))
    assert ("Here, over the noise rates and the baselines (Oracle-ERM, which reads the clean labels, apart: an upper "
            "bound): 2 of 2 above 0, 0 below, 0 undecided.") in text
    assert "| Oracle-ERM | **-" in text  # still in the table, below 0
    assert "Ours minus a cleaned method over the noise rates (the oracle apart): 1 of 1 above 0" in text
    counted = "\n".join(render_claims(paper_claims(_results(maps), methods, labels, "toy", 0.5, pairs), [0.5]))
    assert "over the noise rates: 2 of 3 above 0, 1 below" in counted  # without --oracles it would be a baseline
