"""Numerics fingerprints (noisymlt.training.numerics) and the sentinel checks that hold the README's numbers on any
CPU (noisymlt.report.sentinels): exact where the fingerprint made them, inside the prediction interval elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from noisymlt.report.sentinels import check, describe, prediction_interval, read_readings
from noisymlt.training.numerics import cpu_kernels, fingerprint, identity

REPO = Path(__file__).resolve().parents[1]
NUMBERS = json.loads((REPO / "docs" / "demo_numbers.json").read_text())
READINGS = read_readings(REPO / "docs" / "numerics_readings.json")

AVX2 = frozenset({"avx", "avx2", "fma"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def test_the_kernels_follow_the_cpus_instruction_set_and_onednns_cap():
    amx = AVX512 | {"avx512_bf16", "amx_tile", "amx_bf16"}
    assert [cpu_kernels("bf16", f, 9) for f in (amx, AVX512 | {"avx512_bf16"}, AVX512, AVX2)] == [
        "amx", "avx512_bf16", "avx512", "aten"]
    assert [cpu_kernels("fp32", f, 9) for f in (amx, AVX512, AVX2)] == ["avx512", "avx512", "avx2"]
    # ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 on an AMX machine: oneDNN takes the AVX-512 BF16 kernels
    assert cpu_kernels("bf16", amx, 4) == "avx512_bf16" and cpu_kernels("fp32", amx, 2) == "avx2"


def test_this_machines_fingerprint_names_what_decides_its_numbers():
    import torch

    fp = fingerprint("cpu", "fp32", 1)
    assert fp == {"torch": torch.__version__, "device": "cpu", "kernels": cpu_kernels("fp32"),
                  "aten": torch.backends.cpu.get_cpu_capability(), "threads": 1, "precision": "fp32"}
    assert identity({**fp, "cpu": "a model"}) == identity({**fp, "cpu": "a model"}) != identity({**fp, "threads": 2})
    assert identity({**fp, "cpu": "a model"}) != identity({**fp, "cpu": "another model"})
    assert describe(fp).startswith(f"torch {torch.__version__}, CPU: ") and describe(fp).endswith("1 thread, fp32")


def test_the_prediction_interval_of_one_run_is_students():
    lo, hi = prediction_interval(np.array([50.0, 52.0, 54.0]))
    half = stats.t.ppf(0.975, 2) * 2.0 * np.sqrt(1 + 1 / 3)  # sd 2 over 3 seeds: 9.94
    assert (lo, hi) == (round(52 - half, 2), round(52 + half, 2)) == (42.06, 61.94)
    assert prediction_interval(np.array([50.0])) is None


def _recorded(key: str) -> dict:
    run = NUMBERS["sentinels"]["runs"][key]
    return {"map": run["map"], "selected": run["selected"], "numerics": NUMBERS["sentinels"]["numerics"]}


@pytest.mark.parametrize("key", sorted(NUMBERS["sentinels"]["runs"]))
def test_on_the_readmes_fingerprint_a_sentinel_run_is_held_to_the_bit(key):
    sentinels = NUMBERS["sentinels"]
    assert check(key, _recorded(key), sentinels, READINGS)[:2] == ("exact", True)
    moved = {**_recorded(key), "map": float(np.nextafter(sentinels["runs"][key]["map"], 1.0))}  # one ulp
    mode, ok, message = check(key, moved, sentinels, READINGS)
    assert (mode, ok) == ("exact", False) and "bit-identical" in message


@pytest.mark.parametrize("key", sorted(NUMBERS["sentinels"]["runs"]))
def test_on_another_fingerprint_a_sentinel_run_must_land_in_its_interval(key):
    sentinels = NUMBERS["sentinels"]
    lo, hi = sentinels["runs"][key]["interval"]
    foreign = {**_recorded(key), "numerics": {**sentinels["numerics"], "kernels": "made-up", "cpu": "another CPU"}}
    for value, expected in ((lo + 0.01, True), (hi - 0.01, True), (lo - 0.01, False), (hi + 0.01, False)):
        mode, ok, message = check(key, {**foreign, "map": value / 100}, sentinels, READINGS)
        assert (mode, ok) == ("interval", expected), message
    assert describe(sentinels["numerics"]) in message  # says which fingerprint the exact numbers belong to
    if key.startswith("ours"):  # another selected value on the README's fingerprint: another config, not exact
        other = {**_recorded(key), "selected": {**(sentinels["runs"][key]["selected"] or {}), "beta": 0.95}}
        assert check(key, other, sentinels, READINGS)[0] == "interval"


def test_the_other_cpu_types_readings_are_held_through_the_readmes_intervals():
    """The readings taken on other CPU types (docs/numerics_readings.json) are exact on their own fingerprints, and
    those of the README's precision land inside the README's intervals, which is what the README tells a reader of
    another machine to expect. A reading of another precision is another run configuration (cpu_precision is part
    of the run id: the demo profile before it moved to fp32), held to its own digits only."""
    intel = next(r for r in READINGS if r["numerics"]["kernels"] == "amx")
    # issue 36: Intel Xeon with AMX, torch 2.14.1, one thread, bf16 autocast, fresh clone of 4043a88
    assert {k: r["map_percent"] for k, r in intel["runs"].items()} == {
        "erm/0.5/0": 48.3210, "db_focal/0.5/0": 44.9214, "ours/0.5/0": 46.4764}
    assert intel["runs"]["ours/0.5/0"]["selected"] == {"lr": 0.02, "alpha": 0.8, "beta": 0.1}
    precision = NUMBERS["sentinels"]["numerics"]["precision"]
    own = NUMBERS["sentinels"]["runs"]
    # the readings of the README's own runs (same run ids); older ones read an earlier demo's configurations
    current = [r for r in READINGS if all(run.get("run_id") == own[k].get("run_id") for k, run in r["runs"].items())]
    same = [r for r in current if r["numerics"]["precision"] == precision]
    assert same, f"no reading of another CPU type at the README's precision ({precision}) of the README's runs"
    assert all(identity(r["numerics"]) != identity(NUMBERS["sentinels"]["numerics"]) for r in READINGS)
    for reading in current:
        for key, run in reading["runs"].items():
            got = {"map": run["map_percent"] / 100, "selected": run["selected"], "numerics": reading["numerics"]}
            mode, ok, message = check(key, got, NUMBERS["sentinels"], READINGS)
            assert (mode, ok) == ("exact", True), message  # its own fingerprint: exact to its digits
            if reading in same:
                foreign = {**got, "numerics": {**reading["numerics"], "kernels": "unrecorded"}}
                mode, ok, message = check(key, foreign, NUMBERS["sentinels"], READINGS)
                assert (mode, ok) == ("interval", True), f"{reading['made_by']}: {message}"


def test_the_demo_profile_says_what_its_precision_and_tie_margin_measurements_gave():
    """The profile's choices rest on experiments/cpu_numerics: its sentences quote the frozen results."""
    import yaml

    text = (REPO / "workflow" / "profiles" / "demo" / "params.yaml").read_text()
    profile = yaml.safe_load(text)
    cost = json.loads((REPO / "experiments" / "cpu_numerics" / "result.json").read_text())
    steps = cost["step_cpu_seconds"]
    assert f"{cost['bf16_over_fp32']:.1f}x slower than fp32" in text
    assert f"{steps['bf16']:.2f} vs {steps['fp32']:.2f} CPU s" in text and cost["fp32_changes_with_kernels"]
    assert profile["train"]["cpu_precision"] == profile["pretrain"]["toy_glyphs"]["cpu_precision"] == "fp32"
    margin = json.loads((REPO / "experiments" / "cpu_numerics" / "tie_margin.json").read_text())
    assert profile["selection"]["tie_margin"] == margin["tie_margin"]
    assert f"({margin['pair_difference_sd']['between_sets']:.2f})" in text


def test_a_reading_of_another_demos_run_is_not_held_against_this_one():
    """A reading names the run id it read (the run's configuration hash): on its fingerprint, a reading of the same
    run is exact, one of an earlier demo's run (another toy, another profile) gives way to the interval."""
    key = sorted(NUMBERS["sentinels"]["runs"])[0]
    own = NUMBERS["sentinels"]["runs"][key]
    fp = {**NUMBERS["sentinels"]["numerics"], "kernels": "made-up"}
    got = {"map": own["map"], "selected": own["selected"], "numerics": fp}
    reading = {"made_by": "test", "numerics": fp,
               "runs": {key: {"map_percent": round(100 * own["map"], 4), "digits": 4, "selected": own["selected"],
                              "run_id": own["run_id"]}}}
    assert check(key, got, NUMBERS["sentinels"], [reading])[:2] == ("exact", True)
    reading["runs"][key]["run_id"] = "an-earlier-demos-run"
    assert check(key, got, NUMBERS["sentinels"], [reading])[:2] == ("interval", True)
