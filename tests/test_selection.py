"""Model selection (noisymlt.pipeline.selection): the held-out split, the noisy-only parts, the choice, how a choice enters
a final run's config, and that no selection path reads the test set or a clean label."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from noisymlt.data.labels import CLEAN_PREFIX, LabelTable, read_labels, write_labels
from noisymlt.data.noise import make_noisy_table
from noisymlt.errors import NoisyMLTError
from noisymlt.pipeline import selection as S
from noisymlt.config import load_params, resolve_run, validate_params
from noisymlt.core.manifest import run_id
from noisymlt.core.schema import ParamsError

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


@pytest.fixture(scope="module")
def two_sets(tiny_toy, tmp_path_factory):
    """Two noisy copies of the tiny toy subset, as two selection sets."""
    base = tmp_path_factory.mktemp("sets")
    make_noisy_table(tiny_toy["train"], 0.3, 1, base / "g0.3_s1.parquet")
    return {"g0.5_s0": tiny_toy["noisy"], "g0.3_s1": base / "g0.3_s1.parquet"}


def test_split_is_deterministic_stratified_and_disjoint_from_the_test_set(tiny_toy, two_sets, tmp_path):
    first = S.write_split(two_sets, tmp_path / "a.json", 0.2, 0)
    again = S.write_split(two_sets, tmp_path / "b.json", 0.2, 0)
    other = S.write_split(two_sets, tmp_path / "c.json", 0.2, 1)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert first["val_image_ids"] != other["val_image_ids"]  # the seed draws the rows
    train_ids = read_labels(tiny_toy["train"]).image_ids
    test_ids = set(read_labels(tiny_toy["test"]).image_ids)
    val = set(first["val_image_ids"])
    assert val < set(train_ids) and not val & test_ids
    n = len(train_ids)
    assert first["images"] == {"fit": n - len(val), "val": len(val)}
    assert 0.2 <= len(val) / n < 0.35  # every class's share, rounded up for rare classes
    for name, path in two_sets.items():  # every class keeps noisy positives on both sides, in every set
        noisy = read_labels(path)
        is_val = np.isin(noisy.image_ids, list(val))
        assert (noisy.labels[is_val].sum(0) >= 1).all() and (noisy.labels[~is_val].sum(0) >= 1).all(), name
        assert first["positives"][name]["val"] == noisy.labels[is_val].sum(0).tolist()


def test_split_records_the_classes_it_cannot_put_on_both_sides():
    """A class with fewer than two noisy positives cannot be validated; the split says which (the validation
    mAP leaves it out, as evaluation leaves out a class without test positives) and splits the others."""
    y = np.zeros((10, 3), np.uint8)
    y[:, 0] = 1
    y[:5, 1] = 1
    y[7, 2] = 1  # one positive
    val, unsplit = S.stratified_split([y, y[:, [1, 0, 2]]], 0.2, 0)
    assert unsplit == [[2], [2]]
    for c in (0, 1):
        assert y[val, c].any() and y[~val, c].any()


def test_parts_are_the_noisy_labels_cut_by_the_split(two_sets, tmp_path):
    S.write_split(two_sets, tmp_path / "split.json", 0.2, 0)
    S.write_parts(two_sets["g0.5_s0"], tmp_path / "split.json", tmp_path / "fit.parquet", tmp_path / "val.parquet")
    noisy = read_labels(two_sets["g0.5_s0"])
    fit, val = read_labels(tmp_path / "fit.parquet"), read_labels(tmp_path / "val.parquet")
    assert fit.clean is None and val.clean is None  # no clean_* column in either part
    assert not any(c.startswith(CLEAN_PREFIX) for c in pq.read_schema(tmp_path / "val.parquet").names)
    assert sorted(fit.image_ids + val.image_ids) == sorted(noisy.image_ids) and not set(fit.image_ids) & set(val.image_ids)
    rows = {i: r for r, i in enumerate(noisy.image_ids)}
    for part in (fit, val):
        assert np.array_equal(part.labels, noisy.labels[[rows[i] for i in part.image_ids]])
        assert part.paths == [noisy.paths[rows[i]] for i in part.image_ids]


def test_selection_reads_neither_clean_labels_nor_the_test_set(tiny_toy, two_sets, tmp_path, monkeypatch):
    """Content: scrambled clean_* columns change no selection output. Access: every Parquet read of the split
    and parts steps leaves the clean columns out and no step opens the test table or the clean subset."""
    scrambled = {}
    for name, path in two_sets.items():
        frame = pd.read_parquet(path)
        clean = [c for c in frame.columns if c.startswith(CLEAN_PREFIX)]
        frame[clean] = 1 - frame[clean].to_numpy()
        scrambled[name] = tmp_path / f"{name}.parquet"
        frame.to_parquet(scrambled[name], index=False)
    outputs = {}
    for label, sets in (("original", two_sets), ("scrambled", scrambled)):
        out = tmp_path / label
        S.write_split(sets, out / "split.json", 0.2, 0)
        S.write_parts(sets["g0.5_s0"], out / "split.json", out / "fit.parquet", out / "val.parquet")
        outputs[label] = (json.loads((out / "split.json").read_text()),
                          read_labels(out / "fit.parquet").labels, read_labels(out / "val.parquet").labels)
    split_a, split_b = outputs["original"][0], outputs["scrambled"][0]
    assert split_a["val_image_ids"] == split_b["val_image_ids"] and split_a["positives"] == split_b["positives"]
    assert all(np.array_equal(a, b) for a, b in zip(outputs["original"][1:], outputs["scrambled"][1:]))

    reads = []
    real_read_table = pq.read_table

    def recording(source, *args, columns=None, **kwargs):
        reads.append((str(source), columns))
        return real_read_table(source, *args, columns=columns, **kwargs)

    monkeypatch.setattr(pq, "read_table", recording)
    S.write_split(two_sets, tmp_path / "again.json", 0.2, 0)
    S.write_parts(two_sets["g0.5_s0"], tmp_path / "again.json", tmp_path / "f.parquet", tmp_path / "v.parquet")
    assert reads and all(columns is not None and not any(c.startswith(CLEAN_PREFIX) for c in columns)
                         for _, columns in reads)
    forbidden = {str(tiny_toy["test"]), str(tiny_toy["train"])}
    assert not forbidden & {source for source, _ in reads}


def test_no_selection_job_of_the_workflow_names_a_test_or_clean_label_file(tmp_path):
    """The demo's plan with Ours' selection in the run (the layer its record came from): the split, parts,
    candidate and select jobs read noisy tables, their parts and the candidates' own files, never the test table,
    the clean subset or a final run's clean-label log."""
    from helpers import project_copy

    wf = project_copy(tmp_path)
    proc = subprocess.run([SNAKEMAKE, "--profile", "workflow/profiles/demo", "-n", "--printshellcmds", "--configfile",
                           "workflow/profiles/demo/params.yaml", "workflow/profiles/demo/select_ours.yaml"], cwd=wf,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    blocks = re.split(r"\n(?=(?:local)?(?:rule|checkpoint) \w+:)", proc.stdout)
    selection_rules = {"select_split", "select_parts", "cache_select_images", "train_candidate", "select"}
    seen = set()
    for block in blocks:
        m = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block.strip())
        if not m or m.group(1) not in selection_rules:
            continue
        seen.add(m.group(1))
        for forbidden in ("test_labels.parquet", "train_labels.parquet", "cache/test.npy", "--clean-labels"):
            assert forbidden not in block, (m.group(1), forbidden, block[:1500])
    assert seen == selection_rules


