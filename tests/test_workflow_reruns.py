"""A code edit reruns exactly the work it can change: tested by outcome.

A copy of the project finishes a small toy grid. Each edit below is then made to the copy's code and Snakemake
really runs again (DVC's stages run the same Snakemake); the files before and after are compared byte for byte: the
runs an edit can change are retrained (their checkpoints record the new code) and, for a behavioural
edit of a loss, predict otherwise; every other file stays byte-identical. A plan (`snakemake -n`) that
lists the right jobs would prove nothing about what those jobs then do: a job that "resumes" an old
model's finished checkpoint rewrites the same predictions under the new code's name.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from helpers import (SNAKEMAKE, output_digests, project_copy, run_tool as _run, tiny_layer, tool_env,
                     write_layer)

METHODS = ["erm", "bbn", "db_focal", "ours"]  # BBN's family; DB-Focal and Ours use the DB loss; ERM neither
RUN = "runs/toy/g0.5/s0/{}/"

# Each edit in order (each starts from the state the one before left): name -> (file under src/noisymlt, old
# text, new text, final runs it retrains, runs whose predictions must change, further paths it may change).
# A retrained Ours brings its model-selection candidates (runs/toy/select/ours/) along: they train Ours too.
RESULTS = ("reports/",)  # tables, figures, results.parquet
EDITS = {
    "comments and docstrings of the DB loss": (
        "losses/db.py", '"""', '"""Reworded, with a comment.  # not code\n', set(), set(), ()),
    "the DB loss": (  # the edit of the issue that found the checkpoint resumed under new code
        "losses/db.py", "bias = self.kappa", "bias = 3 * self.kappa", {"db_focal", "ours"}, {"db_focal", "ours"},
        RESULTS),
    "the DB loss, restored": (  # back to the first code: its runs come back byte for byte (from previous/)
        "losses/db.py", "bias = 3 * self.kappa", "bias = self.kappa", {"db_focal", "ours"}, {"db_focal", "ours"},
        RESULTS),
    "the pseudo-label rule": (
        "methods/pseudo_labels.py", "out = torch.where(q > alpha_t, one, noisy_targets)",
        "out = torch.where(q >= alpha_t, one, noisy_targets)", {"ours"}, set(), RESULTS),
    "the evaluation": (  # every run's job reruns (train + evaluate is one job) and retrains nothing: see below
        "evaluation/evaluate.py", '"num_test_images": len(ids),', '"num_test_images": len(ids), "edited": True,',
        set(), set(), ("runs/toy/", *RESULTS)),
    "the model-selection code": (  # the stage files change, the choice does not: no final run retrains
        "pipeline/selection.py", '"metric": f"mAP (%) of the {head} head', '"metric": f"mAP (percent) of the {head} head',
        set(), set(), ("runs/toy/select/ours/stage", "reports/")),
}


# The toy grid: the four METHODS at one noise rate and seed, one epoch, on a smaller toy than TINY's; Ours selects
# its values in the run (TINY's selection) on one selection set: 4 candidates. A scratch backbone: no pretraining.
LAYER = tiny_layer({
    "grid": {"gammas": [0.5], "seeds": [0], "methods": METHODS, "ablations": []},
    "timing": {"methods": ["erm"], "batch_sizes": [1]},
    "datasets": {"toy": {"toy": {"n_trainval": 240, "n_test": 60}, "longtail": {"max": 60, "min": 3}}},
    "train": {"epochs": 1, "lr_steps": [1], "balanced_batch_size": 16, "eval_batch_size": 64, "weights_path": None},
    "schedules": {name: {"train": {"epochs": 1, "lr_steps": [1]}} for name in ("db", "db_random")},
    "selection": {"seeds": [0]},
})


def _edit_layer(smk, change: dict) -> None:
    """The test's layer file (tiny.yaml) with ``change`` merged over it, as a user edits a params file."""
    from noisymlt.config import deep_merge

    path = smk / "tiny.yaml"
    path.write_text(yaml.safe_dump(deep_merge(yaml.safe_load(path.read_text()), change), sort_keys=False))


