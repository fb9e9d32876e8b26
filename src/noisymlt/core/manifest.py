"""Manifests: what each step read and wrote, with content hashes, code version and environment.

Every step writes ``<output>.manifest.json`` (or ``manifest.json`` in a run folder). Table writers
add a sidecar mapping each cell to run ids; ``noisymlt trace`` (noisymlt.pipeline.trace) walks from a cell to the inputs.

A manifest is a tracked output (DVC hashes it), so it holds only what the result depends on: the same
inputs, code and configuration give the same bytes, and a rerun with identical results is no new
version. When, where and how long a step ran (start/end times, wall seconds, host, SLURM job id) goes
to ``<manifest stem>.timing.json`` beside it, which no pipeline declares and .dvcignore skips.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from noisymlt.core.files import read_json, write_json
from noisymlt.errors import NoisyMLTError

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the package (this module is in noisymlt/core)


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


# The libraries results can depend on: (import name, distribution name)
LIBRARIES = (("numpy", "numpy"), ("torch", "torch"), ("torchvision", "torchvision"), ("pandas", "pandas"),
             ("pyarrow", "pyarrow"), ("sklearn", "scikit-learn"), ("pycocotools", "pycocotools"))


def environment(device: str | None = None) -> dict:
    """What the results depend on (library versions, platform, device): part of the tracked manifest.
    The installed versions, whether or not this process imported them: a step run in a preloaded
    process (noisymlt.pipeline.preload) must record what a fresh one records."""
    from importlib import metadata

    versions = {"python": sys.version.split()[0]}
    for name, dist in LIBRARIES:
        try:
            versions[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return {
        "versions": versions,
        "platform": platform.platform(),
        "device": device,
    }


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def timing_path(manifest: str | Path) -> Path:
    """``manifest.json`` -> ``manifest.timing.json``, ``metrics.manifest.json`` -> ``metrics.manifest.timing.json``."""
    manifest = Path(manifest)
    return manifest.with_name(manifest.stem + ".timing.json")


def write_timing(manifest: str | Path, started: str, extra: dict | None = None) -> Path:
    """The untracked record of one execution of a step (times, host, SLURM job): never a pipeline output,
    so a rerun that reproduces the results leaves every tracked file byte-identical."""
    finished = now()
    record = {
        "started": started,
        "finished": finished,
        "seconds": round((dt.datetime.fromisoformat(finished) - dt.datetime.fromisoformat(started)).total_seconds()),
        "host": platform.node(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        **(extra or {}),
    }
    path = timing_path(manifest)
    write_json(path, record, sort_keys=True)
    return path


def write_manifest(path: str | Path, *, step: str, inputs: dict[str, str | Path], outputs: dict[str, str | Path],
                   started: str, code: tuple[str, ...], extra: dict | None = None, device: str | None = None,
                   timing: dict | None = None, code_digest: str | None = None) -> Path:
    """``code``: the entry modules of the step (noisymlt.core.codedeps); their import closure and its digest
    (the value Snakemake passes the job as its code param) go into the manifest: ``code_digest`` when the
    step took it when it started (the code it loaded), else the digest as this process first read it.
    ``started`` and ``timing`` (e.g. seconds per epoch) go to the untracked timing file beside it."""
    from noisymlt import __version__
    from noisymlt.core import codedeps

    path = Path(path)
    manifest = {
        "step": step,
        "noisymlt_version": __version__,
        "git": git_info(),
        "code_digest": code_digest or codedeps.digest(*code),
        "code_entries": list(code),  # what `noisymlt trace` digests again to tell whether the source moved on
        "code_modules": codedeps.closure(*code),
        "inputs": {k: {"path": str(v), "sha256": file_sha256(v)} for k, v in inputs.items() if v},
        "outputs": {k: {"path": str(v), "sha256": file_sha256(v)} for k, v in outputs.items() if v},
        "environment": environment(device),
        **(extra or {}),
    }
    write_json(path, manifest, sort_keys=True)
    write_timing(path, started, timing)
    return path


def run_id(resolved: dict) -> str:
    """A run's id: the hash of its resolved configuration (noisymlt.config.resolve_run), which every manifest,
    result row and table cell refers to."""
    blob = json.dumps(resolved, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


# ------------------------------------------------------------------------------ inputs against their records

def producer_record(path: str | Path) -> tuple[Path, dict, dict] | None:
    """(manifest, its record, the output entry) of the step that wrote ``path``, where that step left one:
    ``<stem>.manifest.json`` beside the file (an image cache, metrics, weights) or ``manifest.json`` in its
    folder (a training run's predictions and checkpoint). None for a file no step of this project recorded
    (a label table, which carries its own digests; a file the user brought)."""
    path = Path(path)
    for candidate in (path.with_name(path.stem + ".manifest.json"), path.with_name("manifest.json")):
        if not candidate.is_file():
            continue
        try:
            record = read_json(candidate)
        except NoisyMLTError:
            continue  # not a manifest this check can read: the producer's own checks own it
        outputs = record.get("outputs") if isinstance(record, dict) else None
        for entry in (outputs or {}).values():
            if isinstance(entry, dict) and Path(str(entry.get("path", ""))).name == path.name:
                return candidate, record, entry
    return None


def check_inputs(inputs: dict[str, str | Path | None]) -> dict[str, str]:
    """Each input's sha256, after checking it against the record of the step that wrote it
    (``producer_record``): content that changed since (a flipped byte, an edit, a copy from elsewhere) stops
    the step before it uses the file, with one line naming the file, both hashes and the step that rebuilds it."""
    hashes = {}
    for name, path in inputs.items():
        if not path or not Path(path).is_file():
            continue
        hashes[name] = got = file_sha256(path)
        found = producer_record(path)
        if found is None:
            continue
        manifest, record, entry = found
        if entry.get("sha256") != got:
            raise NoisyMLTError(
                f"{path}: content sha256 {got[:16]} is not what `noisymlt {record.get('step', '?')}` wrote "
                f"(sha256 {str(entry.get('sha256'))[:16]}, recorded in {manifest}); the file changed since: delete "
                f"it and rerun the workflow (or `noisymlt {record.get('step', '?')}`) to rebuild it")
    return hashes
