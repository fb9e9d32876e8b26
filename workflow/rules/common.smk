# Helpers every phase file shares (Snakemake's lint wants no function in a file of rules): the grid, file layout per
# dataset kind, resolved run configs, the phases' targets; selection's and the cross-fitting's own are in
# select_helpers.smk and crossfit_helpers.smk. Paths come from noisymlt.pipeline.layout (the one module that spells the
# file layout); the words of a step that a dataset kind or a noise model spells from noisymlt.pipeline.paths.
import functools
import json
import os
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

from noisymlt.config import check_layered, inherit_recipes, requested_config, resolve_run
from noisymlt.data import assets
from noisymlt.errors import NoisyMLTError
from noisymlt.methods import run_digest
from noisymlt.data.noise_models import PAPER
from noisymlt.methods.options import stitchup_option
from noisymlt.pipeline import layout, paths, step_code
from noisymlt.pipeline.layout import gtag  # a noise rate as paths write it
from noisymlt.pipeline import selection as S  # the rules of select.smk and train.smk read it too
from noisymlt.report.style import dataset_title


def params_layers():
    """What Snakemake merged into config, first to last: params.yaml, each --configfile, --config's pairs."""
    from snakemake.common.configfile import load_configfile

    files = [Path("params.yaml"), *workflow.config_settings.configfiles]
    layers = [(os.path.relpath(f), load_configfile(str(f))) for f in files]
    if workflow.config_settings.config:
        layers.append(("--config", dict(workflow.config_settings.config)))
    return layers


try:
    inherit_recipes(config)  # a clean-then-retrain method's block: the recipe of the method it retrains
    check_layered(config, params_layers())
except NoisyMLTError as exc:  # one line, not Snakemake's traceback or jsonschema's dump of the schema
    raise SystemExit(f"noisymlt: {exc}") from None

GRID = config["grid"]


# Jobs run the interpreter that runs Snakemake, which has noisymlt installed anyway (this file imports it while
# parsing): no software deployment method is offered, and one asked for would be ignored, so it stops the run.
if workflow.deployment_settings.deployment_method:
    given = ", ".join(sorted(map(str, workflow.deployment_settings.deployment_method)))
    raise SystemExit(f"noisymlt: --software-deployment-method ({given}) is not offered: jobs run the Python that "
                     "runs Snakemake, the project's venv (docs/slurm.md)")

# Rules run `$NOISYMLT_CLI`, an environment variable every job inherits (a SLURM job's Snakemake sets it again),
# never a param: a param holding the interpreter's path made a copied project, a rebuilt venv or `python -m
# snakemake` for `snakemake` rerun every job ("Params have changed").
os.environ.update(NOISYMLT_CLI=f"{sys.executable} -m noisymlt")


def code(command):
    """Digest of the package modules `noisymlt COMMAND` runs (its static import closure): a rule's code
    param, so a job reruns when, and only when, code it runs changes (noisymlt.core.codedeps)."""
    return step_code.step_digest(command)


def run_code(w):
    """A training run's code: the trainer, its method's family and the losses it trains with."""
    return run_digest(resolved(w))


def dataset_of_raw(raw):
    """Raw files are per kind (and a toy stand-in's own folder), in folder RAW (under data/raw): any dataset block
    stored there tells how to get them."""
    return next(name for name in config["datasets"] if paths.raw_dir(config, name) == layout.fill(layout.RAW, raw=raw))


def raw_targets(field, downloaded):
    """The raw folders (field "raw") or their marker files (field "marker") of the configured datasets whose raw files
    a command writes: `download`'s (downloaded: a local rule) or another's, as a wildcard's regular expression. A
    user's own folder (no command) has no rule."""
    found = set()
    for dataset in config["datasets"]:
        words = paths.raw_argv(config, dataset)
        if words is not None and (words[0] == "download") == downloaded:
            found.add(layout.raw_parts(paths.raw_marker(config, dataset))[field])
    return "|".join(re.escape(f) for f in sorted(found)) or "(?!)"


def raw_dir(dataset):
    return paths.raw_dir(config, dataset)


def raw_marker(dataset):
    return paths.raw_marker(config, dataset)


def image_root(dataset, part):
    return paths.image_root(config, dataset, part)


def argv(args):
    """A step's argument list (from noisymlt.pipeline.paths) as shell words: a rule's `args` param."""
    return shlex.join(args)


def train_images_ready(dataset):
    """The file a dataset's train images are ready with: some kinds fetch theirs for the subset only, after the
    long-tail step (COCO's, one by one)."""
    return paths.train_images_ready(config, dataset)


