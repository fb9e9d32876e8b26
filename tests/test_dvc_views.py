"""What a DVC user sees of the pipeline: `dvc metrics show/diff`, `dvc plots show`, `dvc exp run -S` /
`dvc exp show`, `dvc dag`, and `make demo-dvc` recording a finished Snakemake demo.

All against real DVC in a git repository under tmp_path holding a copy of the project, on a tiny toy grid
(one noise rate, one seed, ERM on the [DB] schedule and Ours on the [CL] one, one epoch), with its own DVC
state, config and cache folders (test_dvc._env). The grid's `dvc repro` takes about 1.5 min on 2 cores, the
experiments test about 2 min more; the demo-dvc test runs the reduced demo with Snakemake first (about 3 min).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_dvc import BIN, DVC, SNAKEMAKE, _needs_tools, _run, _tiny_params, stage_name
from test_dvc_demo import LAYERS, _clone, _git, origin  # noqa: F401 (origin: a fixture)

from noisymlt.pipeline.dvc_yaml import address

REPO = Path(__file__).resolve().parents[1]
RUN = "runs/toy/g0.5/s0/{}"


def _params() -> dict:
    from noisymlt.config import load_params

    params = _tiny_params()
    full = load_params(REPO / "params.yaml")
    params["methods"]["ours"] = full["methods"]["ours"]
    params["grid"]["methods"] = ["erm", "ours"]
    return params


def _json(out: str):
    """The JSON document a `dvc ... --json` command printed (its last line)."""
    return json.loads(out.strip().splitlines()[-1])


def readme_exp_show() -> list[str]:
    """The manual's `dvc exp show` recipe (docs/dvc.md), as an argument list (DVC found next to this interpreter)."""
    import shlex

    text = (REPO / "docs" / "dvc.md").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("dvc exp show --drop"))
    return [str(DVC), *shlex.split(line.split("  #")[0])[1:]]


def _csv_rows(out: str) -> list[dict]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(out.strip())))