def _fake_stage(root: Path, params: dict, method: str, stage: int, scorer) -> None:
    for tag, values in S.candidates(params, method, stage):
        for gamma, seed in S.selection_sets(params):
            path = root / S.candidate_dir("toy", method, stage, gamma, seed, tag) / "metrics.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            score = scorer(values, gamma, seed)
            path.write_text(json.dumps({"run_id": tag, "heads": {
                "ensemble": {"map": {"total": score}}, "random": {"map": {"total": 0.99}}}}))


def _selection_params(**selection) -> dict:
    params = load_params(REPO / "params.yaml")
    params["selection"].update(selection)
    return params


def test_choose_takes_the_best_mean_score_and_breaks_ties_by_grid_order(tmp_path):
    params = _selection_params(gammas=[0.5, 0.7], seeds=[0])
    # known scorer: lr 0.08 best on average although 0.14 wins at gamma 0.5; the ensemble head is the one ranked
    scores = {0.02: (0.30, 0.30), 0.08: (0.40, 0.38), 0.14: (0.45, 0.20), 0.2: (0.10, 0.10)}
    _fake_stage(tmp_path, params, "ours", 1, lambda v, g, s: scores[v["lr"]][0 if g == 0.5 else 1])
    rec = S.select_stage(params, "toy", "ours", 1, tmp_path)
    assert rec["chosen"] == {"lr": 0.08} and rec["winner"] == "lr0.08"
    assert [c["mean"] for c in rec["candidates"]] == [30.0, 39.0, 32.5, 10.0]
    assert "ensemble head" in rec["metric"]
    # stage 2 at the chosen lr: alpha 0.8 / 0.7 tie with beta 0.2 at 0.01 points (differences below 0.005 points
    # are ties); params.yaml prefers the references' alpha 0.7, so it wins although the grid lists 0.8 first
    tie = {(0.8, 0.2): 0.50001, (0.7, 0.2): 0.50003}
    _fake_stage(tmp_path, params, "ours", 2, lambda v, g, s: tie.get((v["alpha"], v["beta"]), 0.2))
    rec2 = S.select_stage(params, "toy", "ours", 2, tmp_path, tmp_path / S.choice_file("toy", "ours", 1))
    assert rec2["chosen"] == {"lr": 0.08, "alpha": 0.7, "beta": 0.2}
    assert rec2["tied"] == ["alpha0.8_beta0.2", "alpha0.7_beta0.2"] and rec2["tie_margin"] == 0
    assert "references' values (alpha 0.7, beta 0.1)" in rec2["tie_rule"]
    assert rec2["previous"] == {"lr": 0.08} and rec2["earlier_stages"][0]["winner"] == "lr0.08"
    choice = json.loads((tmp_path / S.choice_file("toy", "ours", 2)).read_text())
    assert choice["chosen"] == rec2["chosen"] and "candidates" not in choice  # the choice only


