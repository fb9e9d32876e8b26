"""The demo under DVC, and DVC recording a Snakemake run.

- Statically: every output dvc.yaml declares for the demo is written by the demo's Snakemake route, so
  `dvc commit` after `snakemake` finds them all (paper scale: test_dvc.py).
- For real, on a reduced demo (one noise rate, ERM, one epoch, a small source task): `make demo-dvc` in a
  fresh git clone leaves `dvc status` clean; a forced rerun of a slice rewrites the same bytes; push, wipe
  outputs and cache, pull gives the same bytes.
- Snakemake's demo route in another clone of the same commit, then `dvc commit`: `dvc status` is clean and
  every output has the hash the DVC route gave it. Both routes write the same bytes, so a rerun (by either
  tool) of identical results is no new DVC version: no time, duration or host inside a tracked file.
- The manual's SSH route (docs/dvc.md): the reduced demo's data and models pushed to an ssh:// remote (a real
  sshd on localhost: tests/ssh/start_sshd.sh, which CI runs), pulled into a fresh clone of the repository,
  where `dvc status` is clean and every output has the same bytes.

Each real route runs in its own clone under tmp_path with its own DVC state, config and cache folders.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_dvc import (BIN, DVC, SNAKEMAKE, _digests, _needs_tools, _run, dvc_outputs, snakemake_only,
                      snakemake_outputs, unwritten_outputs)

from noisymlt.pipeline.dvc_yaml import address

REPO = Path(__file__).resolve().parents[1]
SSHD_START, SSHD_STOP = REPO / "tests" / "ssh" / "start_sshd.sh", REPO / "tests" / "ssh" / "stop_sshd.sh"
SSHD_DIR = Path(os.environ.get("NOISYMLT_SSHD_DIR", "/run/noisymlt-sshd"))  # start_sshd.sh's folder
DEMO = ("params.yaml", "workflow/profiles/demo/params.yaml")
# The demo reduced to seconds: one noise rate, one epoch, a small source task for the pretrained backbone.
TINY_LAYER = {
    # no ablations (Snakemake's only: their runs would enter its results.parquet, not DVC's) and no timing runs
    "grid": {"datasets": ["toy"], "gammas": [0.5], "seeds": [0], "methods": ["erm"], "ablations": [], "clean_methods": []},
    "timing": {"methods": ["erm"], "trials": 1, "batch_sizes": [1]},
    "datasets": {"toy": {"toy": {"seed": 0, "n_trainval": 240, "n_test": 60, "size": 32, "scenes": "glyph"},
                         "longtail": {"source": "pareto", "b": 6, "max": 60, "min": 3, "seed": 0, "groups": "fixed"}}},
    "train": {"epochs": 1, "batch_size": 16, "warmup_iters": 2, "lr_steps": [1], "eval_batch_size": 64},
    # a schedule's keys win over the train block: the demo's recipes set their own epochs
    "schedules": {name: {"train": {"warmup_iters": 2, "epochs": 1, "lr_steps": [1]}}
                  for name in ("db", "db_random")},
    "pretrain": {"toy_glyphs": {"epochs": 1,
                                "source": {"classes": 8, "images_per_class": 16, "held_out_per_class": 4}}},
}
LAYERS = (*DEMO, "tiny.yaml")


def _git_env() -> dict:
    who = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.org", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z"}
    return {**who, **{k.replace("AUTHOR", "COMMITTER"): v for k, v in who.items()}}


def _git(args: list, cwd: Path) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **_git_env()},
                          timeout=120)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> Path:
    """A git repository holding the working tree as it is (tracked and untracked, not ignored files), plus
    the reduced demo layer: what a fresh clone of this commit would get."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("origin")
    files = _git(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], REPO).split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_symlink() or src.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / name, follow_symlinks=False)
    (root / "tiny.yaml").write_text(yaml.safe_dump(TINY_LAYER, sort_keys=False))
    _git(["init", "-q"], root)
    _git(["add", "-A"], root)
    _git(["commit", "-q", "-m", "snapshot"], root)
    return root


def _clone(origin: Path, dest: Path) -> Path:
    _git(["clone", "-q", str(origin), str(dest)], dest.parent)
    return dest


