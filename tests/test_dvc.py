"""What a DVC user does with the project, each for real, on the demo reduced to seconds (two seeds, ERM and
DB-Focal, one epoch) in git clones of the project with their own DVC state, config and cache folders:

- `dvc repro` on a fresh clone writes the same reports as `make demo` (the Snakemake route) on another;
- after that `make demo`, `make demo-dvc` records it without training anything: `dvc status` is clean, Snakemake
  has nothing to do, and dvc.lock holds the hashes the DVC route gave the same outputs;
- `dvc exp run -S` on ERM's learning rate retrains exactly ERM's runs, and `dvc exp show` shows the param beside
  the changed cell; `dvc metrics show` / `diff` on the table's cells; `dvc plots show`; `dvc dag`;
- push to an ssh:// remote (a real sshd on localhost: tests/ssh/start_sshd.sh, which CI runs), pull into a fresh
  clone: `dvc status` is clean there and every versioned file has the same bytes.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import BIN, DVC, REPO, SNAKEMAKE, output_digests, project_copy, run_tool, tiny_layer

SSHD_START, SSHD_STOP = REPO / "tests" / "ssh" / "start_sshd.sh", REPO / "tests" / "ssh" / "stop_sshd.sh"
SSHD_DIR = Path(os.environ.get("NOISYMLT_SSHD_DIR", "/run/noisymlt-sshd"))  # start_sshd.sh's folder
LAYER = "workflow/profiles/tiny/params.yaml"  # under workflow/: a dependency of every stage (docs/dvc.md)
# two seeds of ERM and DB-Focal, one epoch, on a smaller toy than TINY's
TINY_DVC = tiny_layer({
    "grid": {"gammas": [0.5], "seeds": [0, 1], "methods": ["erm", "db_focal"], "ablations": []},
    "timing": {"methods": ["erm"], "batch_sizes": [1]},
    "datasets": {"toy": {"toy": {"n_trainval": 240, "n_test": 60}, "longtail": {"max": 60, "min": 3}}},
    "train": {"epochs": 1, "lr_steps": [1], "eval_batch_size": 64},
    "schedules": {name: {"train": {"epochs": 1, "lr_steps": [1]}} for name in ("db", "db_random")},
})
LAYERS = f"workflow/profiles/demo/params.yaml {LAYER}"
RUN = "runs/toy/g0.5/s{}/{}/"
VERSIONED = ("data/", "runs/", "reports/")


def test_dvc_yaml_is_three_phase_stages_that_run_snakemake():
    """dvc.yaml is short and hand-written: one stage a phase rule of the Snakefile, each running Snakemake with the
    `dvc` block's profile and layers and versioning its folder."""
    import re

    text = (REPO / "dvc.yaml").read_text()
    assert len(text.splitlines()) <= 120 and not (REPO / "workflow" / "dvc").exists()
    stages = yaml.safe_load(text)["stages"]
    assert list(stages) == ["data", "runs", "reports"]
    for name, stage in stages.items():
        assert stage["cmd"] == f"snakemake --profile ${{dvc.profile}} --configfile ${{dvc.configfiles}} -- {name}"
        assert stage["outs"] == [{name: {"persist": True}}]
        assert {"Snakefile", "workflow", "src/noisymlt"} <= set(stage["deps"]) and "dvc" in stage["params"]
        assert re.search(rf"^rule {name}:\n    input:\n", (REPO / "Snakefile").read_text(), re.M)
    assert stages["runs"]["deps"][0] == "data" and stages["reports"]["deps"][:2] == ["data", "runs"]
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert params["dvc"] == {"profile": "workflow/profiles/demo", "configfiles": "workflow/profiles/demo/params.yaml"}


# The rules whose words a plug-in spells, each with the noisymlt.pipeline.paths function that asks it (a dataset
# kind's method of the same name, a noise model's argv): the only ones that run `$NOISYMLT_CLI {params.args}`.
PLUGIN_WORDS = {"make_raw": "raw_argv", "download": "raw_argv", "parse_labels": "parse_argv",
                "fetch_train_images": "train_images_argv", "noise": "noise_argv"}