def _ran(out: str) -> set[str]:
    """Stages `dvc repro` / `dvc exp run` ran, by name (a run stage without its shard's dvc.yaml)."""
    return {stage_name(line.split("'")[1]) for line in out.splitlines() if line.startswith("Running stage '")}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """The tiny grid reproduced by DVC and committed (dvc.lock, dvc-params.json), as a user would."""
    _needs_tools()
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("views") / "proj"
    root.mkdir()
    for name in ("dvc.yaml", ".dvcignore", ".gitignore"):
        shutil.copy2(REPO / name, root / name)
    shutil.copytree(REPO / "src" / "noisymlt", root / "src" / "noisymlt",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(REPO / "workflow" / "dvc", root / "workflow" / "dvc")
    (root / "params.yaml").write_text(yaml.safe_dump(_params(), sort_keys=False))
    (root / "exp.yaml").write_text("{}\n")  # the manual's experiments layer (docs/dvc.md): what `dvc exp run -S` edits
    _git(["init", "-q"], root)
    # DVC's state folders (test_dvc._env) and `dvc plots show`'s page stay out of the commits
    (root / ".git" / "info" / "exclude").write_text(".dvc-*/\ndvc_plots/\n")
    _run([sys.executable, "-m", "noisymlt", "params", "params.yaml", "exp.yaml", "--out", "dvc-params.json"], root)
    _run([DVC, "init", "--quiet"], root)
    _git(["add", "-A"], root)
    _git(["commit", "-q", "-m", "project"], root)
    out = _run([DVC, "repro"], root, timeout=600)
    assert {"params", "train@toy-0.5-0-erm", "train@toy-0.5-0-ours"} <= _ran(out)
    _git(["add", "-A"], root)
    _git(["commit", "-q", "-m", "results"], root)
    return root


@pytest.mark.slow
def test_metrics_show_lists_every_runs_map_by_run_folder_head_and_group(repo):
    shown = _json(_run([DVC, "metrics", "show", "--json"], repo))
    files = next(iter(shown.values()))["data"]  # one revision: the workspace
    assert set(files) == {f"{RUN.format(m)}/map.json" for m in ("erm", "ours")} | {"reports/table_total.cells.json"}
    # the table's cells: the mean over seeds (one here) of each run's mAP, beside its CI
    cells = files["reports/table_total.cells.json"]["data"]["cells"]
    main = json.loads((repo / RUN.format("erm") / "map.json").read_text())["main"]["total"]
    assert cells["erm/main/toy/0.5"]["mean"] == pytest.approx(main, abs=1e-6)
    for method in ("erm", "ours"):
        evaluated = json.loads((repo / RUN.format(method) / "metrics.json").read_text())["heads"]
        data = files[f"{RUN.format(method)}/map.json"]["data"]
        assert set(data) == set(evaluated)  # every prediction head: Ours' branches too
        for head, rec in evaluated.items():  # a group without test positives (NaN) is null, which DVC leaves out
            assert data[head] == pytest.approx({g: 100 * v for g, v in rec["map"].items() if v == v})
    assert set(files[f"{RUN.format('ours')}/map.json"]["data"]) >= {"ensemble", "random", "balanced"}
    table = _run([DVC, "metrics", "show"], repo)
    assert "runs/toy/g0.5/s0/ours/map.json" in table and "main.total" in table and "ap" not in table.split()


@pytest.mark.slow
def test_plots_show_draws_the_training_curves_and_the_map_figure(repo, tmp_path):
    shown = _json(_run([DVC, "plots", "show", "--json", "--split"], repo))
    assert "errors" not in shown, shown["errors"]
    assert set(shown["data"]) == {"training_loss", "learning_rate", "pseudo_labels_added", "pseudo_labels_removed",
                                  "reports/map_vs_gamma.png"}
    curves = json.loads((repo / "reports" / "training_curves.json").read_text())
    assert {(r["method"], r["epoch"]) for r in curves} == {("erm", 1), ("ours", 1)}
    history = json.loads((repo / RUN.format("erm") / "manifest.json").read_text())["history"]
    erm = next(r for r in curves if r["method"] == "erm")
    assert erm["loss"] == history[0]["loss"] and erm["lr"] == history[0]["lr"]
    pseudo = json.loads((repo / "reports" / "pseudo_label_curves.json").read_text())
    assert {(r["method"], r["branch"]) for r in pseudo} == {("ours", "random"), ("ours", "balanced")}
    assert all(r["added"] >= 0 and r["removed"] >= 0 for r in pseudo)
    _run([DVC, "plots", "show", "-o", tmp_path / "html"], repo)
    page = (tmp_path / "html" / "index.html").read_text()
    assert "training_loss" in page and "map_vs_gamma.png" in page and '"field": "method"' in page


@pytest.mark.slow
def test_dag_of_one_stage_shows_what_it_depends_on_and_md_the_whole_graph(repo):
    """The whole text graph is too wide to read at demo scale (docs/dvc.md); a stage's own graph is not."""
    erm = address("toy-0.5-0-erm")  # workflow/dvc/runs/SHARD/dvc.yaml:train@toy-0.5-0-erm
    assert _run([sys.executable, "-m", "noisymlt", "dvc-yaml", "--where", "toy-0.5-0-erm"], repo).strip() == erm
    out = _run([DVC, "dag", erm], repo)
    for stage in ("params", "code_digests", "raw@toy", "noise@toy-0.5-0", erm):
        assert f"| {stage} |" in out, out
    assert "ours" not in out and "aggregate" not in out
    md = _run([DVC, "dag", "--md"], repo)
    assert "```mermaid" in md and "aggregate" in md and address("toy-0.5-0-ours") in md


@pytest.mark.slow
def test_metrics_diff_between_commits_and_exp_run_reruns_only_what_a_param_reaches(repo):
    """-S on params.yaml: the `params` stage rewrites dvc-params.json, and only the runs whose resolved
    configuration changed retrain. train.lr does not reach ERM ([DB] schedule): a warning says so."""
    out = _run([DVC, "exp", "run", "-S", "params.yaml:train.lr=0.05"], repo, timeout=600)
    assert "train@toy-0.5-0-ours" in _ran(out) and "train@toy-0.5-0-erm" not in _ran(out), out
    assert "does not reach erm: schedules.db_random.train.lr overrides it" in out

    out = _run([DVC, "exp", "run", "-S", "exp.yaml:++methods.erm.train.lr=0.05"], repo, timeout=600)
    ran = _ran(out)
    assert {"params", "train@toy-0.5-0-erm", "aggregate"} <= ran, out
    assert not {s for s in ran if s.endswith("-ours")} and not {s for s in ran if s.startswith("raw")}
    assert yaml.safe_load((repo / "exp.yaml").read_text()) == {"methods": {"erm": {"train": {"lr": 0.05}}}}

    shown = _run([DVC, "exp", "show", "--only-changed", "--csv"], repo)
    header = shown.splitlines()[0].split(",")
    named = {column.split(":")[-1] for column in header}  # DVC prefixes FILE: only where names clash
    # the params the experiments changed, as the merged file has them, beside both runs' changed mAP
    assert {"methods.erm.train.lr", "train.lr", "dvc.run_configs.toy-0_5-0-erm"} <= named, header
    assert {"main.total", "ensemble.total"} <= named, header  # ERM's head, Ours' ensemble
    assert len(header) < 40  # what changed, not every leaf of the params file
    assert "0.05" in shown.splitlines()[1].split(",")

    # the manual's recipe: the lr beside ERM's gamma 0.5 cell, for the experiment and for its baseline
    recipe = readme_exp_show()
    table = _run(recipe, repo)
    assert max(map(len, table.splitlines())) <= 100, table  # a terminal's width
    assert "workspace" in table and "0.05" in table, table
    with_rev = [arg.replace("Experiment|", "Experiment|rev|") for arg in recipe]  # rows named in CSV too
    rows = _csv_rows(_run([*with_rev, "--csv"], repo))
    lr, cell = "dvc.train_lr.toy.erm", "cells.erm/main/toy/0.5.mean"
    assert len(rows) >= 3 and rows[0]["rev"] == "workspace", rows
    baseline = next(row for row in rows[1:] if not row["Experiment"])  # the commit the experiments start from
    experiment = next(row for row in rows if row["Experiment"] and float(row[lr]) == 0.05)
    assert float(baseline[lr]) == 0.02  # ERM's own lr ([DB] random schedule), not a blank
    assert 0 < float(baseline[cell]) <= 100 and 0 < float(experiment[cell]) <= 100
    assert float(baseline[cell]) != float(experiment[cell])

    _git(["add", "-A"], repo)
    _git(["commit", "-q", "-m", "erm lr"], repo)
    diff = _json(_run([DVC, "metrics", "diff", "HEAD~1", "HEAD", "--json"], repo))
    erm = diff[f"{RUN.format('erm')}/map.json"]
    assert erm["main.total"]["old"] != erm["main.total"]["new"]
    assert json.loads(_run([DVC, "status", "--json"], repo).strip().splitlines()[-1]) == {}


def readme_experiment() -> str:
    """The manual's first DVC experiment recipe (docs/model-selection.md, the ad-hoc sweep on ERM's lr; docs/dvc.md
    repeats its form): the line that writes the layer (printf) and the line that reproduces and saves, as one shell
    script."""
    lines = (REPO / "docs" / "model-selection.md").read_text().splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("dvc repro && dvc exp save"))
    assert lines[at - 1].startswith("printf 'methods:") and lines[at - 1].rstrip().split("  #")[0].endswith("exp.yaml")
    return "\n".join(ln.split("  #")[0] for ln in lines[at - 1:at + 1])


