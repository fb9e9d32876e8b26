"""Manifests: what each step read and wrote, with content hashes, code version and environment.

Every step writes ``<output>.manifest.json`` (or ``manifest.json`` in a run folder). Table writers
add a sidecar mapping each cell to run ids; ``noisymlt trace`` walks from a cell to the inputs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def git_info(cwd: Path | None = None) -> dict:
    cwd = cwd or Path.cwd()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    if commit.returncode != 0:
        return {"commit": None, "dirty": None}
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def environment(device: str | None = None) -> dict:
    versions = {"python": sys.version.split()[0]}
    for mod in ("numpy", "torch", "torchvision", "pandas", "pyarrow", "sklearn", "pycocotools"):
        module = sys.modules.get(mod)
        if module is not None:
            versions[mod] = getattr(module, "__version__", "?")
    return {
        "versions": versions,
        "host": platform.node(),
        "platform": platform.platform(),
        "device": device,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_manifest(path: str | Path, *, step: str, inputs: dict[str, str | Path], outputs: dict[str, str | Path],
                   started: str, code: tuple[str, ...], extra: dict | None = None, device: str | None = None) -> Path:
    """``code``: the entry modules of the step (noisymlt.codedeps); their import closure and its digest
    (the value Snakemake passes the job as its code param) go into the manifest."""
    from noisymlt import __version__, codedeps

    path = Path(path)
    manifest = {
        "step": step,
        "noisymlt_version": __version__,
        "git": git_info(),
        "code_digest": codedeps.digest(*code),
        "code_modules": codedeps.closure(*code),
        "inputs": {k: {"path": str(v), "sha256": file_sha256(v)} for k, v in inputs.items() if v},
        "outputs": {k: {"path": str(v), "sha256": file_sha256(v)} for k, v in outputs.items() if v},
        "environment": environment(device),
        "started": started,
        "finished": now(),
        **(extra or {}),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def trace(sidecar: Path, cell: str, runs_root: Path) -> list[dict]:
    """Manifests behind one table cell (``ROW/COLUMN`` as written in the sidecar)."""
    from noisymlt.errors import NoisyMLTError

    cells = json.loads(sidecar.read_text())["cells"]
    if cell not in cells:
        sample = ", ".join(list(cells)[:4])
        raise NoisyMLTError(f"{sidecar}: no cell {cell!r} (cells look like: {sample}, ...)")
    out = []
    for entry in cells[cell]["runs"]:
        manifest = Path(entry["manifest"])
        out.append(json.loads(manifest.read_text()) if manifest.exists() else {"missing": str(manifest)})
    return out


def _cmd_trace(args: argparse.Namespace) -> int:
    for m in trace(Path(args.sidecar), args.cell, Path(args.runs)):
        if "missing" in m:
            print(f"MISSING manifest {m['missing']}")
            continue
        print(f"run {m.get('run_id')}  {m.get('run', {}).get('method')}  gamma={m.get('run', {}).get('gamma')} "
              f"seed={m.get('run', {}).get('seed')}  git={m['git'].get('commit')}{' (dirty)' if m['git'].get('dirty') else ''}")
        print(f"    code {m.get('code_digest')}  ({len(m.get('code_modules', []))} package modules)")
        for name, rec in m["inputs"].items():
            print(f"    in  {name:<14} {rec['sha256'][:16]}  {rec['path']}")
        for name, rec in m["outputs"].items():
            print(f"    out {name:<14} {rec['sha256'][:16]}  {rec['path']}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("trace", help="show the runs and input hashes behind one table cell",
                       description="Walk from a table cell (as keyed in the table's .cells.json sidecar, e.g. "
                                   "'erm/toy/0.5') to every run manifest and input/output hash behind it.")
    p.add_argument("cell", help="cell key, METHOD/DATASET/GAMMA")
    p.add_argument("--sidecar", default="reports/table_total.cells.json", help="table sidecar JSON")
    p.add_argument("--runs", default="runs", help="runs folder")
    p.set_defaults(func=_cmd_trace)