def rule_shells(rules_dir: Path = REPO / "workflow" / "rules") -> dict[str, tuple[str, str]]:
    """Each rule's (params block, shell text) as written in workflow/rules/*.smk; a `use rule A as B` has A's."""
    import re

    found, derived = {}, {}
    for rules in sorted(rules_dir.glob("*.smk")):
        text = rules.read_text()
        for name, body in re.findall(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", text, re.M | re.S):
            shell = re.search(r"^    shell:\n(.*?)(?=\n\S|\n\n|\Z)", body, re.M | re.S)
            params = re.search(r"^    params:\n(.*?)(?=^    \S)", body, re.M | re.S)
            assert shell, (rules.name, name)  # no run: or script: blocks, a shell command each
            assert all(line.strip().startswith('"') for line in shell.group(1).splitlines()), (name, shell.group(1))
            found[name] = (params.group(1) if params else "", shell.group(1))
        derived.update(re.findall(r"^use rule (\w+) as (\w+)", text, re.M))
    return {**found, **{new: found[old] for old, new in derived.items()}}


def test_each_rule_writes_its_command_unless_a_plug_in_spells_it():
    """Every rule's shell is text in the rule, and names its noisymlt command and options: `{params.args}` (the words
    from Python) only where a dataset kind or a noise model supplies them, at most five rules."""
    import inspect

    from noisymlt.data.kinds.base import DatasetKind
    from noisymlt.data.noise_models.base import NoiseModel
    from noisymlt.pipeline import paths

    shells = rule_shells()
    assert len(shells) > 25 and {"longtail", "pretrain", "cache_test_images", "select_split"} <= set(shells)
    args = sorted(name for name, (_, shell) in shells.items() if "{params.args}" in shell)
    assert args == sorted(PLUGIN_WORDS) and len(args) <= 5, args
    for name, (params, shell) in shells.items():
        if name in PLUGIN_WORDS:
            assert f"args=lambda w" in params and f"paths.{PLUGIN_WORDS[name]}(" in params, (name, params)
        else:  # the command's name follows the interpreter, never a param's words
            assert "$NOISYMLT_CLI {" not in shell and "args=" not in params, (name, shell)
    for function in set(PLUGIN_WORDS.values()):  # each asks the plug-in for its words
        source = inspect.getsource(getattr(paths, function))
        asks = "noise_model(noise).argv(" if function == "noise_argv" else f"kind(params, name).{function}("
        assert asks in source, function
        assert callable(getattr(NoiseModel, "argv") if function == "noise_argv" else getattr(DatasetKind, function))
    # no second spelling of a rule's words in Python: a script that needs a rule's outputs asks Snakemake for them
    assert {name for name in dir(paths) if name.endswith("_argv")} == set(PLUGIN_WORDS.values())


def _git(args: list, cwd: Path) -> str:
    who = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.org", "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z"}
    env = {**os.environ, **who, **{k.replace("AUTHOR", "COMMITTER"): v for k, v in who.items()}}
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def _status(root: Path, *args: str) -> dict:
    return json.loads(run_tool([DVC, "status", *args, "--json"], root).strip().splitlines()[-1])


def _versioned(root: Path) -> dict[str, str]:
    """sha256 of every file the stages version: their folders, without what .dvcignore leaves out (the raw files,
    the running-time table's measurements, a retrained run's earlier files in previous/)."""
    return {p: h for p, h in output_digests(root).items()
            if not p.startswith(("data/raw/", "reports/inference_time_")) and "/previous/" not in p}


@pytest.fixture(scope="module")
def origin(tmp_path_factory) -> Path:
    """A git repository of the committed project with the tiny layer named in params.yaml's `dvc` block, DVC
    initialised and committed: what a user's clone holds before running anything."""
    if shutil.which("git") is None or not DVC.exists():
        pytest.skip(f"git, or dvc next to {sys.executable}, is not installed")
    root = project_copy(tmp_path_factory.mktemp("origin"))
    (root / LAYER).parent.mkdir(parents=True)
    (root / LAYER).write_text(yaml.safe_dump(TINY_DVC, sort_keys=False))
    params = (root / "params.yaml").read_text()
    assert "  configfiles: workflow/profiles/demo/params.yaml\n" in params
    (root / "params.yaml").write_text(params.replace("  configfiles: workflow/profiles/demo/params.yaml\n",
                                                     f"  configfiles: {LAYERS}\n"))
    _git(["init", "-q"], root)
    (root / ".git" / "info" / "exclude").write_text(".dvc-*/\ndvc_plots/\n")  # DVC's state folders (tool_env)
    run_tool([DVC, "init", "--quiet"], root)
    _git(["add", "-A"], root)
    _git(["commit", "-q", "-m", "project"], root)
    return root


@pytest.fixture(scope="module")
def reproduced(origin, tmp_path_factory) -> Path:
    """A fresh clone, `dvc repro`, the results committed as a user would (dvc.lock)."""
    root = tmp_path_factory.mktemp("repro") / "clone"
    _git(["clone", "-q", str(origin), str(root)], root.parent)
    out = run_tool([DVC, "repro"], root, timeout=900)
    assert [line for line in out.splitlines() if line.startswith("Running stage")] == [
        "Running stage 'data':", "Running stage 'runs':", "Running stage 'reports':"], out[-3000:]
    _git(["add", "dvc.lock"], root)
    _git(["commit", "-q", "-m", "results"], root)
    return root


@pytest.mark.slow
def test_dvc_repro_writes_what_make_demo_writes_and_make_demo_dvc_records_a_finished_demo(origin, reproduced,
                                                                                        tmp_path):
    assert _status(reproduced) == {}
    assert "Nothing to be done" in run_tool([SNAKEMAKE, "--profile", "workflow/profiles/demo", "--configfile",
                                             *LAYERS.split(), "-n"], reproduced)
    # make demo's route in another clone: Snakemake itself, the same profile and layers
    root = tmp_path / "smk"
    _git(["clone", "-q", str(origin), str(root)], tmp_path)
    run_tool([SNAKEMAKE, "--profile", "workflow/profiles/demo", "--configfile", *LAYERS.split()], root, timeout=900)
    table = (root / "reports/table_total.md").read_text()
    assert table == (reproduced / "reports/table_total.md").read_text() and "| ERM |" in table
    trained = {p: (root / p).stat().st_mtime_ns for p in output_digests(root) if p.endswith("checkpoint.pt")}
    assert len(trained) == 4 + 4  # the grid's runs and ERM's cross-fitting (two folds a noisy set)

    out = run_tool(["make", "demo-dvc", f"VENV={BIN.parent}", "STAMP="], root, timeout=900)
    assert "recorded every stage" in out and "Running stage" not in out, out[-3000:]
    assert {p: (root / p).stat().st_mtime_ns for p in trained} == trained  # nothing retrained
    assert _status(root) == {}
    assert "Nothing to be done" in run_tool([SNAKEMAKE, "--profile", "workflow/profiles/demo", "--configfile",
                                             *LAYERS.split(), "-n"], root)
    # the same commit, params and code: the DVC run's versioned files hash as the Snakemake run's, in dvc.lock as on disk
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert lock == yaml.safe_load((reproduced / "dvc.lock").read_text())["stages"]
    assert _versioned(root) == _versioned(reproduced)


@pytest.mark.slow
def test_metrics_plots_and_the_dag(reproduced, tmp_path):
    shown = json.loads(run_tool([DVC, "metrics", "show", "--json"], reproduced).strip().splitlines()[-1])
    cells = shown[""]["data"]["reports/table_total.cells.json"]["data"]["cells"]
    table = json.loads((reproduced / "reports/table_total.cells.json").read_text())["cells"]
    assert set(cells) == {"erm/main/toy/0.5", "db_focal/main/toy/0.5"}
    assert cells["erm/main/toy/0.5"]["mean"] == table["erm/main/toy/0.5"]["mean"]

    out = tmp_path / "plots"
    run_tool([DVC, "plots", "show", "--out", out], reproduced)
    page = (out / "index.html").read_text()
    assert all(f"{name}" in page for name in ("training_loss", "learning_rate", "map_vs_gamma.png"))

    dag = run_tool([DVC, "dag", "--dot"], reproduced)
    edges = {line.strip().rstrip(";").replace('"', "") for line in dag.splitlines() if "->" in line}
    assert edges == {"data -> runs", "runs -> reports", "data -> reports"}, dag
    drawn = run_tool([DVC, "dag"], reproduced)  # the picture a person reads: three boxes
    assert all(f"| {stage} |" in drawn for stage in ("data", "runs", "reports")), drawn


@pytest.mark.slow
def test_exp_run_on_one_methods_lr_retrains_exactly_its_runs_and_exp_show_shows_both(reproduced):
    before = output_digests(reproduced)
    out = run_tool([DVC, "exp", "run", "-S", "params.yaml:++methods.erm.train.lr=0.05"], reproduced, timeout=900)
    after = output_digests(reproduced)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)
               and "/previous/" not in p}  # a retrained run's earlier files, set aside (.dvcignore)
    retrained = {p for p in changed if p.endswith("checkpoint.pt")}
    folds = {f"runs/toy/crossfit/erm/g0.5/s{s}/fold{k}/checkpoint.pt" for s in (0, 1) for k in (0, 1)}
    assert retrained == {RUN.format(s, "erm") + "checkpoint.pt" for s in (0, 1)} | folds, sorted(changed)  # ERM's
    assert not [p for p in changed if p.startswith("runs/") and "/db_focal/" in p]
    assert not [p for p in changed if p.startswith("data/")]  # no label table or noisy set moved
    assert "Running stage 'runs'" in out

    rows = list(csv.DictReader(io.StringIO(run_tool([DVC, "exp", "show", "--csv"], reproduced).strip())))
    lr, erm, db = "methods.erm.train.lr", "cells.erm/main/toy/0.5.mean", "cells.db_focal/main/toy/0.5.mean"
    base = next(r for r in rows if r["rev"] != "workspace" and r["typ"] == "baseline")  # the committed results
    exp = next(r for r in rows if r["typ"] in ("branch_base", "branch_commit"))  # the experiment
    assert base[lr] == "" and exp[lr] == "0.05"
    assert base[erm] != exp[erm] and base[db] == exp[db]  # the changed cell beside the param; the other cell kept
    diff = json.loads(run_tool([DVC, "metrics", "diff", "HEAD", "--json"], reproduced).strip().splitlines()[-1])
    changed_cells = {k for k, v in diff["reports/table_total.cells.json"].items() if v.get("diff")}
    assert "cells.erm/main/toy/0.5.mean" in changed_cells and "cells.db_focal/main/toy/0.5.mean" not in changed_cells
    _git(["checkout", "--", "params.yaml", "dvc.lock"], reproduced)  # back to the committed baseline
    run_tool([DVC, "checkout", "--force"], reproduced)
    assert _status(reproduced) == {}


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


