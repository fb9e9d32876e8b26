#!/usr/bin/env python
"""CPU seconds a process spends on the code digests of every step (noisymlt.pipeline.step_code.warm), as a
Snakemake run and the preload server spend them, with the facts kept beside the bytecode and without them.

Each repeat is a fresh interpreter (the digests are per process): `cold` empties the facts folder first, `kept`
reads the facts the run before wrote. The calibration of the same call (scripts/calibration.py) is beside them.

    python scripts/benchmark_codedeps.py --repeats 5 --json codedeps.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from calibration import calibrate  # noqa: E402

# the package's own imports first, outside the timing: what is timed is the digests alone
PROBE = """
import time
from noisymlt.pipeline import step_code
start = time.process_time()
step_code.warm()
print(time.process_time() - start)
"""


def _warm_cpu_s() -> float:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write the reading there as well")
    args = ap.parse_args(argv)

    from noisymlt.core.codedeps import FACTS_DIR

    before = calibrate()
    cold, kept = [], []
    for _ in range(args.repeats):
        shutil.rmtree(FACTS_DIR, ignore_errors=True)
        cold.append(_warm_cpu_s())
        kept.append(_warm_cpu_s())
    record = {"what": "CPU s of step_code.warm() in a fresh process: every step's code digest",
              "cold_s": round(statistics.median(cold), 3), "kept_s": round(statistics.median(kept), 3),
              "repeats": args.repeats, "calibration": {"before": before, "after": calibrate()}}
    text = json.dumps(record, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
