#!/usr/bin/env python
"""Wall time of the demo (`make demo` without the environment set-up) on a fresh copy of the repository.

Clones the committed state (HEAD) into a scratch folder, runs the demo profile there with the current
interpreter's environment, and writes JSON: wall minutes, cores, number of training runs, job wall seconds
summed over Snakemake's per-job benchmarks (by rule), the Snakemake process's own CPU seconds (scheduling, which
the jobs' cores pay for), the commit, and the calibration workload of
scripts/calibration.py timed just before and just after the demo (the machine's speed varies about 2x from day
to day and between CPU types: two readings compare through their ratio to it; a large gap between the two
calibrations says the machine's speed changed during the demo). With --readme it then renders the demo's
numbers, with this timing, into README.md (`noisymlt readme --write`), which keeps them in
docs/demo_numbers.json for the tests.

    python scripts/benchmark_demo.py --json benchmarks/demo.json
    python scripts/benchmark_demo.py --json benchmarks/demo.json --readme    # refresh the README's numbers
    python scripts/benchmark_demo.py --json old.json --commit REV --workdir DIR   # an older commit, kept in DIR

Run it on an otherwise idle machine: other CPU work on the same cores stretches the wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def own_cpu_seconds(proc: subprocess.Popen) -> float:
    """Wait for ``proc``; its own CPU seconds (user + system, not its children's), read from /proc while it runs
    (0 where there is no /proc)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    seconds = 0.0
    while proc.poll() is None:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.5)
    return seconds


def job_seconds(root: Path) -> dict[str, float]:
    """Sum of Snakemake's per-job wall seconds, by rule folder (benchmarks/<phase>/...). Wall, not CPU:
    with workflow.preload a job's work runs in a child of the preload server, which Snakemake's
    benchmark of the job's own process does not see."""
    out: dict[str, float] = {}
    for tsv in sorted((root / "benchmarks").rglob("*.tsv")):
        with open(tsv) as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if rows:
            phase = tsv.parent.name
            out[phase] = out.get(phase, 0.0) + float(rows[-1]["s"] or 0.0)
    return {k: round(v, 1) for k, v in out.items()}


def readme_timing(timing: dict) -> dict:
    """What the README's block says of a timing (and of the older commit's, timed in the same sitting): wall minutes,
    cores, runs, and the calibration workload's seconds (the mean of its readings before and after the demo)."""

    def calibration_s(t: dict) -> float:
        return round((t["calibration"]["before"]["torch_s"] + t["calibration"]["after"]["torch_s"]) / 2, 3)

    out = {k: timing[k] for k in ("wall_minutes", "cores", "runs")}
    if "previous" in timing:
        old = timing["previous"]
        out["calibration_s"] = calibration_s(timing)
        out["previous"] = {"commit": old["commit"], "wall_minutes": old["wall_minutes"], "runs": old["runs"],
                           "calibration_s": calibration_s(old)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True, help="file to write the timing to")
    ap.add_argument("--workdir", help="scratch folder for the clone (default: a temporary folder, removed)")
    ap.add_argument("--readme", action="store_true", help="render the demo's numbers and this timing into README.md")
    ap.add_argument("--previous", help="JSON this script wrote for an older commit in the same sitting: kept in --json "
                    "and named in the README (is the demo slower than it was?)")
    ap.add_argument("--commit", default="HEAD",
                    help="the commit to clone (default HEAD): time an older commit in the same sitting, or keep its "
                         "demo (--workdir) to compare with another's (scripts/compare_runs.py)")
    args = ap.parse_args()

    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    if dirty:
        print("warning: uncommitted changes are not part of the measured clone", file=sys.stderr)
    scratch = Path(args.workdir or tempfile.mkdtemp(prefix="noisymlt-demo-"))
    clone = scratch / "noisymlt"
    if clone.exists():
        shutil.rmtree(clone)
    subprocess.run(["git", "clone", "--quiet", "--local", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "checkout", "--quiet", args.commit], cwd=clone, check=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "PYTHONPATH": str(clone / "src")}
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    sys.path.insert(0, str(REPO / "scripts"))
    from calibration import calibrate

    before = calibrate()
    t0 = time.perf_counter()
    proc = subprocess.Popen([snakemake, "--profile", "workflow/profiles/demo", "--quiet", "rules"], cwd=clone, env=env)
    scheduler_cpu = own_cpu_seconds(proc)
    if proc.returncode:
        raise SystemExit(f"the demo failed (exit {proc.returncode})")
    wall = time.perf_counter() - t0
    runs = len(list((clone / "benchmarks" / "train").glob("*.tsv")))
    timing = {"wall_minutes": round(wall / 60, 2), "cores": os.cpu_count(), "runs": runs, "commit": commit,
              "job_seconds_by_phase": job_seconds(clone),
              # the Snakemake process itself (DAG, scheduling; its jobs are other processes): CPU it takes from them
              "snakemake_cpu_seconds": round(scheduler_cpu, 1),
              "calibration": {"before": before, "after": calibrate()}}
    if args.previous:
        timing["previous"] = json.loads(Path(args.previous).read_text())
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(timing, indent=1) + "\n")
    print(json.dumps(timing, indent=1))
    if args.readme:
        numbers = json.loads((clone / "reports" / "readme_numbers.json").read_text())
        numbers["timing"] = readme_timing(timing)
        merged = scratch / "demo_numbers.json"
        merged.write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
        subprocess.run([sys.executable, "-m", "noisymlt", "readme", "--numbers", str(merged), "--readme",
                        str(REPO / "README.md"), "--write"], check=True)
    if not args.workdir:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
