#!/usr/bin/env python
"""The DVC route on the finished demo, timed step by step against what a DVC user expects.

On a clone of the committed state (HEAD; or --repo, a clone where `make demo` has finished), with this
interpreter's environment:
  1. `make demo-dvc` with an experiments layer (exp.yaml, empty): records the Snakemake demo; then a git commit
  2. `dvc status` twice: clean, seconds each
  3. Snakemake's dry run of the demo: nothing to do
  4. a no-op experiment, `dvc exp run -S exp.yaml:++train.lr=0.05` (every demo method takes its lr from its
     schedule or its selection): the stages it runs, seconds
  5. the manual's experiment on ERM's lr (docs/dvc.md): the layer written (exp.yaml), `dvc repro`,
     `dvc exp save`: seconds, beside the seconds its trainings took (their manifest.timing.json); the budget is
     twice those plus a minute
  6. the same experiment by `dvc exp run -S exp.yaml:++methods.erm.train.lr=0.01`, from the same baseline: its
     seconds against the same budget (DVC's per-stage bookkeeping, treeverse/dvc#8809)
  7. the manual's `dvc exp show` recipe (docs/dvc.md): its text, whether it shows the lr and ERM's gamma 0.5 mAP
     of both rows
  8. `dvc push` to a local remote, a git clone of the project, `dvc pull` there, `dvc status` there: clean
and writes JSON with a calibration measured in the same call (scripts/calibration.py), so that readings from
different machines compare.

    python scripts/benchmark_dvc.py --json benchmarks/dvc.json
    python scripts/benchmark_dvc.py --json benchmarks/dvc.json --repo CLONE    # reuse a finished `make demo`

Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LAYERS = "params.yaml workflow/profiles/demo/params.yaml exp.yaml"
SMK_DRY = [str(BIN / "snakemake"), "--profile", "workflow/profiles/demo", "--configfile",
           "workflow/profiles/demo/params.yaml", "exp.yaml", "-n"]
ERM_EXPERIMENT = "exp.yaml:++methods.erm.train.lr=0.01"
ERM_LAYER = "methods:\n  erm:\n    train: {lr: 0.01}\n"  # what docs/dvc.md's printf writes: the same change
NOOP_EXPERIMENT = "exp.yaml:++train.lr=0.05"
# what an experiment rewrites
TRACKED = ["exp.yaml", "dvc-params.json", "dvc-params-runs", "dvc.lock", "workflow/dvc/runs"]


def _env(root: Path) -> dict:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
           "PYTHONPATH": str(root / "src")}
    env.pop("DVC_TEST", None)
    return env


def run(args: list[str], root: Path, timeout: float = 3600) -> tuple[str, float]:
    """(stdout + stderr, wall seconds); a failure stops the benchmark with the command's output."""
    start = time.perf_counter()
    proc = subprocess.run([str(a) for a in args], cwd=root, env=_env(root), capture_output=True, text=True,
                          timeout=timeout)
    seconds = round(time.perf_counter() - start, 2)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))} failed in {root}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr, seconds


def git(args: list[str], root: Path) -> str:
    who = ["-c", "user.name=benchmark", "-c", "user.email=benchmark@example.org"]
    return run(["git", *who, *args], root)[0]


def stages_run(out: str) -> list[str]:
    return re.findall(r"^Running stage '([^']+)'", out, flags=re.M)


def clean_status(root: Path) -> tuple[bool, float]:
    out, seconds = run([BIN / "dvc", "status", "--json"], root)
    return json.loads(out.strip().splitlines()[-1]) == {}, seconds


def training_seconds(root: Path, method: str) -> float:
    """Seconds the method's final runs trained, as their timing files record them."""
    total = 0.0
    for timing in sorted((root / "runs").glob(f"*/g*/s*/{method}/manifest.timing.json")):
        total += float(json.loads(timing.read_text())["seconds"])
    return round(total, 1)


def experiment_record(root: Path, out: str, seconds: float, parts: dict) -> dict:
    """An experiment's seconds beside its trainings' (the ERM runs' timing files, rewritten by its runs), and
    the budget: twice those plus a minute."""
    trained = training_seconds(root, "erm")
    ran = stages_run(out)
    trainings = sum(s.split(":")[-1].startswith("train@") for s in ran)  # a run stage: SHARD_FILE:train@KEY
    budget = round(2 * trained + 60, 1)
    return {"seconds": round(seconds, 2), **parts, "stages": len(ran), "trainings": trainings,
            "training_seconds": trained, "budget_s": budget, "within_budget": seconds <= budget}