@pytest.mark.slow
def test_the_readmes_experiment_recipe_retrains_one_method_and_saves_a_row_exp_show_prints(repo):
    """`dvc repro` on the written layer, then `dvc exp save`: the experiment `dvc exp run -S` would record,
    without its per-stage git bookkeeping (docs/dvc.md, treeverse/dvc#8809)."""
    script = readme_experiment()
    name = script.split("dvc exp save -n ")[1].split()[0]
    out = _run(["bash", "-c", f"set -e\n{script}"], repo, timeout=600)
    ran = _ran(out)
    assert {"params", "train@toy-0.5-0-erm", "aggregate"} <= ran, out
    assert not {s for s in ran if s.endswith("-ours")}, out  # the layer reaches ERM's runs only
    lr = yaml.safe_load((repo / "exp.yaml").read_text())["methods"]["erm"]["train"]["lr"]
    with_rev = [arg.replace("Experiment|", "Experiment|rev|") for arg in readme_exp_show()]
    rows = _csv_rows(_run([*with_rev, "--csv"], repo))
    saved = next(row for row in rows if row["Experiment"] == name)
    assert float(saved["dvc.train_lr.toy.erm"]) == lr != 0.02, rows  # its lr, beside its cell
    assert 0 < float(saved["cells.erm/main/toy/0.5.mean"]) <= 100
    runs = json.loads((repo / RUN.format("erm") / "run_config.json").read_text())
    assert runs["train"]["lr"] == lr  # the workspace holds the experiment's results, as after `dvc exp run`
    _git(["add", "-A"], repo)
    _git(["commit", "-q", "-m", "erm lr, saved"], repo)
    assert json.loads(_run([DVC, "status", "--json"], repo).strip().splitlines()[-1]) == {}


