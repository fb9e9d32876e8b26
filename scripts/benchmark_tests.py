#!/usr/bin/env python
"""The suite's wall time and each test's seconds, beside the calibration of the same call.

Runs what `make test` runs after its lint and manual build (pytest on TEST_WORKERS workers, the SLURM and SSH
tests in one of them), with a JUnit report, and writes the wall time, the calibration before and after
(scripts/calibration.py: machines here differ 2x from one day to the next), the counts, the 20 slowest tests and
every test's seconds (setup + call + teardown, as JUnit counts them) and CPU seconds (scripts/test_cpu_seconds.py:
its worker and the children it waited for; the SLURM jobs run under slurmd and are not in it).

    python scripts/benchmark_tests.py --json docs/benchmarks/tests.json          # 20 to 50 min on 2 cores
    python scripts/benchmark_tests.py --workers 0 --json serial.json             # one process
    python scripts/benchmark_tests.py --from-junit report.xml --wall-s 2140 ...  # a report another run wrote

Start the SLURM cluster and the SSH server first (.ci/run does), or their tests are skipped and the reading
leaves them out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from calibration import calibrate  # noqa: E402


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def read_junit(path: Path) -> dict:
    """Each test's seconds and outcome from a JUnit report, keyed by its pytest id (file::name)."""
    tests = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        file = "/".join(module[:2]) + ".py" if len(module) >= 2 else case.get("classname", "")
        name = "::".join([file, *module[2:], case.get("name", "")])
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        tests[name] = {"s": round(float(case.get("time", 0.0)), 2), "outcome": outcome}
    return tests


def read_cpu(folder: Path) -> dict[str, float]:
    """Each test's CPU seconds, from the files scripts/test_cpu_seconds.py wrote (a file a worker)."""
    readings = {}
    for path in sorted(folder.glob("*.json")):
        readings.update(json.loads(path.read_text()))
    return readings


def summary(tests: dict, wall_s: float, workers: int, before: dict, after: dict, cpu: dict | None = None) -> dict:
    counts = {k: sum(1 for t in tests.values() if t["outcome"] == k) for k in ("passed", "failed", "skipped")}
    slowest = sorted(tests.items(), key=lambda kv: -kv[1]["s"])[:20]
    return {
        "what": "pytest of `make test` (after lint-imports and the manual build): wall time, per-test seconds",
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
        "workers": workers, "cpu_count": os.cpu_count(), "wall_s": round(wall_s, 1),
        "sum_of_tests_s": round(sum(t["s"] for t in tests.values()), 1), **counts,
        "calibration": {"before": before, "after": after},
        "minutes_per_torch_s": round(wall_s / 60 / ((before["torch_s"] + after["torch_s"]) / 2), 2),
        "slowest": [{"test": name, "s": t["s"], **({"cpu_s": cpu[name]} if name in (cpu or {}) else {})}
                    for name, t in slowest],
        "tests": {name: t["s"] for name, t in sorted(tests.items())},
        **({"tests_cpu_s": dict(sorted(cpu.items()))} if cpu else {}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, required=True, help="where to write the reading")
    parser.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8),
                        help="pytest-xdist workers, as make test's TEST_WORKERS (0: one process; default: the "
                             "cores, at most 8)")
    parser.add_argument("--from-junit", type=Path, help="read this JUnit report instead of running the suite")
    parser.add_argument("--wall-s", type=float, help="with --from-junit: the wall time of the run that wrote it")
    parser.add_argument("--calibration", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
                        help="with --from-junit: the calibrations (scripts/calibration.py JSON) taken around that run")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    if args.from_junit:
        if args.wall_s is None or args.calibration is None:
            parser.error("--from-junit needs --wall-s and --calibration")
        tests, wall_s, cpu_s, cpu = read_junit(args.from_junit), args.wall_s, None, None
        before, after = (json.loads(path.read_text()) for path in args.calibration)
    else:
        before = calibrate()
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "junit.xml"
            xdist = ["-n", str(args.workers), "--dist", "loadgroup"] if args.workers else []
            readings = Path(tmp) / "cpu"
            readings.mkdir()
            env = {**os.environ, "NOISYMLT_TEST_CPU_DIR": str(readings),
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "scripts"), os.environ.get("PYTHONPATH")]))}
            start, started_cpu = time.perf_counter(), _children_cpu_s()
            proc = subprocess.run([sys.executable, "-m", "pytest", *xdist, "-p", "no:cacheprovider",
                                   "-p", "test_cpu_seconds", f"--junitxml={report}", *args.pytest_args],
                                  cwd=REPO, env=env)
            wall_s, cpu_s = time.perf_counter() - start, _children_cpu_s() - started_cpu
            cpu = read_cpu(readings)
            if not report.exists():
                print(f"pytest wrote no report (exit {proc.returncode})", file=sys.stderr)
                return 1
            tests = read_junit(report)
        after = calibrate()
    record = summary(tests, wall_s, args.workers, before, after, cpu)
    record["cpu_s"] = None if cpu_s is None else round(cpu_s, 1)  # user + system of the processes pytest waited for
    args.json.write_text(json.dumps(record, indent=1) + "\n")
    print(f"{record['passed']} passed, {record['failed']} failed, {record['skipped']} skipped in {wall_s:.0f} s "
          f"({record['minutes_per_torch_s']} min per second of torch_s); slowest:")
    for row in record["slowest"]:
        print(f"  {row['s']:8.1f} s  {row['test']}")
    return 0 if record["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
