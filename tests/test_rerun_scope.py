"""A code edit reruns exactly the jobs it can affect, in Snakemake and in DVC alike.

Two copies of the project (one per tool) finish a small toy grid; then each edit is applied to both
copies' code and the plans are compared with what the edit can affect: `snakemake -n` (jobs planned) and
`dvc status` after DVC's `code_digests` stage refreshed the digest files (stages out of date).
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from test_dvc import DVC, SNAKEMAKE, _needs_tools, _project_copy, _run, _tiny_params

METHODS = ["erm", "bbn", "db_focal", "ours"]  # BBN's family; DB-Focal and Ours use the DB loss; ERM neither

# name -> (file under src/noisymlt, edit, train runs it must replan, other rules it must replan). Snakemake
# also rewrites DVC's digest files (rule code_digests) when one of them changes.
EDITS = {
    "figure code": ("report/figures.py", "append", set(), {"figure_map_vs_gamma", "code_digests"}),
    "BBN family": ("methods/bbn.py", "append", {"bbn"}, {"evaluate", "aggregate", "table_total", "table_groups",
                                                       "table_fit", "table_paired", "figure_map_vs_gamma",
                                                       "readme_numbers", "code_digests"}),
    # Ours retrains: its noise-level and pseudo-label figures follow (their inputs are its run's files), and so
    # does its model selection, whose candidates train Ours: their choice is redone (a checkpoint), and the
    # final run's config is re-read from it (the plan cannot know the choice before the candidates ran)
    "DB loss": ("losses/db.py", "append", {"db_focal", "ours"}, {"evaluate", "aggregate", "table_total",
                                                                 "table_groups", "table_fit", "table_paired",
                                                                 "figure_map_vs_gamma",
                                                                 "readme_numbers", "code_digests",
                                                                 "figure_noise_level", "figure_pseudo_labels",
                                                                 "train_candidate", "evaluate_candidate", "select",
                                                                 "candidate_config", "run_config"}),
    "docstring of an unrelated module": ("data/glove.py", "docstring", set(), set()),
}
DVC_ONLY_RULES = {"code_digests"}
# Ours' model-selection candidates (the tiny grids of test_dvc._tiny_params, on the demo's two selection sets):
# DVC lists each as its own stage, which shows as changed before its digests do
CANDIDATE_STAGES = {f"train_candidate@toy-ours-{stage}-0.5-{seed}-{tag}" for seed in (0, 1)
                    for stage, tag in ((1, "lr0.02"), (1, "lr0.08"), (2, "alpha0.9_beta0.1"), (2, "alpha0.7_beta0.1"))}
# DVC stages that hash the whole package: the digests, and the params file (merged by package code), which
# a code edit leaves as it was
PACKAGE_STAGES = ["params", "code_digests"]


def _params() -> dict:
    from noisymlt.config import load_params
    from test_dvc import REPO

    params = _tiny_params()
    full = load_params(REPO / "params.yaml")
    params["methods"] = {m: full["methods"][m] for m in METHODS}
    params["grid"]["methods"] = METHODS
    demo = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    params["selection"]["methods"] = {m: demo["selection"]["methods"][m] for m in METHODS}  # Ours selects
    params["train"]["balanced_batch_size"] = 16  # seconds, not minutes, for Ours' balanced branch
    return params


def _planned(text: str) -> tuple[set[str], set[str]]:
    """(methods of the planned train jobs, the other rules planned) from `snakemake -n` output."""
    trains, rules = set(), set()
    for block in re.split(r"\n(?=(?:local)?(?:rule|checkpoint) \w+:)", text):
        m = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block.strip())
        if not m or m.group(1) == "all":
            continue
        if m.group(1) == "train":
            trains.add(re.search(r"method=(\w+)", block).group(1))
        else:
            rules.add(m.group(1))
    return trains, rules


def _dvc_changed(root) -> set[str]:
    status = json.loads(_run([DVC, "status", "--json"], root).strip().splitlines()[-1])
    return set(status)


def _edit(path, how: str) -> str:
    original = path.read_text()
    if how == "append":
        path.write_text(original + "\n# an edit\n")
    else:  # reword the module docstring, nothing else
        first = original.index('"""') + 3
        path.write_text(original[:first] + "Reworded. " + original[first:])
    return original