def _outputs(root) -> dict[str, str]:
    """sha256 of every output file, without the runs set aside in previous/ (an archive, not a result)."""
    return {path: sha for path, sha in output_digests(root).items() if "/previous/" not in path}


def _changed(before: dict, after: dict) -> set[str]:
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def _retrained(changed: set[str]) -> set[str]:
    """The final runs whose checkpoint changed: a checkpoint records the code that trained it, so every
    retraining under new code writes another one, and a resumed finished run writes none."""
    return {m for m in METHODS if RUN.format(m) + "checkpoint.pt" in changed}


def _check(tool: str, name: str, changed: set[str], retrains: set, predicts: set, allowed: tuple) -> dict:
    assert _retrained(changed) == retrains, (tool, name, sorted(changed))
    for method in predicts:
        assert RUN.format(method) + "predictions.npz" in changed, (tool, name, method)
    prefixes = (*allowed, *(RUN.format(m) for m in retrains),
                *(f"runs/toy/select/{m}/" for m in retrains))  # a method's candidates train it too
    stray = sorted(p for p in changed if not p.startswith(prefixes))
    assert not stray, f"{tool}, {name}: files changed that the edit cannot reach: {stray}"
    if not retrains:  # not a single model anywhere was retrained
        assert not [p for p in changed if p.endswith("checkpoint.pt")], (tool, name, sorted(changed))
    return {"files_changed": len(changed), "runs_retrained": sorted(retrains)}


@pytest.mark.slow
def test_an_edit_changes_exactly_the_results_it_can_reach(tmp_path, capsys):
    if not SNAKEMAKE.exists():
        pytest.skip(f"snakemake is not installed next to {sys.executable}")
    smk = project_copy(tmp_path / "smk")
    args = write_layer(smk, LAYER)
    _run([SNAKEMAKE, *args], smk, timeout=1200)  # the demo profile: two cores
    assert "Nothing to be done" in _run([SNAKEMAKE, *args, "-n"], smk)
    first = _outputs(smk)

    counts = {}
    for name, (rel, old, new, retrains, predicts, allowed) in EDITS.items():
        path = smk / "src" / "noisymlt" / rel
        text = path.read_text()
        assert text.count(old) >= 1, (name, old)
        path.write_text(text.replace(old, new, 1))
        before = _outputs(smk)
        _run([SNAKEMAKE, *args], smk, timeout=1200)
        after = _outputs(smk)
        counts[name] = _check("snakemake", name, _changed(before, after), retrains, predicts, allowed)
        assert "Nothing to be done" in _run([SNAKEMAKE, *args, "-n"], smk), name
        if name == "the evaluation":  # the finished checkpoints predict the same bytes; only the metrics move
            in_runs = {p for p in _changed(before, after) if p.startswith("runs/")}
            assert {RUN.format(m) + "metrics.json" for m in METHODS} <= in_runs, sorted(in_runs)
            assert all(p.endswith(("/metrics.json", "/metrics.manifest.json")) for p in in_runs), \
                sorted(p for p in in_runs if not p.endswith("metrics.json"))
        for method in retrains if not name.endswith("restored") else ():  # each log says it started over, and why
            log = (smk / RUN.format(method) / "train_log.jsonl").read_text().splitlines()
            restart = json.loads(log[0])
            assert restart["event"] == "restart" and "trained by other code" in restart["reason"], (name, log[0])
        if name == "the DB loss, restored":  # the first code's results, byte for byte
            assert after == first, sorted(_changed(first, after))
    with capsys.disabled():
        print("\noutcome of each edit:", json.dumps(counts, indent=1))
    _selection_reruns_exactly_its_final_runs(smk, args)
    _an_interrupted_run_resumes_to_the_uninterrupted_result(smk, args, tmp_path / "through")


