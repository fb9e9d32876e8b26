# Helpers shared by every phase file: the grid, file layout per dataset kind, resolved run configs.
# The file layout per dataset kind lives in noisymlt.steps, which dvc.yaml's commands use too.
import functools
import json
import shlex
import sys

from noisymlt import codedeps, steps
from noisymlt.config import resolve_run, validate_params

validate_params(config, source="params")


def _cli():
    """The interpreter that runs Snakemake has noisymlt installed (venv route); under
    `--sdm conda` each job's own environment provides `python`."""
    methods = getattr(workflow.deployment_settings, "deployment_method", ()) or ()
    if any(str(m).lower().endswith("conda") for m in methods):
        return "python -m noisymlt"
    return f"{sys.executable} -m noisymlt"


NOISYMLT = _cli()


def code(command):
    """Digest of the package modules `noisymlt COMMAND` runs (its static import closure): a rule's code
    param, so a job reruns when, and only when, code it runs changes (noisymlt.codedeps)."""
    return codedeps.step_digest(command)


def run_code(w):
    """A training run's code: the trainer, its method's family and the losses it trains with."""
    return codedeps.run_digest(resolved(w))
GRID = config["grid"]


def gtag(gamma):
    return steps.gtag(gamma)


def kind(dataset):
    return config["datasets"][dataset]["kind"]


def dataset_of_kind(k):
    """The raw files are per kind: any dataset block of that kind tells how to get them."""
    return next(name for name, block in config["datasets"].items() if block["kind"] == k)


def raw_dir(dataset):
    return steps.raw_dir(config, dataset)


def raw_marker(dataset):
    return steps.raw_marker(config, dataset)


def image_root(dataset, part):
    return steps.image_root(config, dataset, part)


def argv(args):
    """A step's argument list (from noisymlt.steps, shared with dvc.yaml) as shell words."""
    return shlex.join(args)


def train_images_ready(dataset):
    """COCO train images are fetched one by one for the subset only, after the long-tail step."""
    if kind(dataset) == "coco":
        return f"{steps.train_images_dir(dataset)}/train2017/manifest.json"
    return raw_marker(dataset)


def run_dir(w):
    return f"runs/{w.dataset}/g{w.gamma}/s{w.seed}/{w.method}"


def resolved(w):
    return _resolved(w.dataset, w.method, float(w.gamma), int(w.seed))


@functools.lru_cache(maxsize=None)  # four params of every train job read it; the config is fixed for the run
def _resolved(dataset, method, gamma, seed):
    return resolve_run(config, dataset, method, gamma, seed)


def run_config(w):
    return json.dumps(resolved(w), sort_keys=True)


def train_threads(w):
    """The run's own CPU thread count (part of its config: CPU results depend on it)."""
    return resolved(w)["train"]["cpu_threads"]


def backbone_weights(w):
    """A run's weights_path, as an input: a file of data/pretrained/ is made by the pretrain rule."""
    path = resolved(w)["train"].get("weights_path")
    return [path] if path else []


def pretrain_config(w):
    if w.name not in config.get("pretrain", {}):
        known = ", ".join(sorted(config.get("pretrain", {}))) or "none"
        raise ValueError(f"data/pretrained/{w.name}.pt: no block pretrain.{w.name} in params (configured: {known})")
    return json.dumps(config["pretrain"][w.name], sort_keys=True)


def grid_runs(pattern):
    return [
        pattern.format(dataset=d, gamma=gtag(g), seed=s, method=m)
        for d in GRID["datasets"]
        for g in GRID["gammas"]
        for s in GRID["seeds"]
        for m in GRID["methods"]
    ]


def selected_ablations():
    return {name: config["ablations"][name] for name in GRID.get("ablations", [])}


def ablation_runs(name, pattern):
    block = config["ablations"][name]
    return [
        pattern.format(dataset=block["dataset"], gamma=gtag(g), seed=s, method=m)
        for g in block["gammas"]
        for s in block["seeds"]
        for m in block["methods"]
    ]


def all_runs(pattern):
    """Main grid and selected ablations; a run shared by both is trained once."""
    runs = grid_runs(pattern)
    for name in selected_ablations():
        runs += ablation_runs(name, pattern)
    return list(dict.fromkeys(runs))


def method_labels():
    return json.dumps({m: b.get("label", m) for m, b in config["methods"].items()})


# The paper's training-dynamics figures (noise level during training, pseudo labels) show Ours at gamma 0.5.
FIGURE_METHOD = "ours"
FIGURE_GAMMA = 0.5


def figure_seeds(dataset):
    """Seeds of the FIGURE_METHOD runs at FIGURE_GAMMA on ``dataset`` that the workflow trains anyway
    (main grid or a selected ablation): the figures add no training job."""
    runs = (r.split("|") for r in all_runs("{dataset}|{gamma}|{seed}|{method}"))
    return sorted({int(s) for d, g, s, m in runs if (d, g, m) == (dataset, gtag(FIGURE_GAMMA), FIGURE_METHOD)})


def figure_run(dataset, seed, name):
    return f"runs/{dataset}/g{gtag(FIGURE_GAMMA)}/s{seed}/{FIGURE_METHOD}/{name}"


def figure_logs(w):
    seeds = figure_seeds(w.dataset)
    if not seeds:
        raise ValueError(f"reports/noise_level_{w.dataset}.png: the workflow trains no {FIGURE_METHOD} run at "
                         f"gamma {FIGURE_GAMMA} on {w.dataset} (add them to grid.methods/gammas)")
    return [figure_run(w.dataset, s, "noise_level.jsonl") for s in seeds]


def figure_datasets():
    datasets = dict.fromkeys(r.split("|")[0] for r in all_runs("{dataset}|{gamma}|{seed}|{method}"))
    return [d for d in datasets if figure_seeds(d)]


def report_targets():
    return [
        "reports/table_total.tex",
        "reports/results.parquet",
        "reports/map_vs_gamma.png",
        *[f"reports/ablation_{name}.tex" for name in selected_ablations()],
        *[f"reports/{fig}_{d}.png" for d in figure_datasets() for fig in ("noise_level", "pseudo_labels")],
    ]
