"""The demo's Ours values come from a committed record of the pipeline's own selection (selection.records): the
record is the selection's stage file, its choice follows from its scores by the stated rule, and the workflow
holds Ours' runs to it."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from noisymlt.config import load_params
from noisymlt.pipeline import selection as S

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "workflow" / "profiles" / "demo"
RECORD = "workflow/profiles/demo/selection_ours.json"


@pytest.fixture(scope="module")
def demo():
    return load_params(REPO / "params.yaml", PROFILE / "params.yaml")


@pytest.fixture(scope="module")
def selecting():
    """The demo with Ours' selection in the run: the layer the record came from."""
    return load_params(REPO / "params.yaml", PROFILE / "params.yaml", PROFILE / "select_ours.yaml")


def test_the_demo_trains_ours_with_the_recorded_choice_and_the_layer_selects_it_in_the_run(demo, selecting):
    assert S.owner(demo, "ours") is None and S.owner(demo, "ours_k3") is None  # no candidates in the demo run
    assert S.recorded_selections(demo, ["erm", "ours", "ours"]) == [("ours", RECORD)]
    assert S.record_mismatch(demo, "ours", REPO / RECORD) is None
    assert S.stages(selecting, "ours") == [["lr"], ["alpha", "beta"]] and S.owner(selecting, "ours_k3") == "ours"
    assert S.recorded_selections(selecting, ["ours"]) == []  # selecting in the run, its own stage files are quoted


def test_the_record_is_a_complete_selection_whose_choice_follows_from_its_scores_by_the_rule(demo, selecting):
    rec = json.loads((REPO / RECORD).read_text())
    block = demo["selection"]
    assert (rec["dataset"], rec["method"], rec["stage"], rec["keys"]) == ("toy", "ours", 2, ["alpha", "beta"])
    assert [(s["gamma"], s["seed"]) for s in rec["sets"]] == S.selection_sets(demo)
    stages = [*rec["earlier_stages"], rec]
    chosen = {}
    for number, stage in enumerate(stages, start=1):
        assert stage["stage"] == number and stage["tie_margin"] == block["tie_margin"]
        assert [c["values"] for c in stage["candidates"]] == [v for _, v in S.candidates(selecting, "ours", number)]
        for c in stage["candidates"]:  # the mean over the sets, as the README quotes it
            assert c["mean"] == pytest.approx(sum(c["scores"].values()) / len(rec["sets"]), abs=1e-3)
            assert sorted(c["scores"]) == [f"g{g:g}_s{s}" for g, s in S.selection_sets(demo)]
        best, tied = S.choose([c["mean"] for c in stage["candidates"]], [c["values"] for c in stage["candidates"]],
                              block)
        assert stage["candidates"][best]["tag"] == stage["winner"]
        assert sorted(stage["candidates"][i]["tag"] for i in tied) == sorted(stage["tied"])
        chosen.update(stage["candidates"][best]["values"])
    assert chosen == rec["chosen"] == {"lr": 0.02, "alpha": 0.7, "beta": 0.1}


@pytest.mark.parametrize("change, says", [
    (lambda p, rec: p["train"].update(lr=0.08), "chose lr 0.02 where ours's runs train with 0.08"),
    (lambda p, rec: rec["chosen"].update(beta=0.3), "chose beta 0.3 where ours's runs train with 0.1"),
    (lambda p, rec: p["selection"].update(tie_margin=2.9), "tie margin 8.5, this selection's is 2.9"),
    (lambda p, rec: p["selection"].update(seeds=[0]), "on the sets [(0.5, 0), (0.5, 1)], this selection's are [(0.5, 0)]"),
    (lambda p, rec: rec.update(method="db"), "records the selection of 'db', not 'ours'"),
])
def test_a_record_that_is_not_the_runs_choice_is_refused_with_the_reason(demo, tmp_path, change, says):
    params, rec = copy.deepcopy(demo), json.loads((REPO / RECORD).read_text())
    change(params, rec)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(rec))
    assert says in S.record_mismatch(params, "ours", path)


def test_snakemake_refuses_a_record_that_ours_does_not_train_with_naming_the_file(tmp_path):
    from helpers import SNAKEMAKE, project_copy

    wf = project_copy(tmp_path)
    rec = json.loads((REPO / RECORD).read_text())
    rec["chosen"]["alpha"] = 0.9
    (wf / "other.json").write_text(json.dumps(rec))
    (wf / "layer.yaml").write_text(yaml.safe_dump({"selection": {"records": {"ours": "other.json"}}}))
    proc = subprocess.run([SNAKEMAKE, "-n", "--profile", "workflow/profiles/demo", "--configfile",
                           "workflow/profiles/demo/params.yaml", "layer.yaml"], cwd=wf, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert ("noisymlt: other.json (selection.records.ours): chose alpha 0.9 where ours's runs train with 0.7"
            in proc.stdout + proc.stderr)
    # the committed record passes: the demo plans its runs and no candidate
    proc = subprocess.run([SNAKEMAKE, "-n", "--profile", "workflow/profiles/demo", "--quiet", "rules"], cwd=wf,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "train_candidate" not in proc.stdout and "readme_numbers" in proc.stdout