def readme_exp_show() -> list[str]:
    """The manual's `dvc exp show` recipe (docs/dvc.md), as an argument list."""
    import shlex

    text = (REPO / "docs" / "dvc.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("dvc exp show --drop"))
    return shlex.split(line.split("  #")[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="file to write the timings to")
    ap.add_argument("--repo", help="a clone with a finished `make demo` (default: clone HEAD and run the demo)")
    ap.add_argument("--workdir", help="scratch folder (default: a temporary folder, removed)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    from calibration import calibrate

    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="noisymlt-dvc-"))
    result: dict = {"calibration": calibrate()}
    if args.repo:
        root = Path(args.repo).resolve()
    else:
        root = scratch / "noisymlt"
        shutil.rmtree(root, ignore_errors=True)
        git(["clone", "-q", str(REPO), str(root)], scratch)
        _, result["make_demo_s"] = run([BIN / "snakemake", "--profile", "workflow/profiles/demo"], root)
    result["commit"] = git(["rev-parse", "HEAD"], root).strip()

    (root / "exp.yaml").write_text("{}\n")
    make = ["make", "demo-dvc", f"VENV={BIN.parent}", "STAMP=", f"DEMO_PARAMS={LAYERS}"]
    out, result["make_demo_dvc_s"] = run(make, root)
    result["make_demo_dvc_recorded"] = "recorded every stage" in out
    git(["add", "-A"], root)
    git(["commit", "-qm", "demo under DVC"], root)

    result["status_clean"], result["status_s"] = clean_status(root)
    _, result["status_again_s"] = clean_status(root)
    out, result["snakemake_dry_run_s"] = run(SMK_DRY, root)
    result["snakemake_nothing_to_do"] = "Nothing to be done" in out

    out, result["noop_experiment_s"] = run([BIN / "dvc", "exp", "run", "-S", NOOP_EXPERIMENT], root)
    result["noop_experiment_stages"] = stages_run(out)
    git(["checkout", "-q", "HEAD", "--", *TRACKED], root)
    run([BIN / "dvc", "checkout", "--quiet"], root)

    (root / "exp.yaml").write_text(ERM_LAYER)
    out, repro_s = run([BIN / "dvc", "repro"], root)
    _, save_s = run([BIN / "dvc", "exp", "save", "-n", "erm-lr0.01"], root)
    result["erm_experiment"] = experiment_record(root, out, repro_s + save_s,
                                                 {"repro_s": repro_s, "exp_save_s": save_s})

    git(["checkout", "-q", "HEAD", "--", *TRACKED], root)
    run([BIN / "dvc", "checkout", "--quiet"], root)
    out, seconds = run([BIN / "dvc", "exp", "run", "-S", ERM_EXPERIMENT], root)
    result["erm_exp_run"] = experiment_record(root, out, seconds, {})

    show, _ = run(readme_exp_show(), root)
    rows = [ln for ln in show.splitlines() if re.search(r"\d", ln)]
    result["exp_show"] = {"text": show, "width": max(map(len, show.splitlines())),
                          "shows_both_lrs": "0.01" in show and any("0.02" in r for r in rows)}

    git(["checkout", "-q", "HEAD", "--", *TRACKED], root)
    run([BIN / "dvc", "checkout", "--quiet"], root)
    store = scratch / "store"
    run([BIN / "dvc", "remote", "add", "-f", "-d", "store", store], root)
    git(["commit", "-qam", "remote"], root)
    _, result["push_s"] = run([BIN / "dvc", "push", "--quiet"], root)
    other = scratch / "other"
    shutil.rmtree(other, ignore_errors=True)
    git(["clone", "-q", str(root), str(other)], scratch)
    _, result["pull_s"] = run([BIN / "dvc", "pull", "--quiet"], other)
    result["pulled_status_clean"], result["pulled_status_s"] = clean_status(other)

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "exp_show"}, indent=1))
    print(show)
    if not args.workdir:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
