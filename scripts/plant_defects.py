"""Plant one-line defects in this checkout, one at a time, and see which test catches each.

A suite made faster must keep its teeth: each defect below is the kind of slip a contributor makes (a sign in a
loss, an off-by-one in the long-tail draw, a skipped integrity check, a wrong path in a rule, ...). For each, the
file is edited in place, the tests named beside it run (`pytest -x`: the first failure ends the run), and the file
is restored byte for byte, also after Ctrl-C. A defect that no named test fails is reported as missed; the script
then exits 1.

    python scripts/plant_defects.py                    # every defect; a table, and --json for the record
    python scripts/plant_defects.py --only db_sign     # one of them
    python scripts/plant_defects.py --list             # the defects and their tests, running nothing

The tests named for a defect are where it should be caught, fast ones first; the slow ones are there because the
defect lives in what only an end-to-end run exercises. Run it on a clean checkout with its venv (`make env`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Defect:
    name: str
    what: str
    path: str  # relative to the checkout
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]


PKG = "src/noisymlt/"
DEFECTS = (
    Defect("db_sign", "the DB loss adds its logit bias instead of subtracting it", PKG + "losses/db.py",
           "z = z - self.logit_bias.to(z.device)", "z = z + self.logit_bias.to(z.device)",
           ("tests/test_losses.py", "tests/test_reference_baselines.py")),
    Defect("longtail_off_by_one", "the long-tail draw takes one image more per class than the Pareto target",
           PKG + "data/longtail.py", "want = ref[rank] - len(chosen_of_class[c])",
           "want = ref[rank] + 1 - len(chosen_of_class[c])", ("tests/test_longtail.py",)),
    Defect("ap_off_by_one", "average precision divides each threshold's hits by one rank too many",
           PKG + "evaluation/metrics.py", "precision = tps / (last + 1)", "precision = tps / (last + 2)",
           ("tests/test_evaluate.py",)),
    Defect("pseudo_label_reversed", "Ours' pseudo labels turn on below the threshold instead of above it",
           PKG + "methods/pseudo_labels.py", "out = torch.where(q > alpha_t, one, noisy_targets)",
           "out = torch.where(q < alpha_t, one, noisy_targets)",
           ("tests/test_method_colearning.py", "tests/test_reference_colearning.py")),
    Defect("noise_half_rate", "the noise model moves each positive with probability gamma / 2, not gamma",
           PKG + "data/noise_models/base.py", "return rng.random(n) < gamma", "return rng.random(n) < gamma / 2",
           ("tests/test_noise.py", "tests/test_noise_models.py")),
    Defect("integrity_skipped", "an input whose bytes changed since its step wrote them is used anyway",
           PKG + "core/manifest.py", 'if entry.get("sha256") != got:', 'if False and entry.get("sha256") != got:',
           ("tests/test_manifest.py", "tests/test_workflow.py")),
    Defect("resume_skips_epoch", "a resumed run starts one epoch after its checkpoint's",
           PKG + "training/trainer.py", 'return int(state["epoch"]), json.loads(state["history"])',
           'return int(state["epoch"]) + 1, json.loads(state["history"])',
           ("tests/test_train.py", "tests/test_workflow_reruns.py")),
    Defect("selection_picks_worst", "model selection keeps the candidate with the lowest validation mAP",
           PKG + "pipeline/selection.py", "best = max(rounded)", "best = min(rounded)",
           ("tests/test_selection.py", "tests/test_selection_record.py")),
    Defect("rule_trains_on_clean", "the train rule hands the clean subset to training as its noisy labels",
           "workflow/rules/train.smk", "--train-labels {input.train} ", "--train-labels {input.subset} ",
           ("tests/test_workflow.py", "tests/test_noise_level.py")),
    Defect("slurm_one_cpu", "the SLURM profile asks one CPU for every job, whatever its threads",
           "workflow/profiles/slurm/config.yaml", "cpus_per_task: threads", "cpus_per_task: 1",
           ("tests/test_slurm_requests.py", "tests/test_profile_slurm.py")),
)


def _pytest(tests: tuple[str, ...]) -> tuple[int, str, float]:
    args = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", "--durations=0", *tests]
    if importlib.util.find_spec("xdist"):  # one process, so that -x stops at the first failure
        args[4:4] = ["-p", "no:xdist"]
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - start


def plant(defect: Defect) -> dict:
    path = REPO / defect.path
    original = path.read_bytes()
    text = original.decode()
    if text.count(defect.old) != 1:
        raise SystemExit(f"{defect.path}: the text of defect {defect.name!r} occurs {text.count(defect.old)} "
                         f"times, not once: update scripts/plant_defects.py")
    try:
        path.write_text(text.replace(defect.old, defect.new))
        status, out, seconds = _pytest(defect.tests)
    finally:
        path.write_bytes(original)
    if status not in (0, 1):  # not a verdict: pytest could not collect or run the tests
        raise SystemExit(f"{defect.name}: pytest exited {status} without running the tests:\n{out[-3000:]}")
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    errors = re.findall(r"^ERROR (\S+)", out, re.M)
    return {"defect": defect.name, "what": defect.what, "file": defect.path, "tests": list(defect.tests),
            "caught": status == 1 and bool(failed or errors), "caught_by": (failed or errors or [None])[0],
            "pytest_exit": status, "seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these defects only (names: --list)")
    parser.add_argument("--list", action="store_true", help="print the defects and their tests, run nothing")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    chosen = [d for d in DEFECTS if not args.only or d.name in args.only]
    unknown = set(args.only or ()) - {d.name for d in DEFECTS}
    if unknown:
        parser.error(f"unknown defect(s) {sorted(unknown)}; known: {[d.name for d in DEFECTS]}")
    if args.list:
        for d in chosen:
            print(f"{d.name}: {d.what}\n    {d.path}: {d.old!r} -> {d.new!r}\n    tests: {' '.join(d.tests)}")
        return 0
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *{d.path for d in chosen}], cwd=REPO,
                           capture_output=True, text=True).stdout
    if dirty.strip():
        raise SystemExit(f"uncommitted edits in the files the defects go into:\n{dirty}")
    sys.path.insert(0, str(REPO / "scripts"))
    from calibration import calibrate

    results = []
    for defect in chosen:
        row = plant(defect)
        results.append(row)
        print(f"{'caught' if row['caught'] else 'MISSED'}  {defect.name:24s} {row['seconds']:7.1f} s  "
              f"{row['caught_by'] or '-'}", flush=True)
    record = {"calibration": calibrate(), "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO,
                                                                   capture_output=True, text=True).stdout.strip(),
              "defects": results}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(r["caught"] for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
