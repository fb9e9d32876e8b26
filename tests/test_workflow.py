"""The Snakemake workflow: lint, paper-scale planning, and a real end-to-end run on the embedded dataset."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from helpers import REPO, SNAKEMAKE, TINY, copy_build, load_script, project_copy, snakemake, tiny_layer, write_layer


def other_venv(where: Path) -> Path:
    """A second venv at ``where`` (another interpreter path, as a colleague's or a rebuilt one) that sees this
    venv's packages: its python."""
    import site
    import venv

    venv.EnvBuilder(with_pip=False).create(where)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # an `import` line of a .pth file runs: addsitedir also reads this venv's own .pth files (the editable install)
    Path(purelib, "this_venv.pth").write_text(f"import site; site.addsitedir({site.getsitepackages()[0]!r})\n")
    return python


def job_counts(text: str) -> dict[str, int]:
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", text, re.M)}


def child_cpu_seconds(call):
    """CPU seconds (user + system) of the child processes `call` runs, and its result."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = call()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, result


def test_lint_is_clean(tmp_path):
    """No lint but the one the workflow answers on purpose: no rule names a conda environment or container
    (docs/slurm.md); scripts/lint_workflow.py, which `make lint` runs, leaves that one out."""
    lint_workflow = load_script("lint_workflow")
    found = lint_workflow.lints(project_copy(tmp_path))
    assert found, "no lint read: did Snakemake's text change?"  # each rule has the one left out
    assert {title for _, title in found} == {lint_workflow.NOT_OFFERED}, found


def test_paper_dry_run_plans_the_full_grid(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    grid = params["grid"]
    # The README's form: target first (a trailing target would be swallowed by --resources).
    plan_cpu, proc = child_cpu_seconds(lambda: snakemake(project_copy(tmp_path), "reports/table_total.tex", "all",
                                                         "--cores", "8", "--resources", "gpu=2", "-n", "--quiet",
                                                         "rules"))
    counts = job_counts(proc.stdout + proc.stderr)
    # Planning cost per training job (a final run or a selection candidate: most of the DAG and every resolved
    # config), less what Snakemake spends on a one-rule workflow (its imports), and in units of that one-rule
    # workflow's CPU seconds, measured in the same call: the bound follows the grid's size, not the machine's load
    # or speed (machines here differ 2x). Measured: 10-13 ms a training job on an AMD EPYC with AVX-512 (one-rule
    # workflow ~2 CPU s), 25 ms on an AVX2-only one (3.3 CPU s): 0.005-0.008 of it (672 of 786 jobs); reading and
    # validating params.yaml in an input function (~90 ms a job on the first, 0.045) would fail it.
    trivial = tmp_path / "trivial"
    trivial.mkdir()
    (trivial / "Snakefile").write_text('rule all:\n    output: "a"\n    shell: "touch {output}"\n')
    base_cpu, _ = child_cpu_seconds(lambda: snakemake(trivial, "all", "--cores", "8", "--resources", "gpu=2", "-n",
                                                      "--quiet", "rules"))
    training = counts["train"] + counts["train_candidate"]
    assert (plan_cpu - base_cpu) / training / base_cpu < 0.015, (plan_cpu, base_cpu, training, counts["total"])
    # model selection (params `selection`): per dataset, ten baselines x 4 lr and Ours' 4 lr + 3 alpha x 4 beta
    # candidates, each trained and evaluated, and one choice per method and stage
    selecting = [m for m, entry in params["selection"]["methods"].items() if isinstance(entry, list)]
    assert len(selecting) == 11
    assert counts["train_candidate"] == 2 * (10 * 4 + 4 + 12)  # each evaluates itself
    assert counts["select"] == 2 * (10 + 2) and counts["select_split"] == 2 and counts["select_parts"] == 2
    runs = {(d, g, s, m) for d in grid["datasets"] for g in grid["gammas"] for s in grid["seeds"]
            for m in grid["methods"]}
    for name in grid["ablations"]:  # results.parquet holds the ablation runs too; shared runs train once
        a = params["ablations"][name]
        runs |= {(a["dataset"], g, s, m) for g in a["gammas"] for s in a["seeds"] for m in a["methods"]}
    assert len(runs) > 2 * 4 * 5 * 11  # the main grid and more
    assert counts["train"] == len(runs) and "evaluate" not in counts  # a train job evaluates its predictions
    assert counts["table_ablation"] == len(grid["ablations"])
    assert counts["noise"] == len(grid["datasets"]) * len(grid["gammas"]) * len(grid["seeds"])
    assert counts["download"] == 2 and counts["fetch_train_images"] == 1
    # ImageNet weights of ResNet-50 and the GloVe vectors of both datasets, each fetched once by its own rule
    assert counts["fetch_asset"] == 3
    assert counts["parse_labels"] == 4 and counts["longtail"] == 2
    # train subset and test set of each dataset (train.loader: cache)
    assert counts["cache_train_images"] == 2 and counts["cache_test_images"] == 2


def test_a_failed_download_shows_its_reason_under_the_readme_command(tmp_path):
    """No internet (here: a mirror folder without the files): the README's bare command prints the reason, and
    what else to do, in the terminal; the default workflow profile turns on show-failed-logs."""
    wf = project_copy(tmp_path)
    params = yaml.safe_load((wf / "params.yaml").read_text())
    params["download"] = {"mirror": str(tmp_path / "empty_mirror"), "retries": 0}
    (tmp_path / "empty_mirror").mkdir()
    (wf / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    proc = subprocess.run([SNAKEMAKE, "reports/table_total.tex", "--cores", "2", "--resources", "gpu=2"], cwd=wf,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "workflow specific profile profiles/default" in out
    # the failed job's own log line, not only Snakemake's "returned non-zero exit status"
    reason = next((line for line in out.splitlines() if line.startswith("noisymlt ") and ": error: " in line), None)
    assert reason is not None, out[-3000:]
    assert "download failed" in reason and "nothing was received" in reason
    assert "download.mirror" in reason and "yourself at" in reason and ".part" not in reason


def test_the_snakefile_and_its_default_profile_sit_at_the_project_root():
    """`snakemake` from the project root finds ./Snakefile (the rules stay in workflow/rules/) and the default profile
    where it looks for one, profiles/default beside the Snakefile: a failed job's log is printed."""
    assert (REPO / "Snakefile").is_file() and not (REPO / "workflow" / "Snakefile").exists()
    assert 'include: "workflow/rules/common.smk"' in (REPO / "Snakefile").read_text()
    default = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert default["show-failed-logs"] is True
    assert not (REPO / "workflow" / "profiles" / "default").exists()  # would be read only beside workflow/Snakefile


def test_no_software_deployment_method_is_offered(tmp_path):
    """Jobs run the Python that runs Snakemake (the venv): no rule names a conda environment, and asking for one
    stops the run in one line instead of being ignored."""
    assert not (REPO / "workflow" / "envs").exists()
    for rules in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        assert not re.search(r"^\s+(conda|container|envmodules):", rules.read_text(), re.M), rules.name
    proc = subprocess.run([SNAKEMAKE, "--sdm", "conda", "-n"], cwd=project_copy(tmp_path), capture_output=True,
                          text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "noisymlt: --software-deployment-method (conda) is not offered" in out, out[-3000:]


# Snakemake's report draws its rule graph from one job per rule and DAG level (report.rulegraph_spec); this
# prints those nodes for the demo's DAG instead of writing the report (which needs the finished outputs).
RULEGRAPH = """
import sys
import snakemake.report
from snakemake.report.rulegraph_spec import rulegraph_spec

async def print_nodes(dag, *args, **kwargs):
    print("NODES", *(node["rule"] for node in rulegraph_spec(dag)[0]["nodes"]))

snakemake.report.auto_report = print_nodes
from snakemake.cli import main
sys.argv = ["snakemake", "--profile", "workflow/profiles/demo", "--report", "report.html", "--cores", "1"]
main()
"""


def test_report_rule_graph_shows_each_rule_once(tmp_path):
    proc = subprocess.run([sys.executable, "-c", RULEGRAPH], cwd=project_copy(tmp_path), capture_output=True,
                          text=True, timeout=300)
    nodes = next(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("NODES"))
    assert {"cache_train_images", "cache_test_images", "train", "figure_map_vs_gamma"} <= set(nodes)
    # Model selection is the one exception, by design: a second stage's candidates wait for the first's choice,
    # and the runs of a selecting method for its last choice, so their rules sit at more than one level.
    # Clean, then retrain alike: the oracle's cleanings read the data, cleanlab's the cross-fitting's runs, and the
    # base method's suspects read the cross-fitted probabilities, which the other methods' do not.
    selection = {"train_candidate", "select", "train", "clean_labels", "suspects"}
    twice = {n for n in nodes if nodes.count(n) > 1}
    assert twice <= selection, f"rules drawn twice: {sorted(twice - selection)}"


def test_a_train_job_writes_its_config_trains_on_it_and_evaluates(tmp_path):
    """One job per run: it writes its resolved config (a param, so a changed config reruns it) to
    requested_config.json, trains on that file and evaluates the predictions; no job of its own for either.
    A model-selection candidate alike (a final run's config waits for its method's choice in a dry run)."""
    proc = snakemake(project_copy(tmp_path), "runs/voc/g0.5/s0/ours/metrics.json", "--cores", "1", "-n",
                     "--printshellcmds")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    for run, test_labels in (("runs/voc/select/ours/stage1/g0.5/s0/lr0.08", "data/voc/select/g0.5_s0_val.parquet"),
                             ("runs/voc/g0.5/s0/ours", "data/voc/test_labels.parquet")):
        # the command spans lines: the config is indented JSON, quoted as one word
        end = out.index(f" > {run}/requested_config.json && ")
        written = shlex.split(out[out.rindex("printf '%s\\n' ", 0, end):end])[2]
        train, evaluate = out[end:].splitlines()[0].split(" && ")[1:]
        assert f"train --run-config {run}/requested_config.json " in train and f"--out {run} " in train
        # the interpreter comes from the environment (workflow/rules/common.smk), never from a param
        assert f"$NOISYMLT_CLI train --run-config" in train and evaluate.split()[0] == "$NOISYMLT_CLI"
        assert evaluate.split()[1:] == ["evaluate", "--predictions", f"{run}/predictions.npz", "--test-labels",
                                        test_labels, "--split", "data/voc/class_split.json", "--out",
                                        f"{run}/metrics.json", "--map-out", f"{run}/map.json", ">>",
                                        train.split()[-2], "2>&1"]
        if "select" in run:
            config = json.loads(written)
            assert (config["method"], config["gamma"], config["seed"], config["train"]["lr"]) == ("ours", 0.5, 0, 0.08)
        else:
            assert written == "<TBD>"  # Ours' choice: Snakemake fills it in when the select checkpoint has run
    rules = set(re.findall(r"^(?:local)?rule (\w+):", out, re.M))
    assert {"train", "train_candidate"} <= rules
    assert not rules & {"run_config", "evaluate", "candidate_config", "evaluate_candidate"}


@pytest.mark.slow
def test_rules_that_write_their_command_run_the_words_of_their_params(tmp_path):
    """The rules that write their command in the rule (data, pretraining, selection split and caches), planned:
    each job's command is its params' words, an option its block leaves out not written (longtail's draw for source
    all, --cap-to-available, --groups, --dataset; fetch-asset's --mirror), a value that needs quoting quoted."""
    from noisymlt.config import load_params
    from noisymlt.data import assets
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline import paths
    from noisymlt.pipeline import selection as S

    wf = project_copy(tmp_path)
    demo = yaml.safe_load((wf / "workflow/profiles/demo/params.yaml").read_text())["datasets"]["toy"]
    layer = {"download": {"mirror": "file:///a mirror", "retries": 2}, "datasets": {
        "toy_all": {**demo, "longtail": {"source": "all"}},
        "toy_cap": {**demo, "longtail": {"source": "pareto", "max": 20, "cap_to_available": True}}}}
    args = write_layer(wf, layer, "words.yaml")
    P = load_params(*(wf / f for f in ("params.yaml", "workflow/profiles/demo/params.yaml", "words.yaml")))
    assert P["datasets"]["coco"]["longtail"]["source"] == "official"  # params.yaml's
    asset = assets.glove_file(P, "voc")
    gamma, seed = S.selection_sets(P)[0]
    fit = L.fill(L.SELECT_PART, dataset="toy", gamma=gamma, seed=seed, part="fit")
    expected = {"pretrain": [(["pretrain", "--config", json.dumps(P["pretrain"]["toy_glyphs"], sort_keys=True),
                               "--out", "data/pretrained/toy_glyphs.pt", "--no-progress"],
                              "logs/pretrain/toy_glyphs.log")],
                "fetch_asset": [(["fetch-asset", "--url", paths.asset_entry(P, asset)["url"], "--sha256",
                                  paths.asset_entry(P, asset)["sha256"], "--out", asset, "--name", "assets.glove.voc",
                                  "--mirror", "file:///a mirror", "--retries", "2"],
                                 f"logs/data/fetch_asset_glove_{Path(asset).name}.log")],
                "select_split": [(["select", "split", "--noisy",
                                   *[f"{name}={table}" for name, table in S.split_tables(P, "toy").items()],
                                   "--held-out", str(P["selection"]["held_out"]), "--seed",
                                   str(P["selection"]["split_seed"]), "--out", "data/toy/select/split.json"],
                                  "logs/select/split_toy.log")],
                "cache_select_images": [(["cache-images", "--labels", fit, "--images",
                                          paths.image_root(P, "toy", "train"), "--size",
                                          str(paths.cache_size(P, "toy")), "--out", "data/toy/cache/select_fit.npy",
                                          "--no-progress"], "logs/data/cache_images_toy_select_fit.log")]}

    # each longtail option present and absent: a block's own draw, the draw's defaults, none for source all
    def draw(d):  # a block that sets every setting of the draw, in the command's order
        return [w for k in ("b", "max", "min", "seed") for w in (f"--{k}", str(P["datasets"][d]["longtail"][k]))]

    options = {"toy": ["--source", "pareto", *draw("toy"), "--groups", "scaled"], "toy_all": ["--source", "all"],
               "toy_cap": ["--source", "pareto", "--b", "6", "--max", "20", "--min", "1", "--seed", "0",
                           "--cap-to-available"],  # the draw's defaults
               "coco": ["--source", "official", *draw("coco"), "--dataset", "coco"]}
    expected["longtail"] = [(["longtail", "--labels", L.fill(L.SOURCE_LABELS, dataset=d), "--out",
                              L.fill(L.TRAIN_LABELS, dataset=d), "--split-out", L.fill(L.CLASS_SPLIT, dataset=d), *o],
                             f"logs/data/longtail_{d}.log") for d, o in options.items()]
    for part in ("train", "test"):
        cache = ["cache-images", "--labels", f"data/toy/{part}_labels.parquet", "--images",
                 paths.image_root(P, "toy", part), "--size", str(paths.cache_size(P, "toy")), "--out",
                 f"data/toy/cache/{part}.npy", "--no-progress"]
        expected[f"cache_{part}_images"] = [(cache, f"logs/data/cache_images_toy_{part}.log")]

    targets = [*(L.fill(L.TRAIN_LABELS, dataset=d) for d in ("toy", "toy_all", "toy_cap", "coco")),
               "data/toy/cache/train.npy", "data/toy/cache/test.npy", "data/pretrained/toy_glyphs.pt", asset,
               "data/toy/select/split.json", "data/toy/cache/select_fit.npy"]
    out = snakemake(wf, *args, "-n", "--printshellcmds", "--", *targets).stdout
    planned = {}
    for block in re.split(r"\n(?=(?:local)?(?:rule|checkpoint) \w+:)", out):
        rule = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block)
        command = re.search(r"^Shell command: (.*)$", block, re.M)
        if rule and command and rule.group(1) in expected:
            planned.setdefault(rule.group(1), []).append(" ".join(command.group(1).split()))
    for rule, jobs in expected.items():
        want = sorted(" ".join(f"$NOISYMLT_CLI {shlex.join(w)} > {log} 2>&1".split()) for w, log in jobs)
        assert sorted(planned.get(rule, [])) == want, rule
    assert "'file:///a mirror'" in planned["fetch_asset"][0]


def test_demo_profile_runs_end_to_end(tmp_path, tiny_data_project):
    wf = copy_build(tiny_data_project, tmp_path / "wf")  # TINY's data made (conftest); the runs and reports here
    args = write_layer(wf, TINY)
    snakemake(wf, *args, timeout=900)
    table = (wf / "reports" / "table_total.md").read_text()
    assert re.search(r"\| ERM \| _?\*?\*?\d+\.\d\d", table) and "| Ours-balance |" in table, table
    assert (wf / "reports" / "table_total.tex").read_text().count("ERM") == 1
    # every table and figure of the paper, in each of its formats
    made = {p.name for p in (wf / "reports").iterdir() if p.stat().st_size > 0}
    for stem, suffixes in {"table_total": ".tex .md .html .cells.json", "table_groups_toy": ".tex .md .html .cells.json",
                           "ablation_ab_k": ".tex .md .html .cells.json .png .pdf .csv",
                           "noise_level_toy": ".png .pdf", "pseudo_labels_toy": ".png .pdf",
                           "inference_time_toy": ".tex .md .html .json", "map_vs_gamma": ".png .pdf"}.items():
        for suffix in suffixes.split():
            assert stem + suffix in made, (stem + suffix, sorted(made))
    timing = (wf / "reports" / "inference_time_toy.md").read_text()
    assert "| Running time, batch 1 (s) |" in timing and "CPU" in timing
    readme_numbers = json.loads((wf / "reports" / "readme_numbers.json").read_text())
    assert {r["method"] for r in readme_numbers["rows"]} == {"erm", "ours"}
    # Snakemake's report holds every flagged table and figure with its caption
    snakemake(wf, *args, "--report", "reports/report.html", timeout=300)
    html = (wf / "reports" / "report.html").read_text(errors="replace")
    assert len(html) > 100_000 and "report.html" not in made
    for name in ("table_groups_toy.html", "ablation_ab_k.png", "noise_level_toy.png", "inference_time_toy.html"):
        assert name in html, name
    assert (wf / "reports" / "map_vs_gamma.png").stat().st_size > 1000
    results = pd.read_parquet(wf / "reports" / "results.parquet")
    assert sorted(results["gamma"].unique()) == [0.5, 0.9]
    assert results["run_id"].nunique() == 2 + 2 + 2  # ERM and Ours at two rates, two K variants
    assert results.loc[results["metric"] == "mAP", "value"].between(0, 1).all()
    # workflow.preload (the demo layer): every training job ran in a child of the preload server, which
    # logged it and ended with the workflow; its runs equal a plain process's (the `step train` check below)
    served = (wf / "logs" / "preload.log").read_text()
    assert len(re.findall(r"noisymlt train --out runs/toy/g0\.[59]/s0/\w+$", served, re.M)) == results["run_id"].nunique()
    assert served.count("exit status 0 after") >= results["run_id"].nunique() and "exit status 1" not in served
    sockets = re.findall(r"serving on (\S+):", served)
    assert sockets and not any(Path(sock).exists() for sock in sockets)  # stopped with the workflow
    for g in ("0.5", "0.9"):
        assert (wf / "logs" / "train" / f"toy_g{g}_s0_erm.log").exists()
        assert (wf / "runs" / "toy" / f"g{g}" / "s0" / "erm" / "checkpoint.pt").exists()
    # Everything is up to date: a second invocation plans nothing.
    again = snakemake(wf, *args, "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
    # Nothing machine-specific decides a rerun (issue 40: the interpreter's path was a param of every rule): the
    # finished project copied to another folder and driven by another venv's `python -m snakemake` plans nothing,
    # nor does the original under the other spelling of the interpreter.
    moved = tmp_path.parent / (tmp_path.name + "_moved")
    shutil.copytree(wf, moved, symlinks=True)
    try:
        other = other_venv(tmp_path.parent / (tmp_path.name + "_venv"))
        for python, where in ((other, moved), (Path(sys.executable), wf)):
            plan = subprocess.run([str(python), "-m", "snakemake", *args, "-n"], cwd=where, capture_output=True,
                                  text=True, timeout=300)
            assert "Nothing to be done" in plan.stdout + plan.stderr, (python, where, plan.stdout[-3000:])
    finally:
        shutil.rmtree(moved, ignore_errors=True)
        shutil.rmtree(tmp_path.parent / (tmp_path.name + "_venv"), ignore_errors=True)
    # Model selection: Ours' two stages wrote every candidate's score and the choice, its final runs trained with
    # the choice (ERM, whose selection the demo turns off, with its fixed values), and trace shows it.
    stage2 = json.loads((wf / "runs/toy/select/ours/stage2.json").read_text())
    assert [c["tag"] for c in stage2["candidates"]] == ["alpha0.9_beta0.1", "alpha0.7_beta0.1"]
    assert [c["tag"] for c in stage2["earlier_stages"][0]["candidates"]] == ["lr0.02", "lr0.08"]
    for g in ("0.5", "0.9"):
        cfg = json.loads((wf / f"runs/toy/g{g}/s0/ours/run_config.json").read_text())
        assert cfg["selected"]["values"] == stage2["chosen"] and cfg["train"]["lr"] == stage2["chosen"]["lr"]
    assert "selected" not in json.loads((wf / "runs/toy/g0.5/s0/erm/run_config.json").read_text())
    trace = subprocess.run([sys.executable, "-m", "noisymlt", "trace", "ours/ensemble/toy/0.5"], cwd=wf,
                           capture_output=True, text=True, timeout=120)
    assert trace.returncode == 0 and "selected alpha=" in trace.stdout and "stage 1 (lr): lr0.02" in trace.stdout
    # A changed choice retrains exactly the final runs that read it: the other alpha wins the validation now.
    loser = next(c["tag"] for c in stage2["candidates"] if c["tag"] != stage2["winner"])
    metrics = wf / "runs/toy/select/ours/stage2/g0.5/s0" / loser / "metrics.json"
    record = json.loads(metrics.read_text())
    record["heads"]["ensemble"]["map"]["total"] = 0.99
    metrics.write_text(json.dumps(record))
    rerun = snakemake(wf, *args, timeout=900)
    ran = re.findall(r"(?:rule|checkpoint) (\w+):\n(?:    \w+: .*\n)*?    wildcards: (.*)", rerun.stdout + rerun.stderr)
    assert {w for rule, w in ran if rule == "train"} == {f"dataset=toy, gamma={g}, noise=, seed=0, method=ours"
                                                         for g in ("0.5", "0.9")}  # noise=: the paper's model
    assert {w for rule, w in ran if rule == "select"} == {"dataset=toy, method=ours, stage=2"}
    assert "train_candidate" not in {rule for rule, _ in ran}
    alpha = next(c["values"]["alpha"] for c in stage2["candidates"] if c["tag"] == loser)
    assert json.loads((wf / "runs/toy/g0.5/s0/ours/run_config.json").read_text())["selected"]["values"]["alpha"] == alpha
    assert "Nothing to be done" in snakemake(wf, *args, "-n").stdout
    # Provenance: a table cell leads to its run manifest and input hashes.
    trace = subprocess.run([sys.executable, "-m", "noisymlt", "trace", "erm/main/toy/0.5", "--sidecar",
                            "reports/table_total.cells.json"], cwd=wf, capture_output=True, text=True, timeout=120)
    assert trace.returncode == 0 and "train_labels" in trace.stdout
    # The pretrained backbone came from the pipeline rule, and the runs fine-tuned it.
    assert (wf / "data" / "pretrained" / "toy_glyphs.json").exists()
    manifest = json.loads((wf / "runs" / "toy" / "g0.5" / "s0" / "erm" / "manifest.json").read_text())
    requested = json.loads((wf / "runs" / "toy" / "g0.5" / "s0" / "erm" / "requested_config.json").read_text())
    assert requested == manifest["run"]  # the file the job read is the configuration it trained
    assert manifest["run"]["train"]["weights_path"] == "data/pretrained/toy_glyphs.pt"
    assert manifest["cpu_threads"] == manifest["run"]["train"]["cpu_threads"] == 1
    assert set(manifest["inputs"]) >= {"train_cache", "test_cache"}  # train.loader: cache, through the rule



@pytest.mark.slow
def test_a_rerun_restores_what_a_bad_input_made_snakemake_delete(tmp_path, tiny_data_project):
    """A bad input makes a finished run's train job rerun and fail, and Snakemake deletes that job's outputs
    (predictions, manifests). Once the input is fixed (restored as it was, or deleted as the message says),
    a plain rerun must bring every one of them back, although the tables downstream are up to date."""
    import os

    import pyarrow.parquet as pq

    wf = copy_build(tiny_data_project, tmp_path / "wf")  # TINY's data made (conftest): one ERM run of it here
    args = write_layer(wf, tiny_layer({"grid": {"gammas": [0.5], "methods": ["erm"], "ablations": []},
                                       "timing": {"methods": ["erm"], "batch_sizes": [1]}}))
    snakemake(wf, *args, timeout=900)
    run = wf / "runs" / "toy" / "g0.5" / "s0" / "erm"
    finished = {p.name: p.read_bytes() for p in run.iterdir() if p.name in ("predictions.npz", "metrics.json")}

    def fails(expected: str) -> None:
        proc = subprocess.run([SNAKEMAKE, *args], cwd=wf, capture_output=True, text=True, timeout=600)
        assert proc.returncode != 0 and expected in proc.stdout + proc.stderr, proc.stderr[-3000:]
        assert not (run / "predictions.npz").exists() and not (run / "manifest.json").exists()  # deleted

    def restored() -> None:
        snakemake(wf, *args, timeout=600)
        for name in ("predictions.npz", "manifest.json", "run_config.json", "noise_level.jsonl", "metrics.json",
                     "metrics.manifest.json"):
            assert (run / name).is_file(), name
        assert {name: (run / name).read_bytes() for name in finished} == finished  # resumed, not retrained
        assert "Nothing to be done" in snakemake(wf, *args, "-n").stdout

    # a truncated image cache, deleted as the message says
    cache = wf / "data" / "toy" / "cache" / "train.npy"
    with open(cache, "r+b") as f:
        f.truncate(10_000)
    fails("is not what `noisymlt cache-images` wrote")  # checked against its record before it is opened
    log = (wf / "logs" / "train" / "toy_g0.5_s0_erm.log").read_text()
    assert "delete it and rerun the workflow" in log and "train.npy: content sha256" in log
    cache.unlink()
    restored()

    # the run's label table missing a column, then restored as it was (its old time stamp too)
    labels = wf / "data" / "toy" / "noisy" / "g0.5_s0.parquet"
    kept = tmp_path / "kept.parquet"
    shutil.copy2(labels, kept)
    table = pq.read_table(labels)
    pq.write_table(table.drop_columns([table.column_names[-1]]), labels)
    fails("missing; the table was written with them")
    shutil.copy2(kept, labels)
    assert os.stat(labels).st_mtime == os.stat(kept).st_mtime
    restored()

    # issue 40: one flipped byte in a dictionary page, a table that still parses; refused before training, and the
    # original file restored (old time stamp) gives back the original predictions byte for byte
    column = pq.ParquetFile(labels).metadata.row_group(0).column(2)
    data = bytearray(labels.read_bytes())
    at = data.index(b"\x1c\x01\x00\x00\x00", column.dictionary_page_offset)
    data[at + 1] = 0
    labels.write_bytes(data)
    fails("the file was damaged since it was written")
    assert "epoch 1/" not in (wf / "logs" / "train" / "toy_g0.5_s0_erm.log").read_text()  # stopped before training
    shutil.copy2(kept, labels)
    restored()
