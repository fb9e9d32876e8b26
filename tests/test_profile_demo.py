"""Every method trained alike in the demo: whatever the demo profile sets differently between two methods must
differ between them at paper scale too (params.yaml: the references' own recipes, [DB] vs [CL]). A per-family
value the references do not have (a new-layer lr factor for some recipes only, another epoch count for one sampler)
is a difference of treatment the comparison would then measure."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from noisymlt.config import load_params, resolve_run

REPO = Path(__file__).resolve().parents[1]


def per_family_exceptions(paper: dict, demo: dict, demo_dataset: str, paper_dataset: str = "voc") -> list[str]:
    """'key: a x vs b y' for each train key and method pair the demo treats differently while the paper does not."""
    methods = demo["grid"]["methods"]
    at_paper = {m: resolve_run(paper, paper_dataset, m, 0.5, 0)["train"] for m in methods}
    in_demo = {m: resolve_run(demo, demo_dataset, m, 0.5, 0)["train"] for m in methods}
    found = []
    for key in sorted(set().union(*map(set, in_demo.values()))):
        for a, b in itertools.combinations(methods, 2):
            if in_demo[a].get(key) != in_demo[b].get(key) and at_paper[a].get(key) == at_paper[b].get(key):
                found.append(f"{key}: {a} {in_demo[a].get(key)!r} vs {b} {in_demo[b].get(key)!r} "
                             f"(paper scale: both {at_paper[a].get(key)!r})")
    return found


def test_the_check_finds_a_factor_given_to_one_recipe_only():
    paper = load_params(REPO / "params.yaml")
    demo = load_params(REPO / "params.yaml")
    demo["schedules"]["db"]["train"] = {**demo["schedules"]["db"]["train"], "new_layers_lr_mult": 10}
    found = per_family_exceptions(paper, demo, "voc")
    assert found and all(line.startswith("new_layers_lr_mult:") for line in found)
    assert per_family_exceptions(paper, load_params(REPO / "params.yaml"), "voc") == []


# The one setting the demo chooses per recipe, by one rule for every recipe: the epoch count (and the lr steps at
# the same share of it), the shortest of the paper's 8 x {1, 2, 3} at which the recipe's representative trained on
# the clean labels does better than the frozen-trunk probe on every seed (experiments/probe_vs_finetune/schedule.json)
BY_RULE = ("epochs", "lr_steps")
SCHEDULE = REPO / "experiments/probe_vs_finetune/schedule.json"


def test_the_demo_profile_has_no_per_family_exception():
    paper = load_params(REPO / "params.yaml")
    demo = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml")
    assert [line for line in per_family_exceptions(paper, demo, "toy") if line.split(":")[0] not in BY_RULE] == []


def test_each_recipes_epochs_are_the_shortest_that_pass_the_probe():
    """The demo's epochs per recipe follow the rule the profile states, on the runs schedule.json holds: every
    shorter schedule tried left the representative at or below the probe on some seed, the chosen one put it above
    on all five; and the lr steps sit at the paper's 5/8 and 7/8 of the run."""
    import json

    demo = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml")
    sweep = json.loads(SCHEDULE.read_text())
    passes: dict[str, dict[int, bool]] = {}
    for tag, rec in sweep.items():
        runs = rec["runs"].values()
        assert len(runs) == 5, tag
        epochs = int(dict(item.split("=", 1) for item in rec["set"])["epochs"])
        passes.setdefault(rec["method"], {})[epochs] = all(r["finetuned_map"]["main"] > r["probe_map"] for r in runs)
    for method, by_epochs in passes.items():
        train = resolve_run(demo, "toy", method, 0.5, 0)["train"]
        assert by_epochs[train["epochs"]], method
        assert not any(ok for e, ok in by_epochs.items() if e < train["epochs"]), method
        assert set(range(8, train["epochs"], 8)) <= set(by_epochs), method  # every shorter multiple of 8 was tried
        assert train["lr_steps"] == [train["epochs"] * 5 // 8, train["epochs"] * 7 // 8]
    # every method of a recipe trains as its representative does
    for method in demo["grid"]["methods"]:
        recipe = demo["methods"][method].get("schedule", "cl")
        rep = {"db": "db_focal"}.get(recipe, "erm")
        assert resolve_run(demo, "toy", method, 0.5, 0)["train"]["epochs"] == \
            resolve_run(demo, "toy", rep, 0.5, 0)["train"]["epochs"], method


def test_the_demo_runs_on_every_core_and_each_run_asks_for_its_measured_peak_memory():
    """The profile fixes no core count; each train job holds at least the largest peak measured for a demo run
    (scripts/benchmark_demo_memory.py, every method of the grid; a cleaned one as the method it retrains), and `make demo` gives Snakemake the machine's
    available memory: runs at once = min(cores, memory / peak)."""
    import json
    import subprocess

    import yaml

    profile = yaml.safe_load((REPO / "workflow/profiles/demo/config.yaml").read_text())
    measured = json.loads((REPO / "docs/benchmarks/demo_memory.json").read_text())
    demo = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml")
    assert profile["cores"] == "all"
    # a clean-then-retrain method trains its `of` method's recipe on a table of the same size: measured as that one
    plain = {m for m in demo["grid"]["methods"] if not demo["methods"][m].get("clean")}
    assert set(measured["methods"]) == plain
    assert all(demo["methods"][m]["clean"]["of"] in plain for m in set(demo["grid"]["methods"]) - plain)
    largest = max(row["peak_rss_mib"] for row in measured["methods"].values())
    assert largest == measured["largest_peak_rss_mib"]
    for rule in ("train", "train_candidate", "train_fold"):
        assert profile["set-resources"][rule]["mem_mb"] >= largest, rule
    mem_mb = profile["set-resources"]["train"]["mem_mb"]  # docs/demo.md's example follows the profile's request
    page = " ".join((REPO / "docs/demo.md").read_text().split())
    assert f"at {mem_mb}, 8 cores and 8 GiB run {min(8, 8 * 1024 // mem_mb)}." in page
    plan = subprocess.run(["make", "-n", "demo", "DEMO_MEM_MB=4321"], cwd=REPO, capture_output=True, text=True)
    assert "snakemake --profile workflow/profiles/demo --resources mem_mb=4321" in plan.stdout, plan.stdout