@pytest.mark.slow
@pytest.mark.ssh
def test_data_and_models_round_trip_through_an_ssh_remote(sshd, reproduced, tmp_path, monkeypatch):
    """docs/dvc.md's SSH route: the remote in DVC's config (committed), `dvc push`, a fresh clone, `dvc pull`:
    `dvc status` is clean there, `dvc repro` runs nothing, and every versioned file has the origin's bytes."""
    # DVC's SSH client (asyncssh) would read the user's ~/.ssh/config and agent: only the remote's settings here
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "home" / ".ssh").mkdir(parents=True)
    root, store = reproduced, tmp_path / "server" / "noisymlt-dvc"  # the server is this machine

    def connect(repo: Path) -> None:
        """Each clone's login: in .dvc/config.local, which git ignores (a key path is no project setting)."""
        for key in ("user", "port", "keyfile"):
            run_tool([DVC, "remote", "modify", "--local", "shared", key, sshd[key]], repo)

    run_tool([DVC, "remote", "add", "--force", "-d", "shared", f"ssh://{sshd['host']}{store}"], root)
    connect(root)
    _git(["add", ".dvc/config"], root)
    _git(["commit", "-q", "-m", "the remote"], root)
    config = _git(["show", "HEAD:.dvc/config"], root)
    assert f"url = ssh://{sshd['host']}{store}" in config
    assert not [key for key in ("user =", "port =", "keyfile =") if key in config]  # all in config.local

    run_tool([DVC, "push"], root, timeout=900)
    assert _status(root, "--cloud") == {}  # every cached object is on the remote
    clone = tmp_path / "elsewhere"
    _git(["clone", "-q", str(root), str(clone)], tmp_path)
    assert not (clone / "runs").exists() and not (clone / ".dvc" / "cache").exists()
    connect(clone)
    run_tool([DVC, "pull"], clone, timeout=900)
    assert _status(clone) == {}
    expected = _versioned(root)
    assert RUN.format(0, "erm") + "checkpoint.pt" in expected and "reports/table_total.md" in expected
    assert _versioned(clone) == expected
    again = run_tool([DVC, "repro"], clone, timeout=600)
    assert "Running stage" not in again and "up to date" in again