@pytest.mark.slow
def test_an_edit_reruns_exactly_the_jobs_it_can_affect(tmp_path, capsys):
    _needs_tools()
    params = _params()
    smk = _project_copy(tmp_path / "smk", params, workflow=True)
    dvc = _project_copy(tmp_path / "dvc", params)
    _run([SNAKEMAKE, "--cores", "2"], smk, timeout=1200)
    assert "Nothing to be done" in _run([SNAKEMAKE, "-n"], smk)
    _run([DVC, "repro"], dvc, timeout=1200)
    assert _dvc_changed(dvc) == set()
    train_stages = {m: f"train@toy-0.5-0-{m}" for m in METHODS}

    counts = {}
    for name, (rel, how, trains, rules) in EDITS.items():
        originals = {root: _edit(root / "src" / "noisymlt" / rel, how) for root in (smk, dvc)}
        try:
            dry = _run([SNAKEMAKE, "-n"], smk)
            planned_trains, planned_rules = _planned(dry)
            assert (planned_trains, planned_rules) == (trains, rules), name
            # DVC: the code stages notice the edit (they hash the package); the digest files then tell
            assert _dvc_changed(dvc) == set(PACKAGE_STAGES), name
            _run([DVC, "repro", "--single-item", *PACKAGE_STAGES], dvc)
            changed = _dvc_changed(dvc)
            # DVC compares each stage with its own deps: an edit shows at the stages whose code it is
            # (their downstream stages follow when `dvc repro` has rerun them)
            expected = {train_stages[m] for m in trains} if trains else rules - DVC_ONLY_RULES
            if "ours" in trains:  # its candidates train with the edited code too
                expected |= CANDIDATE_STAGES
            assert changed == expected, name
            total = re.search(r"^total\s+(\d+)$", dry, re.M)
            counts[name] = {"snakemake_jobs": int(total.group(1)) if total else 0,
                            "snakemake_train_jobs": len(planned_trains), "dvc_stages": len(changed)}
        finally:
            for root, text in originals.items():
                (root / "src" / "noisymlt" / rel).write_text(text)
        _run([DVC, "repro", "--single-item", *PACKAGE_STAGES], dvc)
        assert _dvc_changed(dvc) == set() and "Nothing to be done" in _run([SNAKEMAKE, "-n"], smk), name
    with capsys.disabled():
        print("\nplanned after each edit (before: nothing):", json.dumps(counts, indent=1))
    _selection_reruns_exactly_its_final_runs(smk, dvc)


def _ran(text: str) -> list[tuple[str, str]]:
    """(rule, wildcards) of the jobs a real Snakemake run executed, from its output."""
    return re.findall(r"(?:rule|checkpoint) (\w+):\n(?:    \w+: .*\n)*?    wildcards: (.*)", text)


def _dvc_ran(text: str) -> set[str]:
    return set(re.findall(r"^Running stage '([^']+)'", text, re.M))


def _selection_reruns_exactly_its_final_runs(smk, dvc) -> None:
    """A redone selection that chooses the same values reruns nothing downstream; a changed choice retrains
    exactly the final runs that read it (Ours here), in Snakemake and in DVC."""
    stage2 = json.loads((smk / "runs/toy/select/ours/stage2.json").read_text())
    assert json.loads((dvc / "runs/toy/select/ours/stage2.json").read_text())["chosen"] == stage2["chosen"]
    # Snakemake: a losing candidate's score changes (the stage's select reruns), the choice does not. (A forced
    # `--forcerun select` replans what follows the checkpoint: Snakemake cannot know the choice before it ran.)
    loser = next(c["tag"] for c in stage2["candidates"] if c["tag"] != stage2["winner"])
    metrics = smk / "runs/toy/select/ours/stage2/g0.5/s0" / loser / "metrics.json"
    record = json.loads(metrics.read_text())
    record["heads"]["ensemble"]["map"]["total"] = 0.001
    metrics.write_text(json.dumps(record))
    ran = _ran(_run([SNAKEMAKE, "--cores", "2"], smk, timeout=600))
    assert {rule for rule, _ in ran} <= {"select", "readme_numbers"} and ("select", "dataset=toy, method=ours, stage=2") in ran, ran
    _run([DVC, "repro", "--force", "--single-item", "select@toy-ours-1", "select@toy-ours-2"], dvc)
    assert _dvc_changed(dvc) == set()
    # the grid keeps only the alpha that lost: the choice changes, no candidate retrains
    lost = next(a for a in (0.9, 0.7) if a != stage2["chosen"]["alpha"])
    for root in (smk, dvc):
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["selection"]["grids"]["alpha"] = [lost]
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    ran = _ran(_run([SNAKEMAKE, "--cores", "2"], smk, timeout=600))
    assert {w for rule, w in ran if rule == "train"} == {"dataset=toy, gamma=0.5, seed=0, method=ours"}, ran
    # (the grid edit reruns stage 1's select, a checkpoint, so Snakemake replans stage 2's remaining candidate:
    # it cannot know stage 1's choice before the checkpoint ran; DVC below retrains none)
    assert json.loads((smk / "runs/toy/g0.5/s0/ours/run_config.json").read_text())["selected"]["values"]["alpha"] == lost
    _run([sys.executable, "-m", "noisymlt", "params", "params.yaml", "--out", "dvc.params.yaml"], dvc)
    stages = _dvc_ran(_run([DVC, "repro"], dvc, timeout=600))
    assert {s for s in stages if s.startswith(("train", "evaluate"))} == {"train@toy-0.5-0-ours",
                                                                         "evaluate@toy-0.5-0-ours"}, stages
    assert {"select@toy-ours-2"} <= stages
    assert json.loads((dvc / "runs/toy/g0.5/s0/ours/run_config.json").read_text())["selected"]["values"]["alpha"] == lost
