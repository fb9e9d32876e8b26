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
    """The run's own CPU thread count (part of its config: CPU results depend on it), plus its loader
    workers when they are a number; with `workers: auto` the job takes its workers from the cores it is
    given (the train command's --cores {threads}), so raise a profile's set-threads to give it more."""
    train = resolved(w)["train"]
    workers = train.get("workers", 0)
    return train["cpu_threads"] + (workers if isinstance(workers, int) else 0)


def run_caches(w):
    """The decoded-image caches a run reads (train.loader: cache), as inputs; none for the PIL loader."""
    args = steps.cache_args(w.dataset, resolved(w)["train"].get("loader", "pil"))
    return args[1::2]


def cache_args(w):
    return argv(steps.cache_args(w.dataset, resolved(w)["train"].get("loader", "pil")))


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


def report_targets():
    return [
        "reports/table_total.tex",
        "reports/results.parquet",
        "reports/map_vs_gamma.png",
        *[f"reports/ablation_{name}.tex" for name in selected_ablations()],
    ]
