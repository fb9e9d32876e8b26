"""The SLURM profile, for real: the toy workflow's training and report steps submitted with sbatch.

Needs a SLURM cluster on this machine (CI starts a single-node one with
tests/slurm/start_cluster.sh); skipped when `sbatch` is missing, `sinfo` does not answer or this
host is not a usable node of the default partition. The workflow files and the real
workflow/profiles/slurm profile are copied into a temporary folder; a test profile is derived from
that profile with only what a 2-core, GPU-less, accounting-free node needs changed (see
`localcluster.derive_local_profile`), and a params layer shrinks the demo to one tiny run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "slurm"))
import localcluster  # noqa: E402  (tests/slurm/localcluster.py, shared with scripts/slurm_submissions.py)
from localcluster import copy_project, run, sbatch_counter, snakemake_env  # noqa: E402

from helpers import CUDA_STAND_IN  # noqa: E402

pytestmark = pytest.mark.slurm

ROOT = localcluster.ROOT
RUN_TIMEOUT_S = 600

# One run (toy, gamma 0.5, seed 0, ERM) on 32 px images, one epoch. 600 trainval images with
# max 110 give a 200-image long-tailed subset with 1 head, 4 medium and 15 tail classes.
TINY_PARAMS = {
    "grid": {"datasets": ["toy"], "gammas": [0.5], "seeds": [0], "methods": ["erm"], "ablations": [], "clean_methods": []},
    "datasets": {
        "toy": {
            "toy": {"seed": 0, "n_trainval": 600, "n_test": 200, "size": 32, "scenes": "glyph"},
            "longtail": {"source": "pareto", "b": 6, "max": 110, "min": 2, "seed": 0, "groups": "fixed"},
        }
    },
    "train": {"image_size": 32, "epochs": 1, "warmup_iters": 2, "lr_steps": [], "eval_batch_size": 100},
    # a schedule's keys win over the train block: the demo's recipes set their own epochs
    "schedules": {name: {"train": {"warmup_iters": 2, "epochs": 1, "lr_steps": []}}
                  for name in ("db", "db_random")},
    # the demo's pretrained backbone, made in seconds: a small source task, one epoch
    "pretrain": {"toy_glyphs": {"epochs": 1, "source": {"classes": 8, "images_per_class": 16, "held_out_per_class": 4}}},
    # model selection of ERM's lr over two candidates, each its own sbatch job (group `select`), on the grid's one
    # noisy set (the demo selects on two)
    "selection": {"methods": {"erm": [["lr"]]}, "grids": {"lr": [0.02, 0.08]}, "seeds": [0]},
    "crossfit": {"enabled": False},  # the profile's subject is how jobs go to SLURM: the fold runs are train jobs too
}

# Each rule run through SLURM costs Snakemake start-ups (sbatch -> jobstep, then srun -> one per
# rule), about 15 s per rule here. So the cheap data steps run locally first, and the SLURM run does
# the rest: the selection's two candidates (one array job), the final run (train, which evaluates its
# predictions) and the profile's `report` group (aggregate, table, figure).
DATA_TARGETS = ["data/toy/noisy/g0.5_s0.parquet", "data/toy/test_labels.parquet", "data/toy/class_split.json",
                "data/pretrained/toy_glyphs.pt",
                "data/toy/select/g0.5_s0_fit.parquet", "data/toy/cache/select_fit.npy", "data/toy/cache/select_val.npy"]
SLURM_GROUPS = {"report": ["aggregate", "figure_map_vs_gamma", "table_total"]}
GROUP_JOBS = {"report": 1}  # sbatch jobs per group
ARRAY_RULES = {"train", "train_candidate"}  # the profile's slurm-array-jobs
# one sbatch job each
SLURM_SINGLE_RULES = {"cache_train_images", "cache_test_images", "readme_numbers", "table_groups", "table_fit",
                      "suspects", "table_detection"}


def local_partition() -> str:
    """The default partition, if this machine is one of its nodes and up; else skip."""
    partition, why_not = localcluster.local_partition()
    if partition is None:
        pytest.skip(why_not)
    return partition


def write_test_profile(tmp_path: Path, work: Path, partition: str, configfiles: list[Path], **changes) -> Path:
    real = yaml.safe_load((work / "workflow/profiles/slurm/config.yaml").read_text())
    assert real["executor"] == "slurm" and real["set-resources"]["train"]["gpu"] == 1
    assert real["set-resources"]["train_candidate"]["gpu"] == 1
    return localcluster.write_local_profile(tmp_path, work, partition, configfiles, **changes)


def test_slurm_profile_runs_the_toy_workflow_through_sbatch(tmp_path: Path) -> None:
    partition = local_partition()
    work, src = copy_project(tmp_path)
    tiny = tmp_path / "tiny_params.yaml"
    tiny.write_text(yaml.safe_dump(TINY_PARAMS))
    configfiles = [work / "workflow/profiles/demo/params.yaml", tiny]
    # one rule asks for two cores (the node has two): its sbatch call must ask for them (cpus_per_task: threads)
    real_threads = yaml.safe_load((work / "workflow/profiles/slurm/config.yaml").read_text())["set-threads"]
    threads = {**real_threads, "train": 1, "train_candidate": 1, "table_fit": 2}
    prof_dir = write_test_profile(tmp_path, work, partition, configfiles, **{"set-threads": threads})
    bin_dir, calls = sbatch_counter(tmp_path)

    snakemake = [sys.executable, "-m", "snakemake", "--nocolor"]
    run(snakemake + ["--cores", "2", "--configfile", *map(str, configfiles), "--", *DATA_TARGETS], work, src, 120)
    log = run(snakemake + ["--profile", str(prof_dir)], work, src, RUN_TIMEOUT_S, path=bin_dir)
    assert re.search(r"(\d+) of \1 steps \(100%\) done", log), log[-3000:]

    # The outputs of the whole chain.
    table = (work / "reports/table_total.tex").read_text()
    assert "\\begin{tabular}" in table and "Toy-MLT-Noise" in table
    erm = re.search(r"^ERM & (?:\\textbf\{)?([0-9.]+)", table, re.M)
    assert erm and 0 < float(erm.group(1)) <= 100, table
    results = pd.read_parquet(work / "reports/results.parquet")
    assert set(results["dataset"]) == {"toy"} and set(results["gamma"]) == {0.5}
    assert results["run_id"].nunique() == 1
    assert (work / "reports/map_vs_gamma.png").stat().st_size > 0
    split = json.loads((work / "data/toy/class_split.json").read_text())
    assert [len(split[g]) for g in ("head", "medium", "tail")] == [1, 4, 15]

    # The report group was one sbatch job, the two candidates one array (two tasks, one sbatch call), the final run
    # a job of its own (an array of one is a plain job); every other rule one job each. Logs kept.
    slurm_logs = work / ".snakemake/slurm_logs"
    assert sorted(d.name for d in slurm_logs.iterdir()) == sorted(
        [f"group_{name}_{'_'.join(rules)}" for name, rules in SLURM_GROUPS.items()]
        + [f"rule_{rule}" for rule in {*SLURM_SINGLE_RULES, *ARRAY_RULES}]
    )
    group_logs = {name: sorted((slurm_logs / f"group_{name}_{'_'.join(rules)}").rglob("*.log"))
                  for name, rules in SLURM_GROUPS.items()}
    assert {name: len(files) for name, files in group_logs.items()} == GROUP_JOBS
    candidates = sorted((slurm_logs / "rule_train_candidate").glob("*.log"))
    assert len(candidates) == 2 and len({f.stem.split("_")[0] for f in candidates}) == 1, candidates  # <array>_<task>
    submitted = calls.read_text().splitlines()
    assert len(submitted) == len(SLURM_GROUPS) + len(SLURM_SINGLE_RULES) + len(ARRAY_RULES), submitted
    assert [c for c in submitted if "--array=" in c] == [c for c in submitted if "train_candidate" in c]
    assert len([c for c in submitted if "train_candidate" in c]) == 1
    assert all("--requeue" in c for c in submitted)  # a preempted job comes back
    checked = set()
    for call in submitted:  # each rule's job asks for the rule's threads as CPUs (a group's job for its jobs')
        rule = re.search(r"--comment rule_(\w+)", call).group(1).split("_wildcards_")[0]  # rule_<name>_wildcards_<values>
        if rule in SLURM_SINGLE_RULES | ARRAY_RULES:
            assert f"--cpus-per-task={2 if rule == 'table_fit' else 1} " in call, call[:600]
            checked.add(rule)
    assert checked == SLURM_SINGLE_RULES | ARRAY_RULES, checked
    # The plugin writes every task's command into the array's sbatch command line, which must stay under the 128 KiB
    # one argument may hold (past it, the plugin falls back to a job script that runs the first task's job in every
    # task): the profile's cap on tasks a call, at this call's bytes per task, leaves a quarter of it free.
    [array_call] = [c for c in submitted if "--array=" in c]
    payload = re.search(r"--slurm-jobstep-array-execs='?([A-Za-z0-9+/=]+)", array_call).group(1)
    per_task = len(payload)  # the payload of the one task after the first (an array of 2)
    limit = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())["slurm-array-limit"]
    assert len(array_call) - per_task + limit * per_task < 0.75 * 131072, (len(array_call), per_task, limit)
    chosen = json.loads((work / "runs/toy/select/erm/stage1.json").read_text())
    assert [c["tag"] for c in chosen["candidates"]] == ["lr0.02", "lr0.08"]
    assert json.loads((work / "runs/toy/g0.5/s0/erm/run_config.json").read_text())["train"]["lr"] == chosen["chosen"]["lr"]
    manifest = json.loads((work / "runs/toy/g0.5/s0/erm/manifest.json").read_text())
    timing = json.loads((work / "runs/toy/g0.5/s0/erm/manifest.timing.json").read_text())  # untracked: varies per job
    job_id = timing["slurm_job_id"]
    assert job_id is not None and job_id.isdigit(), timing
    [train_log] = (slurm_logs / "rule_train").rglob(f"{job_id}.log")
    assert "localrule train:" in train_log.read_text()
    assert manifest["environment"]["device"] == "cpu"


def node_gpus() -> int:
    """The GPUs the local node declares to SLURM (start_cluster.sh declares 4 fake ones); skip without them."""
    out = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%G"], capture_output=True, text=True, timeout=30)
    found = re.search(r"gpu:(?:\w+:)?(\d+)", out.stdout)
    if not found:
        pytest.skip(f"the local SLURM node declares no GPUs (sinfo %G: {out.stdout.strip()!r}); "
                    "tests/slurm/start_cluster.sh declares 4 fake ones where mknod is allowed")
    return int(found.group(1))


# One training run's choice of card inside a SLURM job step, as the train command makes it (choose_device), with CUDA
# reported available over the cards SLURM put in CUDA_VISIBLE_DEVICES (the node's cards are fake). It records its
# card and holds its slot until every run of the job has chosen, as concurrent training runs would.
PACKED_RUN = CUDA_STAND_IN + """
import time
from noisymlt.training.cards import choose_device
slots, runs, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
card = choose_device("auto", slots).split(":")[1]
with open(out, "a") as f:
    f.write(f"{card} {os.environ['CUDA_VISIBLE_DEVICES']} {os.environ['SLURM_JOB_ID']}\\n")