def _an_interrupted_run_resumes_to_the_uninterrupted_result(smk, args, through) -> None:
    """Code unchanged, a longer ERM schedule: a copy of the project trains it through; the project itself is stopped
    as Ctrl-C stops it (checkpoints every epoch), then run again: the run resumes its own checkpoint and ends with
    the copy's bytes."""
    import os
    import shutil
    import signal
    import subprocess
    import time

    epochs = 60
    _edit_layer(smk, {"methods": {"erm": {"train": {"epochs": epochs, "lr_steps": [epochs]}}}})
    shutil.copytree(smk, through, symlinks=True)
    _run([SNAKEMAKE, *args], through, timeout=1200)

    run = smk / RUN.format("erm")
    env = {**tool_env(smk), "NOISYMLT_CHECKPOINT_SECONDS": "0"}
    # its own process group, which Ctrl-C in a terminal signals as a whole: Snakemake, the job, the trainer
    proc = subprocess.Popen([str(SNAKEMAKE), *args], cwd=smk, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()[:-1]] \
            if (run / "train_log.jsonl").exists() else []
        if records and records[0].get("event") == "restart" and len(records) >= 3:  # epochs 1 and 2 done
            os.killpg(proc.pid, signal.SIGINT)
            break
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=300)
    import torch

    stopped_at = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert 2 <= stopped_at < epochs, (stopped_at, out[-3000:])
    assert not (run / "predictions.npz").exists()
    _run([SNAKEMAKE, *args, "--rerun-incomplete"], smk, timeout=1200)
    job_log = (smk / "logs" / "train" / "toy_g0.5_s0_erm.log").read_text()
    assert f"resumed {RUN.format('erm')}checkpoint.pt from epoch {stopped_at}" in job_log, job_log[-2000:]
    for name in ("checkpoint.pt", "predictions.npz", "manifest.json"):
        assert (run / name).read_bytes() == (through / RUN.format("erm") / name).read_bytes(), name


def _ran(text: str) -> list[tuple[str, str]]:
    """(rule, wildcards) of the jobs a real Snakemake run executed, from its output."""
    return re.findall(r"(?:rule|checkpoint) (\w+):\n(?:    \w+: .*\n)*?    wildcards: (.*)", text)


def _selection_reruns_exactly_its_final_runs(smk, args) -> None:
    """A redone selection that chooses the same values reruns nothing downstream; a changed choice retrains
    exactly the final runs that read it (Ours here)."""
    stage2 = json.loads((smk / "runs/toy/select/ours/stage2.json").read_text())
    # a losing candidate's score changes (the stage's select reruns), the choice does not. (A forced
    # `--forcerun select` replans what follows the checkpoint: Snakemake cannot know the choice before it ran.)
    loser = next(c["tag"] for c in stage2["candidates"] if c["tag"] != stage2["winner"])
    metrics = smk / "runs/toy/select/ours/stage2/g0.5/s0" / loser / "metrics.json"
    record = json.loads(metrics.read_text())
    record["heads"]["ensemble"]["map"]["total"] = 0.001
    metrics.write_text(json.dumps(record))
    ran = _ran(_run([SNAKEMAKE, *args], smk, timeout=600))
    assert {rule for rule, _ in ran} <= {"select", "readme_numbers"} and ("select", "dataset=toy, method=ours, stage=2") in ran, ran
    # the grid keeps only the alpha that lost: the choice changes, no candidate retrains
    lost = next(a for a in (0.9, 0.7) if a != stage2["chosen"]["alpha"])
    _edit_layer(smk, {"selection": {"grids": {"alpha": [lost]}}})
    ran = _ran(_run([SNAKEMAKE, *args], smk, timeout=600))
    assert {w for rule, w in ran if rule == "train"} == {"dataset=toy, gamma=0.5, noise=, seed=0, method=ours"}, ran
    # (the grid edit reruns stage 1's select, a checkpoint, so Snakemake replans stage 2's remaining candidate:
    # it cannot know stage 1's choice before the checkpoint ran)
    assert json.loads((smk / "runs/toy/g0.5/s0/ours/run_config.json").read_text())["selected"]["values"]["alpha"] == lost