AB = [{"alpha": a, "beta": b} for a in (0.9, 0.8, 0.7) for b in (0.1, 0.2, 0.3, 0.4)]  # params.yaml's grid order


def test_near_ties_within_the_margin_go_to_the_references_values_then_grid_order():
    """Candidates closer than tie_margin are tied; among them the fewest departures from `prefer` win, then the
    grid order. Scores: the demo's alpha x beta stage of the AMD EPYC (bf16) demo of ad52e32."""
    amd = dict(zip([(v["alpha"], v["beta"]) for v in AB],
                   [29.30, 29.33, 30.68, 29.85, 29.44, 29.38, 30.85, 30.17, 29.67, 29.62, 30.97, 30.39]))
    scores = [amd[(v["alpha"], v["beta"])] for v in AB]
    prefer = {"alpha": 0.7, "beta": 0.1}
    win, tied = S.choose(scores, AB, {"tie_margin": 0.0, "prefer": prefer})
    assert AB[win] == {"alpha": 0.7, "beta": 0.3} and len(tied) == 1  # no tie: the best score
    win, tied = S.choose(scores, AB, {"tie_margin": 0.5, "prefer": prefer})
    # 30.97, 30.85, 30.68 tie; alpha 0.7 is the references' value
    assert [AB[i] for i in tied] == [{"alpha": 0.9, "beta": 0.3}, {"alpha": 0.8, "beta": 0.3}, {"alpha": 0.7, "beta": 0.3}]
    assert AB[win] == {"alpha": 0.7, "beta": 0.3}
    win, _ = S.choose(scores, AB, {"tie_margin": 1.3, "prefer": prefer})
    assert AB[win] == {"alpha": 0.7, "beta": 0.1}  # the references' own values, 1.30 below the best
    win, _ = S.choose(scores, AB, {"tie_margin": 0.5})
    assert AB[win] == {"alpha": 0.9, "beta": 0.3}  # no preference: the first tied in grid order
    # the Intel Xeon (AMX) reading of issue 36: alpha 0.7 and 0.8 at beta 0.1 both 32.86; grid order alone took 0.8
    two = [{"alpha": 0.8, "beta": 0.1}, {"alpha": 0.7, "beta": 0.1}]
    assert S.choose([32.86, 32.86], two, {"tie_margin": 0.0})[0] == 0
    assert S.choose([32.86, 32.86], two, {"tie_margin": 0.0, "prefer": prefer})[0] == 1


