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


@pytest.mark.xfail(strict=True, reason="issue 37: the demo profile gives the db recipe 1x new-layer lr and other "
                                      "epoch counts than the uniform recipes; it moves to one treatment with its "
                                      "regenerated numbers (strict: this marker must go when it passes)")
def test_the_demo_profile_has_no_per_family_exception():
    paper = load_params(REPO / "params.yaml")
    demo = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml")
    assert per_family_exceptions(paper, demo, "toy") == []