def _lock_outs(root: Path) -> dict[str, str]:
    """Output path -> md5 as the dvc.lock files record it (a directory: its listing's hash): the root's and the
    run stages' shards'."""
    locks = [root / "dvc.lock", *sorted((root / "workflow" / "dvc" / "runs").glob("*/dvc.lock"))]
    stages = [s for lock in locks for s in yaml.safe_load(lock.read_text())["stages"].values()]
    return {o["path"]: o["md5"] for stage in stages for o in stage.get("outs", [])}


def smk_ablation_methods(root: Path) -> set[str]:
    """Methods the demo trains for its ablations only (not in its main grid)."""
    from noisymlt.config import load_params

    params = load_params(*(root / f for f in DEMO))
    return {m for name in params["grid"]["ablations"] for m in params["ablations"][name]["methods"]} - set(
        params["grid"]["methods"])


def test_every_dvc_output_of_the_demo_is_written_by_its_snakemake_route(tmp_path, origin):
    """`dvc commit` after `snakemake --profile workflow/profiles/demo` needs every DVC output on disk (paper
    scale: test_dvc.test_dvc_plans_the_jobs_snakemake_plans); and DVC covers every Snakemake job."""
    _needs_tools()
    root = _clone(origin, tmp_path / "proj")
    _run([sys.executable, "-m", "noisymlt", "params", *DEMO, "--out", "dvc-params.json"], root)
    _run([DVC, "init", "--quiet"], root)
    outs = {o for paths in dvc_outputs(root).values() for o in paths}
    smk = snakemake_outputs(root, "--profile", "workflow/profiles/demo")
    assert unwritten_outputs(outs, smk) == []
    # Snakemake-only, as dvc.yaml's header says: ablation tables and figures, timings, README numbers; the
    # ablations' runs and every job's requested config are DVC outputs too
    uncovered = sorted(f for f in smk if not any(f == o or f.startswith(o + "/") for o in outs)
                       and not snakemake_only(f))
    assert uncovered == []
    ablation_runs = {f"runs/toy/g0.5/s0/{m}/predictions.npz" for m in smk_ablation_methods(root)}
    assert len(ablation_runs) > 10 and ablation_runs <= outs
    assert "runs/toy/g0.5/s0/erm/requested_config.json" in outs
    assert {"reports/table_groups_toy.html", "reports/map_vs_gamma.pdf"} <= outs
    assert smk["data/code"] == "code_digests" and smk["data/pretrained/toy_glyphs.pt"] == "pretrain"
    assert {"data/pretrained/toy_glyphs.pt", "data/raw/toy", "runs/toy/g0.9/s0/erm/checkpoint.pt"} <= outs


@pytest.fixture(scope="module")
def dvc_demo(origin, tmp_path_factory) -> Path:
    """The README's DVC demo command (`make demo-dvc`) on the reduced demo, in a fresh clone."""
    _needs_tools()
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = _clone(origin, tmp_path_factory.mktemp("dvc") / "proj")
    _run(["make", "demo-dvc", f"VENV={BIN.parent}", "STAMP=", f"DEMO_PARAMS={' '.join(LAYERS)}"], root, timeout=900)
    return root


