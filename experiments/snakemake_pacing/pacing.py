#!/usr/bin/env python
"""Why does Snakemake's own CPU grow faster than the demo's job count? Its scheduler, after every pass that finds
jobs ready but no free core, arms a timer (threading.Timer) that wakes it again one rate-limit timespan later
(`--max-jobs-per-timespan`, default 100/1s). Every finished job wakes it too, and that pass arms a timer of its own,
so the timers form chains that never end while jobs wait: after k finished jobs about k passes a timespan, each
touching every ready job (Snakemake 9's JobScheduler.schedule). Its CPU then grows with finished jobs x wall time:
the demo's 382 jobs took 455 CPU s of Snakemake in 38 minutes, its 567 jobs 685 s in 46 (docs/benchmarks/demo.json).

This workflow has the demo's shape in small: N jobs of half a second on 2 cores, all ready at once, the demo
profile's scheduler settings (greedy, subsample 8). It runs with each timespan and records Snakemake's own CPU
seconds (its process alone, not the jobs') and the wall time: a longer timespan wakes the scheduler less often and
makes it wait up to one timespan at the end for its last timer.

    python experiments/snakemake_pacing/pacing.py --json experiments/snakemake_pacing/result.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKFLOW = """
rule all:
    input: expand("out/{i}.txt", i=range(int(config["jobs"])))
rule job:
    input: "in.txt"
    output: "out/{i}.txt"
    shell: "sleep 0.5; echo {wildcards.i} > {output}"
"""


def own_cpu_seconds(proc: subprocess.Popen) -> float:
    """``proc``'s own CPU seconds (user + system) read from /proc until it exits."""
    tick, seconds = os.sysconf("SC_CLK_TCK"), 0.0
    while proc.poll() is None:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
        time.sleep(0.2)
    return seconds


def run(folder: Path, jobs: int, timespan: str | None) -> dict:
    shutil.rmtree(folder / "out", ignore_errors=True)
    shutil.rmtree(folder / ".snakemake", ignore_errors=True)
    snakemake = Path(sys.executable).with_name("snakemake")
    cmd = [str(snakemake), "--cores", "2", "--scheduler", "greedy", "--scheduler-subsample", "8", "--quiet",
           "--config", f"jobs={jobs}", *(["--max-jobs-per-timespan", timespan] if timespan else [])]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu = own_cpu_seconds(proc)
    if proc.returncode != 0:
        raise SystemExit(f"snakemake failed: {' '.join(cmd)}")
    return {"timespan": timespan or "100/1s (default)", "snakemake_cpu_s": round(cpu, 1),
            "wall_s": round(time.perf_counter() - start, 1)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--timespans", nargs="+", default=["", "1000/2s", "1000/5s"],
                   help="values of --max-jobs-per-timespan ('' : Snakemake's default)")
    p.add_argument("--json", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "Snakefile").write_text(WORKFLOW)
        (folder / "in.txt").write_text("")
        rows = [run(folder, args.jobs, t or None) for t in args.timespans]
    version = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "--version"], capture_output=True,
                             text=True).stdout.strip()
    from noisymlt.training.numerics import cpu_model

    result = {"jobs": args.jobs, "job_s": 0.5, "cores": 2, "snakemake": version, "cpu": cpu_model(), "runs": rows}
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