deadline = time.monotonic() + 120
while len(open(out).read().splitlines()) < runs and time.monotonic() < deadline:
    time.sleep(0.1)
"""


@pytest.mark.parametrize("runs, slots", [(4, 1), (8, 2)])
def test_runs_packed_into_a_four_card_slurm_job_use_its_four_cards(tmp_path: Path, runs: int, slots: int) -> None:
    """A packed group job as the profile's packing submits it (sbatch --gpus=4, then one `srun --gpus=4` step that
    runs the group's jobs side by side): 4 runs take 4 different cards, 8 runs with 2 slots a card 2 each."""
    partition = local_partition()
    if node_gpus() < 4:
        pytest.skip("the local SLURM node declares fewer than 4 GPUs")
    probe, out = tmp_path / "packed_run.py", tmp_path / "cards.txt"
    probe.write_text(PACKED_RUN)
    runs_cmd = f"for i in $(seq {runs}); do {sys.executable} {probe} {slots} {runs} {out} & done; wait"
    script = tmp_path / "packed.sh"
    script.write_text(f"#!/bin/sh\nsrun -n1 --gpus=4 sh -c '{runs_cmd}'\n")
    proc = subprocess.run(["sbatch", "--wait", "--parsable", f"--partition={partition}", "--gpus=4", "--mem=4000",
                           f"--output={tmp_path / 'slurm.log'}", str(script)], cwd=tmp_path,
                          env=snakemake_env(ROOT / "src"), capture_output=True, text=True, timeout=300)
    log = (tmp_path / "slurm.log").read_text() if (tmp_path / "slurm.log").exists() else ""
    assert proc.returncode == 0, proc.stderr + log
    rows = [line.split() for line in out.read_text().splitlines()]
    assert {visible for _, visible, _ in rows} == {"0,1,2,3"}  # slurmd handed the job its 4 cards
    assert {job for _, _, job in rows} == {proc.stdout.strip().split(";")[0]}
    assert sorted(int(card) for card, _, _ in rows) == sorted(list(range(4)) * (runs // 4)), rows


# The requeue test's run: one ERM run long enough to be interrupted between two epochs (a checkpoint every epoch).
REQUEUE_EPOCHS = 12


def squeue_jobs() -> list[tuple[str, str]]:
    out = subprocess.run(["squeue", "--noheader", "--format=%i %T"], capture_output=True, text=True, timeout=30)
    return [tuple(line.split()) for line in out.stdout.splitlines() if line.strip()]


def wait_for(condition, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_a_requeued_train_job_resumes_its_checkpoint_and_predicts_the_same_bytes(tmp_path: Path) -> None:
    """Preemption, for real: the profile submits with --requeue; `scontrol requeue` kills the running train job's
    allocation after its first epochs and puts it back in the queue under the same job id; Snakemake keeps waiting,
    the job runs again, the run resumes from its checkpoint and its predictions equal an uninterrupted run's."""
    partition = local_partition()
    work, src = copy_project(tmp_path)
    params = {key: TINY_PARAMS[key] for key in ("grid", "datasets", "pretrain")}
    params["train"] = {**TINY_PARAMS["train"], "epochs": REQUEUE_EPOCHS}
    params["schedules"] = {name: {"train": {"warmup_iters": 2, "epochs": REQUEUE_EPOCHS, "lr_steps": []}}
                           for name in ("db", "db_random")}
    tiny = tmp_path / "tiny_params.yaml"
    tiny.write_text(yaml.safe_dump(params))
    configfiles = [work / "workflow/profiles/demo/params.yaml", tiny]
    prof_dir = write_test_profile(tmp_path, work, partition, configfiles, **{"keep-going": False})
    run_dir = work / "runs/toy/g0.5/s0/erm"
    target = str((run_dir / "predictions.npz").relative_to(work))
    snakemake = [sys.executable, "-m", "snakemake", "--nocolor"]
    local = snakemake + ["--cores", "1", "--set-threads", "train=1", "--configfile", *map(str, configfiles), "--"]
    # the inputs, then the uninterrupted run on this machine (one thread, as the profile's test job), its bytes kept
    run(local + [t for t in DATA_TARGETS if "select" not in t], work, src, 300)
    run(local + [target], work, src, 300)
    uninterrupted = (run_dir / "predictions.npz").read_bytes()
    assert "from epoch" not in (work / "logs/train/toy_g0.5_s0_erm.log").read_text()
    shutil.rmtree(run_dir)

    env = snakemake_env(src)
    env["NOISYMLT_CHECKPOINT_SECONDS"] = "0"  # a checkpoint after every epoch
    with open(tmp_path / "snakemake.log", "w") as log_file:
        proc = subprocess.Popen(snakemake + ["--profile", str(prof_dir), "--", target], cwd=work, env=env,
                                stdout=log_file, stderr=subprocess.STDOUT)
        try:
            ckpt = run_dir / "checkpoint.pt"
            wait_for(lambda: ckpt.exists() or proc.poll() is not None, 300, "the train job's first checkpoint")
            running = [job for job, state in squeue_jobs() if state == "RUNNING"]
            assert proc.poll() is None and len(running) == 1, (running, (tmp_path / "snakemake.log").read_text())
            job = running[0]
            subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
            # SLURM holds a requeued job back for about two minutes (its begin time); release it at once
            wait_for(lambda: dict(squeue_jobs()).get(job) == "PENDING", 120, f"job {job} back in the queue")
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)
            assert proc.wait(timeout=RUN_TIMEOUT_S) == 0, (tmp_path / "snakemake.log").read_text()[-4000:]
        finally:
            if proc.poll() is None:  # a failure above: leave no job behind in the cluster
                proc.kill()
                subprocess.run(["scancel", *[job for job, _ in squeue_jobs()]], timeout=30)
    shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30).stdout
    assert "Restarts=1" in shown, shown
    resumed = re.search(r"resumed \S+checkpoint.pt from epoch (\d+)", (work / "logs/train/toy_g0.5_s0_erm.log").read_text())
    assert resumed and 1 <= int(resumed.group(1)) < REQUEUE_EPOCHS, "the requeued run did not resume mid-way"
    assert json.loads((run_dir / "manifest.timing.json").read_text())["slurm_job_id"] == job
    assert (run_dir / "predictions.npz").read_bytes() == uninterrupted


# The manual's packing command (docs/slurm.md#packing-runs-into-one-job), with two runs a job: the local node has 2 CPUs.
PACKING_FLAGS = ["--slurm-array-jobs", "none", "--groups", "train=run", "train_candidate=select", "aggregate=report",
                 "table_total=report", "figure_map_vs_gamma=report", "--group-components", "run=2", "select=2"]


def test_the_manuals_packing_command_puts_two_runs_in_one_two_card_job(tmp_path: Path) -> None:
    """Snakemake sums a packed group's requests: two runs asking for a card each go as one sbatch job asking for
    --gpus=2 (which the node's fake cards grant), and both runs finish in it."""
    partition = local_partition()
    if node_gpus() < 2:
        pytest.skip("the local SLURM node declares fewer than 2 GPUs")
    docs = (ROOT / "docs/slurm.md").read_text()
    assert " ".join(PACKING_FLAGS).replace("run=2 select=2", "run=4 select=4") in " ".join(docs.replace("\\\n", " ").split())
    work, src = copy_project(tmp_path)
    methods = ["erm", "rs"]
    layer = {key: TINY_PARAMS[key] for key in ("datasets", "train", "schedules", "pretrain")}
    layer["grid"] = {**TINY_PARAMS["grid"], "methods": methods}
    tiny = tmp_path / "tiny_params.yaml"
    tiny.write_text(yaml.safe_dump(layer))
    configfiles = [work / "workflow/profiles/demo/params.yaml", tiny]
    prof_dir = write_test_profile(tmp_path, work, partition, configfiles)
    profile = yaml.safe_load((prof_dir / "config.yaml").read_text())
    profile["set-resources"]["train"]["gpu"] = 1  # the real profile's request, which the node's fake cards meet
    (prof_dir / "config.yaml").write_text(yaml.safe_dump(profile))
    snakemake = [sys.executable, "-m", "snakemake", "--nocolor"]
    run(snakemake + ["--cores", "2", "--configfile", *map(str, configfiles), "--",
                     *[t for t in DATA_TARGETS if "select" not in t]], work, src, 300)
    bin_dir, calls = sbatch_counter(tmp_path)
    targets = [f"runs/toy/g0.5/s0/{m}/predictions.npz" for m in methods]
    run(snakemake + ["--profile", str(prof_dir), *PACKING_FLAGS, "--", *targets],
        work, src, RUN_TIMEOUT_S, path=bin_dir)
    submitted = [c for c in calls.read_text().splitlines() if "rule_train" in c or "group_run" in c]
    assert len(submitted) == 1 and "group_run_train" in submitted[0] and "--gpus=2" in submitted[0], submitted
    assert all((work / t).is_file() for t in targets)
    job_ids = {json.loads((work / f"runs/toy/g0.5/s0/{m}/manifest.timing.json").read_text())["slurm_job_id"]
               for m in methods}
    assert len(job_ids) == 1, job_ids  # both trained inside the one packed job
