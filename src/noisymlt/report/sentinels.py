"""Sentinel runs: the single demo runs the tests retrain to hold the README's numbers to the code, on any CPU.

The demo writes, for ERM, DB-Focal and Ours at the first seed and the middle noise rate, each run's total mAP to
the last bit, the values its model selection chose, the numerics fingerprint the demo ran on
(noisymlt.training.numerics) and the interval a reader may expect the run in on another machine. A retrained
sentinel run is then held

* **exactly** where its fingerprint and chosen values are those of a recorded reading: the README's own, or one
  of ``docs/numerics_readings.json`` (readings taken on other CPU types, to the digits they were read with, of
  the run with the same run id: a reading of an earlier demo's configuration applies to none of today's).
  Runs are bit-reproducible there, so one ulp is a failure;
* **inside its interval** elsewhere: another CPU type's kernels round differently (experiments/cpu_numerics),
  and over a run that grows into another draw of training (the readings differ from each other by whole
  points at the same seed). The interval is the 95% prediction interval of one run from the cell's seeds
  (mean +- t * sd * sqrt(1 + 1/n)): the spread a new draw has, not the narrower interval of the mean the tables
  show. It is wide because a draw is; it still fails a method that breaks, and the exact check above holds every
  bit where the numbers were made.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from noisymlt.core.files import read_json
from noisymlt.errors import NoisyMLTError
from noisymlt.training.numerics import identity

SPOTLIGHT = ("erm", "db_focal", "ours")

KERNEL_WORDS = {"amx": "AMX bf16 kernels", "avx512_bf16": "AVX-512 BF16 kernels",
                "avx512": "AVX-512 kernels", "avx2": "AVX2 kernels",
                "aten": "ATen's reference bf16 kernels (no oneDNN bf16 path: AVX2 only)", "sse": "SSE kernels"}


def describe(fp: dict | None) -> str:
    """One line for a reader: ``torch 2.14.1, CPU on AMD EPYC: AVX2 kernels (ATen AVX2), 1 thread, fp32``."""
    if not fp:
        return "unrecorded numerics (a run made before fingerprints were recorded)"
    precision = {"fp32": "fp32", "bf16": "bf16 autocast", "fp16": "fp16 autocast"}.get(fp["precision"], fp["precision"])
    if fp["device"] == "cuda":
        return f"torch {fp['torch']}, GPU {fp['kernels']}, {precision}"
    threads = f"{fp['threads']} thread{'s' if fp['threads'] != 1 else ''}"
    cpu = f" on {fp['cpu']}" if fp.get("cpu") else ""
    return (f"torch {fp['torch']}, CPU{cpu}: {KERNEL_WORDS.get(fp['kernels'], fp['kernels'])} (ATen {fp['aten']}), "
            f"{threads}, {precision}")


def prediction_interval(values_percent: np.ndarray) -> tuple[float, float] | None:
    """95% prediction interval of one more run, from runs of other seeds (None with fewer than 2)."""
    from scipy import stats

    values = np.asarray(values_percent, dtype=float)
    n = len(values)
    if n < 2:
        return None
    half = float(stats.t.ppf(0.975, n - 1) * values.std(ddof=1) * math.sqrt(1 + 1 / n))
    return round(float(values.mean()) - half, 2), round(float(values.mean()) + half, 2)


def run_numerics(results: pd.DataFrame) -> list[dict]:
    """The distinct numerics fingerprints of the runs in ``results`` (one for a demo made on one machine)."""
    if "numerics" not in results:
        return []
    return [json.loads(text) for text in sorted(results["numerics"].dropna().unique())]


def sentinel_record(results: pd.DataFrame, middle: float, first: int) -> dict:
    """What the README's sentinel runs are held to (see the module doc)."""
    from noisymlt.report.tables import primary_head

    sel = results[(results["metric"] == "mAP") & (results["group"] == "total")]
    runs = {}
    for m in SPOTLIGHT:
        if m not in set(sel["method"]):
            continue
        cell = sel[(sel["method"] == m) & (sel["gamma"] == middle) & (sel["head"] == primary_head(results, m))]
        run = cell[cell["seed"] == first]
        if len(run) != 1:
            continue
        manifest = read_json(run["manifest"].iloc[0], "a run's manifest")
        selected = (manifest["run"].get("selected") or {}).get("values")
        runs[f"{m}/{middle:g}/{first}"] = {"map": float(run["value"].iloc[0]), "selected": selected,
                                           # the run's configuration (its hash): a reading is of this demo's run
                                           # only where it recorded the same
                                           "run_id": str(run["run_id"].iloc[0]),
                                           "interval": prediction_interval(100 * cell["value"].to_numpy())}
    numerics = run_numerics(results)
    return {"numerics": numerics[0] if len(numerics) == 1 else None, "runs": runs}


def read_readings(path: str | Path) -> list[dict]:
    record = read_json(path, "the recorded numerics readings", require_object=True)
    if "readings" not in record:
        raise NoisyMLTError(f"{path}: cannot read the recorded numerics readings (no 'readings')")
    return record["readings"]


def _same_selection(a: dict | None, b: dict | None) -> bool:
    a, b = a or {}, b or {}
    return a.keys() == b.keys() and all(abs(float(a[k]) - float(b[k])) < 1e-12 for k in a)


def check(key: str, got: dict, sentinels: dict, readings: list[dict]) -> tuple[str, bool, str]:
    """One retrained sentinel run against what is recorded: (mode, ok, message). ``got``: its ``map`` (a
    fraction, as metrics.json has it), ``selected`` values and ``numerics`` fingerprint (from its manifest)."""
    mine = identity(got.get("numerics"))
    value = 100 * got["map"]
    own = sentinels["runs"][key]
    if mine is not None and mine == identity(sentinels["numerics"]) and _same_selection(got["selected"], own["selected"]):
        ok = got["map"] == own["map"]
        return "exact", ok, (f"{key}: {value!r}, recorded {100 * own['map']!r} on this fingerprint (the README's); "
                             "must be bit-identical")
    for reading in readings:
        run = reading["runs"].get(key)
        if run and run.get("run_id") != own.get("run_id"):
            continue  # a reading of another demo's run (another toy or profile): not this run's numbers
        if run and mine is not None and mine == identity(reading["numerics"]) and _same_selection(got["selected"],
                                                                                                   run.get("selected")):
            digits = int(run["digits"])
            ok = round(value, digits) == run["map_percent"]
            return "exact", ok, (f"{key}: {value:.{digits}f}, recorded {run['map_percent']:.{digits}f} on this "
                                 f"fingerprint ({reading['made_by']})")
    lo, hi = own["interval"]
    ok = lo <= value <= hi
    return "interval", ok, (f"{key}: {value:.4f} on a fingerprint with no recorded reading ({describe(got.get('numerics'))}); "
                            f"expected in [{lo:.2f}, {hi:.2f}], the 95% prediction interval of one run; the exact "
                            f"numbers belong to {describe(sentinels['numerics'])}")