@pytest.mark.slow
def test_dvc_demo_route_is_clean_and_round_trips(dvc_demo, tmp_path):
    from noisymlt.config import load_params, resolve_run
    from noisymlt.core.manifest import run_id

    root, run = dvc_demo, dvc_demo / "runs" / "toy" / "g0.5" / "s0" / "erm"
    assert "| ERM |" in (root / "reports" / "table_total.md").read_text()
    assert (root / "data" / "pretrained" / "toy_glyphs.pt").is_file()
    # the run the Snakemake rule would train (same resolved config, hence id), from the pretrained backbone
    manifest = json.loads((run / "manifest.json").read_text())
    params = load_params(*(root / f for f in LAYERS))
    assert manifest["run_id"] == run_id(resolve_run(params, "toy", "erm", 0.5, 0))
    assert manifest["run"]["train"]["weights_path"] == "data/pretrained/toy_glyphs.pt"
    assert 0 < json.loads((run / "metrics.json").read_text())["heads"]["main"]["map"]["total"] <= 1
    assert (run / "manifest.timing.json").is_file()  # beside the outputs, not one of them
    assert json.loads(_run([DVC, "status", "--json"], root).strip().splitlines()[-1]) == {}

    # a forced rerun of a slice rewrites the same bytes; persist: train resumes from its finished checkpoint
    lock = _lock_outs(root)
    forced = _run([DVC, "repro", "--force", "--single-item", "noise@toy-0.5-0", address("toy-0.5-0-erm"),
                   "aggregate", "table_total", "figure_map_vs_gamma"], root)
    assert "resumed runs/toy/g0.5/s0/erm/checkpoint.pt from epoch 1" in forced, forced
    assert _lock_outs(root) == lock
    # the rerun wrote new files in place of its outputs instead of writing into them: every cache object still
    # has its hash (what makes links, `dvc config cache.type hardlink`, safe to use)
    objects = [f for f in (root / ".dvc" / "cache" / "files" / "md5").rglob("*") if f.is_file()
               and not f.name.endswith(".dir")]
    assert len(objects) > 300
    assert [f for f in objects if hashlib.md5(f.read_bytes()).hexdigest() != f.parent.name + f.name] == []
    assert json.loads(_run([DVC, "status", "--json"], root).strip().splitlines()[-1]) == {}

    store = tmp_path / "store"
    _run([DVC, "remote", "add", "-d", "store", store], root)
    _run([DVC, "push"], root)
    before = _digests(root)
    assert len(before) > 300 and "runs/toy/g0.5/s0/erm/checkpoint.pt" in before  # raw images included
    _git(["clean", "-qfdX", "data", "runs", "reports"], root)  # every file git ignores there: the outputs
    shutil.rmtree(root / ".dvc" / "cache")
    assert not (root / "runs").exists() and not (root / "data").exists()
    _run([DVC, "pull"], root)
    assert _digests(root) == before
    assert json.loads(_run([DVC, "status", "--json"], root).strip().splitlines()[-1]) == {}
    again = _run([DVC, "repro"], root)
    assert "Running stage" not in again and "up to date" in again


@pytest.mark.slow
def test_snakemake_then_dvc_commit_records_the_same_versions(dvc_demo, origin, tmp_path):
    """A second, independent execution (another clone, the other tool) gives every tracked output the hash
    the DVC route gave it: no time or host in a tracked file, so a rerun is no new version."""
    root = _clone(origin, tmp_path / "proj")
    # first, as `make demo-dvc` did: `dvc init` stages .dvc/config, which manifests record as a dirty tree
    _run([DVC, "init", "--quiet"], root)
    _run([SNAKEMAKE, "--profile", "workflow/profiles/demo", "--configfile", *LAYERS[1:]], root, timeout=900)
    _run([sys.executable, "-m", "noisymlt", "params", *LAYERS, "--out", "dvc-params.json"], root)
    _run([DVC, "commit", "--force"], root)
    assert json.loads(_run([DVC, "status", "--json"], root).strip().splitlines()[-1]) == {}
    assert "up to date" in _run([DVC, "repro"], root)
    # the same commit, params and code: Snakemake's jobs wrote byte for byte what DVC's stages wrote
    assert _lock_outs(root) == _lock_outs(dvc_demo)


def _sshd_details() -> dict | None:
    """What start_sshd.sh wrote for a client: host, port, user, keyfile, known_hosts."""
    try:
        return json.loads((SSHD_DIR / "remote.json").read_text())
    except (OSError, ValueError):
        return None


def _ssh_refusal(server: dict) -> str | None:
    """Why OpenSSH cannot log in with the server's key, checking its host key against its known_hosts (None: it can)."""
    if shutil.which("ssh") is None:
        return "no ssh client"
    proc = subprocess.run(["ssh", "-F", os.devnull, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                           "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={server['known_hosts']}",
                           "-o", "ConnectTimeout=5", "-i", server["keyfile"], "-p", str(server["port"]),
                           f"{server['user']}@{server['host']}", "true"], capture_output=True, text=True, timeout=60)
    return None if proc.returncode == 0 else proc.stderr.strip() or f"ssh exited {proc.returncode}"