@pytest.mark.slow
def test_make_demo_dvc_after_make_demo_records_the_finished_demo_instead_of_rerunning_it(origin, tmp_path):
    """`make demo` (Snakemake) and then `make demo-dvc` in the same clone: dvc commit, no stage runs."""
    if shutil.which("make") is None or not SNAKEMAKE.exists():
        pytest.skip("make or snakemake is not installed")
    root = _clone(origin, tmp_path / "proj")
    _run([SNAKEMAKE, "--profile", "workflow/profiles/demo", "--configfile", *LAYERS[1:]], root, timeout=900)
    make = ["make", "demo-dvc", f"VENV={BIN.parent}", "STAMP=", f"DEMO_PARAMS={' '.join(LAYERS)}"]
    out = _run(make, root, timeout=900)
    assert "demo-dvc: the Snakemake demo (make demo) is complete" in out and "recorded every stage" in out, out
    assert _ran(out) == set(), out
    assert json.loads(_run([DVC, "status", "--json"], root).strip().splitlines()[-1]) == {}
    assert "recorded" not in _run(make, root)  # with a dvc.lock: a plain `dvc repro`


def test_make_demo_dvc_says_when_it_cannot_record_an_unfinished_demo(origin, tmp_path):
    """Outputs without a finished Snakemake run are not recorded (their jobs may not have run): it says so."""
    if shutil.which("make") is None or not SNAKEMAKE.exists():
        pytest.skip("make or snakemake is not installed")
    root = _clone(origin, tmp_path / "proj")
    (root / "reports").mkdir(exist_ok=True)
    (root / "reports" / "results.parquet").write_text("left by an interrupted run")
    make = ["make", "-n", "demo-dvc", f"VENV={BIN.parent}", "STAMP=", f"DEMO_PARAMS={' '.join(LAYERS)}"]
    lines = _run(make, root).splitlines()  # the recipe; its `if ... fi` alone runs below (no dvc repro here)
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("if [ ! -f dvc.lock ]"))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "fi")
    out = subprocess.run(["bash", "-c", "\n".join(lines[start:end + 1])], cwd=root, capture_output=True, text=True,
                         timeout=300).stdout
    assert "unfinished or outdated Snakemake demo" in out and "recording" not in out


