#!/usr/bin/env python
"""Wheels for the device check's Snakemake parts (end_to_end, smoke, grid_wall) on a GPU machine without Snakemake.

A GPU machine often has torch and the scientific stack but not Snakemake, and no network. Run this with the
project's venv on a machine that reaches the package index; it downloads Snakemake and every distribution it
needs, at the versions installed in this venv, as wheels for the GPU machine's Python into benchmarks/wheels/,
which scripts/device_check.sh unpacks there (each only when the GPU machine cannot import it already):

    .venv/bin/python scripts/device_wheels.py --python-version 3.12      # then carry benchmarks/wheels along

A distribution without a wheel on the index (connection_pool) is built here with `pip wheel` (pure Python).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"]


def closure(root: str) -> dict[str, str]:
    """name -> installed version of ``root`` and everything it requires (extras and markers not for this
    interpreter left out), from this venv's metadata."""
    seen: dict[str, str] = {}
    todo = [root]
    while todo:
        name = re.split(r"[ ;<>=!~\[(]", todo.pop(), maxsplit=1)[0].strip()
        key = name.lower().replace("_", "-")
        if not key or key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional dependency this venv does not have
        seen[key] = dist.version
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            from packaging.requirements import Requirement

            r = Requirement(req)
            if r.marker is None or r.marker.evaluate():
                todo.append(r.name)
    return seen


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python-version", nargs="+", default=["3.12"],
                    help="the GPU machine's Python (major.minor); several when unsure: compiled modules of each "
                         "version have their own file names, so they unpack side by side")
    ap.add_argument("--dest", default=str(REPO / "benchmarks" / "wheels"))
    ap.add_argument("--root", default="snakemake")
    args = ap.parse_args()
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    pins = closure(args.root)
    pip = [sys.executable, "-m", "pip"]
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    missing = []
    for name, version in sorted(pins.items()):
        got = []
        for py in args.python_version:
            cmd = [*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", py,
                   "--implementation", "cp", *plat, "-d", str(dest), f"{name}=={version}"]
            got.append(subprocess.run(cmd, capture_output=True, text=True).returncode == 0)
        if not all(got):
            built = subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "-w", str(dest), f"{name}=={version}"],
                                   capture_output=True, text=True)
            if built.returncode != 0:
                missing.append(f"{name}=={version}")
    print(f"{len(pins) - len(missing)} of {len(pins)} distributions as wheels in {dest}")
    if missing:
        print("no wheel:", ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