def test_choose_refuses_a_missing_candidate(tmp_path):
    params = _selection_params()
    with pytest.raises(NoisyMLTError, match=r"stage1/g0\.5/s0/lr0\.02/metrics\.json: cannot read"):
        S.select_stage(params, "toy", "ours", 1, tmp_path)


def test_a_choice_enters_the_final_config_and_its_run_id():
    """The chosen values are the last layer of a run's resolution (config.resolve_run's `chosen`), not a patch
    applied to a resolved config from above."""
    params = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml",
                         REPO / "workflow/profiles/demo/select_ours.yaml")
    base = resolve_run(params, "toy", "ours", 0.5, 0)
    path = "runs/toy/select/ours/stage2.choice.json"
    cfg = resolve_run(params, "toy", "ours", 0.5, 0, chosen={"lr": 0.08, "alpha": 0.8, "beta": 0.3}, chosen_by=path)
    assert cfg["train"]["lr"] == 0.08 and cfg["selected"] == {"values": {"lr": 0.08, "alpha": 0.8, "beta": 0.3},
                                                              "by": path}
    assert cfg["method_cfg"]["pseudo"]["thresholds"] == {
        b: {"alpha": {"head": 0.8}, "beta": {"tail": 0.3}} for b in ("random", "balanced")}
    assert run_id(cfg) != run_id(base)
    assert run_id(resolve_run(params, "toy", "ours", 0.5, 0, chosen={"lr": 0.08, "alpha": 0.8, "beta": 0.4},
                              chosen_by=path)) != run_id(cfg)
    assert resolve_run(params, "toy", "ours", 0.5, 0) == base  # resolving with a choice changed nothing shared
    # an ablation without pseudo labels takes Ours' lr only; a method set to null keeps its fixed values
    no_pl = resolve_run(params, "toy", "ours_no_pseudo", 0.5, 0, chosen=cfg["selected"]["values"], chosen_by=path)
    assert no_pl["selected"]["values"] == {"lr": 0.08} and "thresholds" not in (no_pl["method_cfg"].get("pseudo") or {})
    assert S.owner(params, "ours_no_pseudo") == "ours" and S.owner(params, "erm") is None
    assert S.final_choice_file(params, "toy", "ours_k3") == path
    assert resolve_run(params, "toy", "erm", 0.5, 0, chosen={}) == resolve_run(params, "toy", "erm", 0.5, 0)
    # a candidate: its values, and a warm-up that keeps its share of the run on the fit part
    cand = resolve_run(params, "toy", "ours", 0.5, 0, chosen={"lr": 0.2}, candidate=True)
    assert cand["selected"] == {"values": {"lr": 0.2}, "by": "candidate"}
    assert cand["train"]["lr"] == 0.2 and cand["train"]["warmup_iters"] == round(base["train"]["warmup_iters"] * 0.8)
    assert cand["candidate"] == {"held_out": 0.2, "split_seed": 0}