def noise_of(w):
    """A job's noise model: its `noise` wildcard's (layout.noise_tag), the paper's for a job without one (a
    selection candidate)."""
    return layout.noise_name(getattr(w, "noise", ""))


def run_outputs(folder, noise_log=True):
    """A run's (or a selection candidate's) files, named as its shell command reads them; a candidate writes no
    noise-level log. checkpoint.pt is not among them (train.smk)."""
    names = {"requested_config.json": "requested", "predictions.npz": "predictions", "manifest.json": "manifest",
             "run_config.json": "config", "noise_level.jsonl": "noise", "metrics.json": "metrics",
             "metrics.manifest.json": "evaluation", "map.json": "map"}
    return {names[n]: layout.within(folder, n) for n in (*layout.RUN_FILES, "map.json")
            if noise_log or n != "noise_level.jsonl"}


def run_dir(w):
    return layout.fill(layout.RUN, dataset=w.dataset, gamma=w.gamma, seed=w.seed, method=w.method, noise=noise_of(w))


def resolved(w):
    return _resolved(w.dataset, w.method, float(w.gamma), int(w.seed), noise_of(w))


@functools.lru_cache(maxsize=None)  # four params of every train job read it; the config is fixed for the run
def _resolved(dataset, method, gamma, seed, noise):
    return resolve_run(config, dataset, method, gamma, seed, noise=noise)


def final_run_config(w):
    """A run's resolved config, with its method's selected values once the selection has chosen them."""
    choice = final_choice(w)  # select_helpers.smk
    return requested_config(config, w.dataset, w.method, float(w.gamma), int(w.seed), str(choice) if choice else None,
                            noise_of(w))


def train_threads(w):
    """The run's own CPU thread count (part of its config: CPU results depend on it), plus its loader
    workers when they are a number; with `workers: auto` the job takes its workers from the cores it is
    given (the train command's --cores {threads}), so raise a profile's set-threads to give it more."""
    train = resolved(w)["train"]
    workers = train.get("workers", 0)
    return train["cpu_threads"] + (workers if isinstance(workers, int) else 0)


def run_caches(w):
    """The decoded-image caches a run reads (train.loader: cache), as inputs; none for the PIL loader."""
    args = paths.cache_args(w.dataset, resolved(w)["train"].get("loader", "pil"))
    return args[1::2]


def cache_args(w):
    return argv(paths.cache_args(w.dataset, resolved(w)["train"].get("loader", "pil")))


def run_files(w):
    """The local files a run reads besides its data, as inputs: its backbone weights (train.weights_path: a
    file of data/pretrained/ made by the pretrain rule, or ImageNet's asset file) and its method's asset files
    (ML-GCN's GloVe vectors), each made by a rule (pretrain, fetch_asset), so the job never fetches."""
    return assets.run_files(resolved(w))


def train_table(w):
    """The table a main run trains on: its noisy set, or for a clean-then-retrain method that set cleaned."""
    if paths.cleaning_of(config, w.method) is None:
        return layout.fill(layout.NOISY, dataset=w.dataset, gamma=w.gamma, seed=w.seed, noise=noise_of(w))
    return paths.cleaned_table(config, w.dataset, float(w.gamma), int(w.seed), w.method, noise_of(w))


def selected_ablations():
    return {name: config["ablations"][name] for name in GRID.get("ablations", [])}


def all_runs(pattern):
    """Main grid and selected ablations (noisymlt.pipeline.paths.all_runs); a run shared by both is trained once.
    ``pattern``'s fields: dataset, gamma, seed, method and noise (the model's path tag, layout.noise_tag)."""
    runs = (pattern.format(dataset=d, gamma=gtag(g), seed=s, method=m, noise=layout.noise_tag(n))
            for d, g, s, m, n in paths.all_runs(config))
    return list(dict.fromkeys(runs))


def detection_methods():
    """The grid methods whose suspect labels the detection table ranks: all but the clean-then-retrain ones, whose
    training labels a cleaning changed (what it changed is in their cleaned tables' records)."""
    return [m for m in GRID["methods"] if paths.cleaning_of(config, m) is None]


def cleaning_records(dataset):
    """The record of every cleaned table the grid's methods train on at the detection table's noisy sets."""
    tables = [paths.cleaned_table(config, dataset, g, s, m, n) for m in GRID["methods"] if paths.cleaning_of(config, m)
              for n, g, s in paths.suspect_levels(config)]
    return [layout.ext(t[:-len(".parquet")], "json") for t in dict.fromkeys(tables)]


