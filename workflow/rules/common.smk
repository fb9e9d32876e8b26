# Helpers shared by every phase file: the grid, file layout per dataset kind, resolved run configs.
import json
import sys

from noisymlt.config import resolve_run, run_id, validate_params
from noisymlt.provenance import code_digest

validate_params(config, source="params")



def _cli():
    """The interpreter that runs Snakemake has noisymlt installed (venv route); under
    `--sdm conda` each job's own environment provides `python`."""
    methods = getattr(workflow.deployment_settings, "deployment_method", ()) or ()
    if any(str(m).lower().endswith("conda") for m in methods):
        return "python -m noisymlt"
    return f"{sys.executable} -m noisymlt"


NOISYMLT = _cli()
CODE = code_digest()  # passed as a param, so Snakemake reruns jobs when the package code changes
GRID = config["grid"]


def gtag(gamma):
    """Noise rate as written in paths: 0.5 -> '0.5'."""
    return f"{float(gamma):g}"


def kind(dataset):
    return config["datasets"][dataset]["kind"]


def raw_dir(dataset):
    return f"data/raw/{kind(dataset)}"


def raw_marker(dataset):
    """File that exists once a dataset's raw files are in place."""
    return f"{raw_dir(dataset)}/" + ("VOCdevkit/TOY/toy_manifest.json" if kind(dataset) == "toy" else "manifest.json")


def parse_args(dataset, part):
    """`noisymlt parse` arguments for the train source pool or the test set."""
    k, raw = kind(dataset), raw_dir(dataset)
    if k == "toy":
        return f"--format voc --source {raw}/VOCdevkit/TOY --image-set {'trainval' if part == 'train' else 'test'}"
    if k == "voc":
        year, image_set = ("VOC2012", "trainval") if part == "train" else ("VOC2007", "test")
        return f"--format voc --source {raw}/VOCdevkit/{year} --image-set {image_set}"
    name = "train2017" if part == "train" else "val2017"
    return f"--format coco --source {raw}/annotations/instances_{name}.json --image-dir {name}"


def image_root(dataset, part):
    k, raw = kind(dataset), raw_dir(dataset)
    if k == "toy":
        return f"{raw}/VOCdevkit/TOY"
    if k == "voc":
        return f"{raw}/VOCdevkit/{'VOC2012' if part == 'train' else 'VOC2007'}"
    return raw


def train_images_ready(dataset):
    """COCO train images are fetched one by one for the subset only, after the long-tail step."""
    return f"data/{dataset}/train_images.done" if kind(dataset) == "coco" else raw_marker(dataset)


def run_dir(w):
    return f"runs/{w.dataset}/g{w.gamma}/s{w.seed}/{w.method}"


def run_config(w):
    return json.dumps(resolve_run(config, w.dataset, w.method, float(w.gamma), int(w.seed)), sort_keys=True)


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