@pytest.fixture(scope="module")
def sshd():
    """An OpenSSH server on localhost that lets this user in with one key (tests/ssh/start_sshd.sh, which CI runs).
    Started here (and stopped after) when none answers, this is root and openssh-server is installed; else skipped."""
    started = False
    server = _sshd_details()
    why = _ssh_refusal(server) if server else f"no {SSHD_DIR / 'remote.json'}"
    if why is not None and os.geteuid() == 0 and Path("/usr/sbin/sshd").exists():
        # the test installs nothing: without the package it skips, and CI's run of the script installs it
        proc = subprocess.run(["bash", str(SSHD_START)], env={**os.environ, "NOISYMLT_SSHD_NO_INSTALL": "1"},
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            pytest.skip(f"no SSH server on localhost: tests/ssh/start_sshd.sh failed: {proc.stderr.strip()[-600:]}")
        started, server = True, _sshd_details()
        why = _ssh_refusal(server) if server else f"no {SSHD_DIR / 'remote.json'}"
    if why is not None:
        pytest.skip(f"no SSH server on localhost that lets this user in ({why}): start one as root with "
                    "tests/ssh/start_sshd.sh (CI does)")
    yield server
    if started:
        subprocess.run(["bash", str(SSHD_STOP)], capture_output=True, timeout=60)


def _status(root: Path, *args: str) -> dict:
    return json.loads(_run([DVC, "status", *args, "--json"], root, timeout=600).strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.ssh
def test_data_and_models_round_trip_through_an_ssh_remote(sshd, dvc_demo, tmp_path, monkeypatch):
    """docs/dvc.md's SSH route: commit what a clone needs, `dvc push` to an ssh:// remote, clone the repository
    elsewhere, `dvc pull`: `dvc status` is clean there and every output (raw data, runs with their checkpoints,
    reports) has the origin's bytes."""
    # DVC's SSH client (asyncssh) would read the user's ~/.ssh/config and agent: only the remote's settings here
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    root, store = dvc_demo, tmp_path / "server" / "noisymlt-dvc"  # the server is this machine

    def connect(repo: Path) -> None:
        """Each clone's login: in .dvc/config.local, which git ignores (a key path is no project setting)."""
        for key in ("user", "port", "keyfile"):
            _run([DVC, "remote", "modify", "--local", "shared", key, sshd[key]], repo)

    _run([DVC, "remote", "add", "--force", "-d", "shared", f"ssh://{sshd['host']}{store}"], root)
    connect(root)
    # what a clone needs besides the code: the merged params, the lock files, DVC's config (the remote's address)
    _git(["add", "dvc-params.json", "dvc-params-runs", "dvc.lock", "workflow/dvc/runs", ".dvc"], root)
    _git(["commit", "-q", "-m", "the demo's DVC results"], root)
    config = _git(["show", "HEAD:.dvc/config"], root)
    assert f"url = ssh://{sshd['host']}{store}" in config
    assert not [key for key in ("user =", "port =", "keyfile =") if key in config]  # all in config.local

    _run([DVC, "push"], root, timeout=900)
    assert _status(root, "--cloud") == {}  # every cached object is on the remote
    assert sum(1 for f in store.rglob("*") if f.is_file()) > 300

    clone = _clone(root, tmp_path / "elsewhere")
    assert not (clone / "runs").exists() and not (clone / ".dvc" / "cache").exists()
    connect(clone)
    _run([DVC, "pull"], clone, timeout=900)
    assert _status(clone) == {}
    expected = _digests(root)
    assert len(expected) > 300 and "runs/toy/g0.5/s0/erm/checkpoint.pt" in expected
    assert _digests(clone) == expected
    again = _run([DVC, "repro"], clone, timeout=600)
    assert "Running stage" not in again and "up to date" in again

    # As the manual warns: DVC's SSH remote (dvc-ssh through sshfs) checks no host key, so a known_hosts entry
    # that names another key does not stop it. If this fails, DVC now checks host keys: update docs/dvc.md.
    other = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=60)
    key = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    (tmp_path / "home" / ".ssh" / "known_hosts").write_text(f"[{sshd['host']}]:{sshd['port']} {key}\n")
    assert _status(clone, "--cloud") == {}
