"""The clean column (grid.clean_methods): runs at noise rate 0 for the listed methods at every grid dataset and
seed, their noisy sets (copies of the clean labels) drawn by the paper's noise command, a column headed "clean" in the
main tables, and the README's noise-rate statements kept over the noise rates alone."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from noisymlt.config import ParamsError, load_params, validate_params as validate
from noisymlt.data.noise import inject_noise
from noisymlt.pipeline import paths

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def demo() -> dict:
    return load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml")


def with_clean(params: dict, methods: list[str]) -> dict:
    params = copy.deepcopy(params)
    params["grid"]["clean_methods"] = methods
    return params


def test_clean_runs_follow_the_grid_at_every_seed_and_nowhere_else(demo):
    noisy = copy.deepcopy(demo)
    noisy["grid"].pop("clean_methods", None)
    params = with_clean(noisy, ["erm", "db_focal"])
    runs = paths.grid_runs(params)
    assert runs[:len(paths.grid_runs(noisy))] == paths.grid_runs(noisy)  # the noisy grid first, unchanged
    clean = [r for r in runs if r[1] == 0.0]
    assert clean == [("toy", 0.0, s, m, "cooccurrence") for s in demo["grid"]["seeds"] for m in ("erm", "db_focal")]
    assert paths.run_dir(*clean[0]) == "runs/toy/g0.0/s0/erm"
    assert set(paths.all_runs(params)) - set(paths.all_runs(noisy)) == set(clean)
    assert not [r for r in paths.grid_runs(noisy) if r[1] == 0.0]  # absent key: no clean run
    # the demo trains the clean column of issue 37
    assert {r.method for r in paths.grid_runs(demo) if r.gamma == 0.0} == {"erm", "rs", "db_focal", "ldam", "ours"}


def test_the_clean_noisy_sets_are_the_noise_commands_at_rate_zero(demo):
    params = with_clean(demo, ["erm"])
    sets = sorted({(r.dataset, r.gamma, r.seed) for r in paths.all_runs(params) if r.gamma == 0.0})
    assert sets == [("toy", 0.0, s) for s in demo["grid"]["seeds"]]
    for dataset, gamma, seed in sets:  # the words the noise rule runs for the set (paths.noise_argv)
        assert paths.noise_argv(params, dataset, gamma, seed, "cooccurrence") == [
            "noise", "--labels", "data/toy/train_labels.parquet", "--gamma", "0.0", "--seed", str(seed), "--out",
            f"data/toy/noisy/g0.0_s{seed}.parquet", "--stats", f"data/toy/noisy/g0.0_s{seed}.json"]
    noisy = copy.deepcopy(demo)
    noisy["grid"].pop("clean_methods", None)
    assert not [r for r in paths.all_runs(noisy) if r.gamma == 0.0]


def test_the_clean_set_is_the_clean_labels():
    rng = np.random.default_rng(0)
    clean = (rng.random((60, 6)) < 0.3).astype(np.int64)
    clean[:, 0] = 1
    noisy, info = inject_noise(clean, 0.0, 3)
    assert np.array_equal(noisy, clean) and not info["flipped"].any()


def test_clean_methods_are_checked(demo):
    with pytest.raises(ParamsError, match="grid.clean_methods.*not in grid.methods"):
        validate(with_clean({**demo, "grid": {**demo["grid"], "methods": ["erm", "ours"]}}, ["db_focal"]), "p.yaml")
    with pytest.raises(ParamsError, match="unknown method 'nope'"):
        validate(with_clean(demo, ["nope"]), "p.yaml")
    zero = copy.deepcopy(demo)
    zero["grid"]["gammas"] = [0.0, 0.5]
    with pytest.raises(ParamsError, match="clean_methods instead"):
        validate(zero, "p.yaml")


def _results(rows: list[tuple[str, float, int, float]]) -> pd.DataFrame:
    out = []
    for method, gamma, seed, value in rows:
        base = {"run_id": f"{method}-{gamma}-{seed}", "dataset": "toy", "method": method, "gamma": gamma,
                "seed": seed, "class_name": None, "git_commit": "c", "git_dirty": False, "code_digest": "d",
                "noisy_labels_sha256": "n", "manifest": "m", "epoch": None, "head": "main", "metric": "mAP"}
        out += [{**base, "group": g, "value": value} for g in ("total", "head", "medium", "tail")]
    return pd.DataFrame(out).astype({"epoch": "Int64"})


def test_the_main_tables_head_the_clean_column_clean(tmp_path):
    from noisymlt.report.tables import write_groups_table, write_table

    rows = [(m, g, s, v + s / 100) for m, v in (("erm", 0.5), ("db", 0.6)) for g in (0.0, 0.3, 0.5) for s in (0, 1)]
    results = _results([r for r in rows if not (r[0] == "db" and r[1] == 0.0)])  # db has no clean run
    write_table(results, tmp_path / "t.tex", {"erm": "ERM", "db": "DB"})
    md = (tmp_path / "t.md").read_text()
    assert "| Method | Toy-MLT-Noise clean | Toy-MLT-Noise 0.3 | Toy-MLT-Noise 0.5 |" in md
    assert "| DB | -- |" in md  # a method without a clean run: a dash, not a gap
    assert "Noise rate~$\\gamma$ & clean & 0.3 & 0.5" in (tmp_path / "t.tex").read_text()
    write_groups_table(results, tmp_path / "g.tex", {"erm": "ERM", "db": "DB"}, "toy")
    assert "head (clean)" in (tmp_path / "g.md").read_text() and "head (γ=0.3)" in (tmp_path / "g.md").read_text()


def test_the_readmes_middle_noise_rate_and_noise_drop_skip_the_clean_column(monkeypatch):
    from noisymlt.report import readme
    from noisymlt.report.readme import demo_numbers

    # the sentinel runs and the numerics fingerprint read run manifests, which these made-up results have not
    monkeypatch.setattr(readme, "sentinel_record", lambda *a: {})
    monkeypatch.setattr(readme, "run_numerics", lambda *a: {})

    rows = [(m, g, s, 0.5 - g / 2 + s / 100) for m in ("erm", "ours") for g in (0.3, 0.5, 0.7, 0.9) for s in (0, 1)]
    noisy_only = demo_numbers(_results(rows), ["erm", "ours"], {"erm": "ERM", "ours": "Ours"})
    with_clean_rows = demo_numbers(_results(rows + [("erm", 0.0, s, 0.8) for s in (0, 1)]), ["erm", "ours"],
                                   {"erm": "ERM", "ours": "Ours"})
    assert noisy_only["middle_gamma"] == with_clean_rows["middle_gamma"] == 0.5
    assert with_clean_rows["gammas"] == [0.0, 0.3, 0.5, 0.7, 0.9]
    drop = with_clean_rows["claims"]["noise_drop"]
    assert (drop["from"], drop["to"]) == (0.3, 0.9) and drop == noisy_only["claims"]["noise_drop"]
