# Helpers shared by the rule files: the grid, file layout per dataset kind, resolved run configs.
import json
import sys

from noisymlt.config import resolve_run, run_id, validate_params
from noisymlt.provenance import code_digest

validate_params(config, source="params")

NOISYMLT = f"{sys.executable} -m noisymlt"
CODE = code_digest()  # a rule param: Snakemake reruns jobs when the package code changes
GRID = config["grid"]


wildcard_constraints:
    dataset="[a-z0-9_]+",
    gamma="[0-9.]+",
    seed="[0-9]+",
    method="[A-Za-z0-9_]+",


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