def cleanings():
    """Each grid method that cleans the labels, then retrains: its `clean` block (of, flags, action), in grid order."""
    return {m: clean for m in GRID["methods"] if (clean := paths.cleaning_of(config, m))}


def cleaned_pairs():
    """"A:B" for each grid method A that retrains method B's recipe on cleaned labels, B in the grid too."""
    return [f"{m}:{clean['of']}" for m, clean in cleanings().items() if clean["of"] in GRID["methods"]]


def oracle_methods():
    """Grid methods whose cleaning reads the clean training labels (flags: oracle): upper bounds, no baselines."""
    return [m for m, clean in cleanings().items() if clean["flags"] == "oracle"]


def method_labels():
    return paths.method_labels(config)


def sweep_values(w):
    """The swept Stitch-Up option's value for each method of a sweep ablation (its x axis)."""
    block = config["ablations"][w.name]
    if "sweep" not in block:
        raise ValueError(f"{layout.ext(layout.fill(layout.ABLATION, name=w.name), 'png')}: ablation {w.name} has no `sweep` key")
    option = block["sweep"]["option"]
    return json.dumps({m: stitchup_option(config["methods"][m], option) for m in block["methods"]})


def timing_runs(pattern):
    """The runs the running-time table times (params `timing`), as files of one dataset's wildcard."""
    block = config.get("timing") or {}
    return [pattern.format(gamma=gtag(block["gamma"]), noise="", seed=block["seed"], method=m)  # the paper's noise
            for m in block.get("methods", [])]


# The paper's training-dynamics figures (noise level during training, pseudo labels) show Ours at gamma 0.5.
FIGURE_METHOD = "ours"
FIGURE_GAMMA = 0.5


def figure_seeds(dataset):
    """Seeds of the FIGURE_METHOD runs at FIGURE_GAMMA on ``dataset`` that the workflow trains anyway
    (main grid or a selected ablation): the figures add no training job."""
    runs = (r.split("|") for r in all_runs("{dataset}|{gamma}{noise}|{seed}|{method}"))
    return sorted({int(s) for d, g, s, m in runs if (d, g, m) == (dataset, gtag(FIGURE_GAMMA), FIGURE_METHOD)})


def figure_run(dataset, seed, name):
    return layout.within(layout.fill(layout.RUN, dataset=dataset, gamma=FIGURE_GAMMA, seed=seed, method=FIGURE_METHOD), name)


def figure_logs(w):
    seeds = figure_seeds(w.dataset)
    if not seeds:
        raise ValueError(f"{layout.ext(layout.fill(layout.NOISE_FIGURE, dataset=w.dataset), 'png')}: the workflow trains no {FIGURE_METHOD} run at "
                         f"gamma {FIGURE_GAMMA} on {w.dataset} (add them to grid.methods/gammas)")
    return [figure_run(w.dataset, s, "noise_level.jsonl") for s in seeds]


def figure_datasets():
    datasets = dict.fromkeys(r.split("|")[0] for r in all_runs("{dataset}|{gamma}|{seed}|{method}"))
    return [d for d in datasets if figure_seeds(d)]


def timing_runs_trained(dataset):
    """The running-time table times runs the grid trains anyway (main grid or ablations), never extra ones."""
    wanted = timing_runs(layout.RUN.replace("{dataset}", dataset))
    return bool(wanted) and set(wanted) <= set(all_runs(layout.RUN))


def report_targets():
    """Every table and figure the grid's runs support, each as the file the report links."""
    L, datasets = layout, GRID["datasets"]
    return [
        *[L.ext(L.fill(L.STRUCTURE, dataset=d), "md") for d in datasets],  # each dataset's structure beside VOC-MLT's
        L.RESULTS,
        L.ext(L.TABLE_TOTAL, "tex"),
        *[L.ext(L.fill(L.TABLE_GROUPS, dataset=d), "tex") for d in datasets],
        *[L.ext(L.fill(L.FIT_TABLE, dataset=d), "tex") for d in datasets],
        *[L.ext(L.fill(L.PAIRED_TABLE, dataset=d), "tex") for d in datasets if "ours" in GRID["methods"]],
        L.ext(L.MAP_FIGURE, "png"),
        *[L.ext(L.fill(L.ABLATION, name=name), "tex") for name in selected_ablations()],
        *[L.ext(L.fill(L.ABLATION, name=name), "png") for name, block in selected_ablations().items() if "sweep" in block],
        *[L.ext(L.fill(L.INFERENCE_TIME, dataset=d), "tex") for d in datasets if timing_runs_trained(d)],
        # the numbers the README quotes (the demo's grid: one dataset)
        *([L.README_NUMBERS] if len(datasets) == 1 else []),
        *[L.ext(L.fill(fig, dataset=d), "png") for d in figure_datasets() for fig in (L.NOISE_FIGURE, L.PSEUDO_FIGURE)],
        # how well each method's ranking of suspect labels finds the wrong ones, where the grid has noisy runs
        *([L.ext(L.fill(L.DETECTION_TABLE, dataset=d), "tex") for d in datasets] if paths.suspect_levels(config) else []),
    ]