def test_params_rewrite_changes_the_run_ids_a_change_reaches_and_warns_about_the_rest(tmp_path, monkeypatch, capsys):
    """What `dvc exp run` reruns is decided here: a train stage's one param is its run id."""
    from noisymlt.pipeline.params import write

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copy2(REPO / "workflow" / "profiles" / "demo" / "params.yaml", tmp_path / "demo.yaml")
    # with Ours' selection in the run (the demo trains Ours with its recorded choice, which train.lr would change)
    shutil.copy2(REPO / "workflow" / "profiles" / "demo" / "select_ours.yaml", tmp_path / "select.yaml")
    (tmp_path / "exp.yaml").write_text("{}\n")
    monkeypatch.chdir(tmp_path)

    def ids() -> dict:
        write(["params.yaml", "demo.yaml", "select.yaml", "exp.yaml"], "dvc-params.json")
        return yaml.safe_load(Path("dvc-params.json").read_text())["dvc"]["run_configs"]

    before = ids()
    assert capsys.readouterr().err == ""
    Path("exp.yaml").write_text("train: {lr: 0.01}\n")
    after = ids()
    changed = {k.rsplit("-", 1)[1] for k in before if before[k] != after[k]}
    # the [DB] schedules set their own lr, and Ours (the [CL] schedule, which reads train.lr) takes the lr its
    # selection chooses: no run changes, so `dvc exp run` retrains nothing
    assert changed == set()
    err = capsys.readouterr().err
    assert "train.lr changed (0.02 -> 0.01) but does not reach ours: model selection chooses it" in err
    assert ("train.lr changed (0.02 -> 0.01) but does not reach rs, rs_focal, dividemix, db, db_focal: "
            "schedules.db.train.lr overrides it") in err
    assert ("train.lr changed (0.02 -> 0.01) but does not reach erm, focal, ldam, bbn, mlgcn: "
            "schedules.db_random.train.lr overrides it") in err

    Path("exp.yaml").write_text("train: {lr: 0.01}\nmethods: {erm: {train: {lr: 0.01}}}\n")
    latest = ids()
    assert {k.rsplit("-", 1)[1] for k in after if after[k] != latest[k]} == {"erm"}
    assert capsys.readouterr().err == ""  # a method's own key reaches it: nothing to warn about


def test_params_refuses_more_layers_than_the_params_stage_lists(tmp_path, monkeypatch):
    from noisymlt.errors import NoisyMLTError
    from noisymlt.pipeline.params import LAYER_SLOTS, write

    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    extra = [f"l{i}.yaml" for i in range(LAYER_SLOTS)]
    for name in extra:
        Path(name).write_text("{}\n")
    with pytest.raises(NoisyMLTError, match=f"at most {LAYER_SLOTS} layers .* got {LAYER_SLOTS + 1}: params.yaml l0"):
        write(["params.yaml", *extra], "dvc-params.json")
    assert not Path("dvc-params.json").exists()


@pytest.mark.slow
def test_offline_plots_page_draws_every_vega_plot_in_headless_chromium_with_the_network_off(repo, monkeypatch):
    """scripts/dvc_plots_offline.py: DVC's page with vega inline draws every plot with no network, where DVC's own
    page (scripts from a CDN) draws none."""
    if not any(shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")):
        pytest.skip("no headless Chromium (Debian: apt-get install chromium)")
    sys.path.insert(0, str(REPO / "scripts"))
    import dvc_plots_offline as offline
    from noisymlt.data.download import DownloadFailed

    monkeypatch.chdir(repo)
    try:  # once: the npm registry (a package registry) or download.mirror
        for name in offline.PACKAGES:
            offline.package_file(name, None)
    except DownloadFailed as exc:
        pytest.skip(f"the vega packages cannot be fetched here: {exc}")
    out = _run([sys.executable, REPO / "scripts" / "dvc_plots_offline.py", "--packages", "data/assets/vega",
                "--check", "--out", "offline_plots"], repo)
    assert "no script from the network" in out and "4 of 4 vega plots drew" in out, out
    _run([DVC, "plots", "show", "-o", "cdn_plots"], repo)
    assert offline.check(repo / "cdn_plots" / "index.html") == (4, 0)  # the check can fail: DVC's page, offline