def test_the_selected_thresholds_are_the_ones_the_method_applies(tiny_toy):
    """The pseudo-label vectors Ours builds from a chosen alpha / beta: alpha on head classes, beta on tail ones."""
    from helpers import tiny_params
    from noisymlt.data.labels import read_class_split
    from noisymlt.methods import load_family
    from noisymlt.methods.base import TrainContext
    from noisymlt.methods.pseudo_labels import ALPHA_OFF, BETA_OFF

    import torch

    params = tiny_params("ours")
    cfg = resolve_run(params, "toy", "ours", 0.5, 0, chosen={"alpha": 0.8, "beta": 0.3}, chosen_by="x")
    split = read_class_split(tiny_toy["split"])
    noisy = torch.as_tensor(read_labels(tiny_toy["noisy"]).labels, dtype=torch.float32)
    method = load_family("colearning")(TrainContext(cfg, noisy, split, torch.device("cpu"), 0))
    for branch in ("random", "balanced"):
        alpha, beta = method.thresholds[branch]
        assert (alpha[split["head"]] == 0.8).all() and (alpha[split["tail"]] == ALPHA_OFF).all()
        assert (beta[split["tail"]] == 0.3).all() and (beta[split["head"]] == BETA_OFF).all()


@pytest.mark.parametrize("layer, key, message", [
    ({"methods": {"nope": [["lr"]]}}, "selection.methods.nope", "no method is called"),
    ({"methods": {"erm": [["alpha"]]}}, "selection.methods.erm.0", "no pseudo labels"),
    ({"methods": {"ours": [["lr"], ["lr", "beta"]]}}, "selection.methods.ours.1", "selected in two stages"),
    ({"methods": {"ours_k3": {"same_as": "erm_x"}}}, "selection.methods.ours_k3.same_as", "unknown method"),
    ({"methods": {"ours_k3": {"same_as": "ours_k4"}}}, "selection.methods.ours_k3.same_as", "another method's"),
    ({"grids": {"beta": [0.1, 1.0]}}, "selection.grids.beta.1", "maximum"),
    ({"held_out": 0.7}, "selection.held_out", "maximum"),
    ({"methods": {"erm": [["momentum"]]}}, "selection.methods.erm", ""),
])
def test_bad_selection_settings_name_their_key(layer, key, message):
    from noisymlt.config import deep_merge

    params = deep_merge(load_params(REPO / "params.yaml"), {"selection": layer})
    with pytest.raises(ParamsError) as err:
        validate_params(params)
    assert err.value.key.startswith(key) and message in err.value.detail, (err.value.key, err.value.detail)


def test_a_variant_of_a_method_that_selects_nothing_keeps_its_fixed_values():
    from noisymlt.config import deep_merge

    params = deep_merge(load_params(REPO / "params.yaml"), {"selection": {"methods": {"ours": None}}})
    validate_params(params)
    assert S.owner(params, "ours_k3") is None and S.final_choice_file(params, "voc", "ours_k3") is None


def test_selection_off_keeps_every_fixed_value():
    params = load_params(REPO / "params.yaml")
    params["selection"]["enabled"] = False
    assert all(S.owner(params, m) is None and S.stages(params, m) == [] for m in params["methods"])
    assert yaml.safe_load((REPO / "params.yaml").read_text())["selection"]["enabled"] is True


def test_a_variant_reads_no_choice_when_none_of_its_owners_values_apply():
    # Found by the smoke profile, where Ours selects alpha x beta only: a `same_as: ours` variant without pseudo
    # labels has none of those values, so it reads no choice (it trained with a --selection it could not hold).
    params = load_params(REPO / "params.yaml")
    assert S.owner(params, "ours_stitch_image_concat") == "ours"  # Ours selects lr too: that value applies
    params["selection"]["methods"]["ours"] = [["alpha", "beta"]]
    assert S.owner(params, "ours_stitch_image_concat") is None
    assert S.final_choice_file(params, "voc", "ours_stitch_image_concat") is None
    assert S.owner(params, "ours_self") == "ours"  # pseudo labels on: alpha and beta apply
    assert S.final_choice_file(params, "voc", "ours_self") == "runs/voc/select/ours/stage1.choice.json"