@functools.lru_cache(maxsize=None)  # `all` and the data and runs phases ask for it; the config is fixed for the run
def finished_work():
    """Every file a run writes or reads, for rule all. Snakemake deletes the outputs of a failed job and
    rebuilds a missing file only when a job that needs it has to run: after a bad input (a truncated image
    cache, a label table missing a column) made finished runs' jobs rerun and fail, the tables downstream
    were still up to date, so their predictions and manifests stayed missing once the input was fixed.
    Asking for them here makes a plain rerun restore them (tests/test_workflow.py)."""
    files = []
    for run in all_runs("{dataset}|{gamma}|{seed}|{method}|{noise}"):
        dataset, gamma, seed, method, noise = run.split("|")
        w = SimpleNamespace(dataset=dataset, gamma=gamma, seed=seed, method=method, noise=noise)
        files += [f"{run_dir(w)}/{name}" for name in layout.RUN_FILES]  # checkpoint.pt is not Snakemake's (train.smk)
        files += [layout.fill(p, dataset=dataset, gamma=gamma, seed=seed, noise=noise_of(w))
                  for p in (layout.NOISY, layout.NOISY_STATS)]
        files += [layout.fill(p, dataset=dataset) for p in (layout.SOURCE_LABELS, layout.TEST_LABELS,
                                                            layout.TRAIN_LABELS, layout.CLASS_SPLIT)]
        files += [f"{array[:-len('.npy')]}.{ext}" for array in run_caches(w) for ext in ("npy", "json")]
        files += [raw_marker(dataset), train_images_ready(dataset), *run_files(w)]
        if paths.cleaning_of(config, method) is not None:  # a clean-then-retrain run: its cleaned table
            files += [train_table(w), layout.ext(train_table(w)[:-len(".parquet")], "json")]
    return tuple(dict.fromkeys(files))


def data_targets():
    """What the data phase makes (the `data` rule, DVC's `data` stage): every file under data/ that a run, a
    selection candidate or a cross-fitting run reads."""
    return [f for f in (*finished_work(), *crossfit_work()) if f.startswith("data/")] + selection_data()


def run_targets():
    """What the runs phase makes (the `runs` rule, DVC's `runs` stage): every run's files (the cross-fitting's
    too), the selection's stage files and [CL]'s evaluated checkpoints."""
    runs = [f for f in (*finished_work(), *crossfit_work()) if f.startswith("runs/")]
    return runs + selection_targets() + authors_targets()


def authors_names():
    """The names of params authors_checkpoints, as the authors_eval rule's wildcard's regular expression."""
    return "|".join(re.escape(n) for n in sorted(paths.authors_checkpoints(config))) or "(?!)"


def authors_targets():
    """Every file of the evaluation of each [CL] checkpoint the params list (authors.smk), for the default target
    (`all`): none when authors_checkpoints is empty, the default."""
    return [layout.within(layout.fill(layout.AUTHORS_RUN, dataset=block["dataset"], name=name), file)
            for name, block in paths.authors_checkpoints(config).items() for file in layout.AUTHORS_FILES]


# workflow.preload (the demo): on a local run, one server process imports torch once and every noisymlt
# job runs in a child forked from it (noisymlt.pipeline.preload), which saves ~3.5 s of start-up per job.
if config.get("workflow", {}).get("preload") and workflow.local_exec:
    from noisymlt.pipeline import preload as _preload

    _PRELOAD = []

    def _stop_preload():
        for server in _PRELOAD:
            _preload.stop_server(*server)

    onstart:
        _PRELOAD.append(_preload.start_server(log=Path("logs/preload.log")))
        os.environ[_preload.ENV] = _PRELOAD[0][0]

    onsuccess:
        _stop_preload()

    onerror:
        _stop_preload()
