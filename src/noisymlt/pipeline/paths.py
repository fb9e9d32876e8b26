"""params.yaml -> the explicit arguments of the steps that depend on a dataset's kind, and the run grid.

Toy data are generated and VOC/COCO downloaded, each kind has its own folder layout, and a run's image folders and
caches follow its dataset and loader: these functions compute a step's arguments from the params, for both routes
(the step declarations, noisymlt.pipeline.steps, name them; Snakemake's rules call them as params, DVC's stages
get their values through dvc-params.json, and ``noisymlt step``, noisymlt.pipeline.dvc_steps, runs them by hand).
The path patterns are ``noisymlt.pipeline.layout``'s; only the raw folders, which depend on a dataset's kind, are
spelled here.
"""

from __future__ import annotations

import json

from noisymlt.errors import NoisyMLTError
from noisymlt.pipeline import layout as L

PARTS = ("train_source", "test")
CACHE_PARTS = ("train", "test")


def dataset_block(params: dict, name: str) -> dict:
    try:
        return params["datasets"][name]
    except KeyError:
        known = ", ".join(sorted(params.get("datasets", {}))) or "none"
        raise NoisyMLTError(f"params: no block datasets.{name} (configured: {known})") from None


def raw_dir(params: dict, name: str) -> str:
    """Raw files of a dataset: one folder per kind, shared by datasets of the same kind; a VOC stand-in drawn
    by the toy generator (kind voc with a toy block: smoke runs) has its own, so it never takes VOC's place."""
    block = dataset_block(params, name)
    return f"data/raw/{block['kind']}_toy" if block["kind"] == "voc" and "toy" in block else f"data/raw/{block['kind']}"


def raw_marker(params: dict, name: str) -> str:
    """File that exists once a dataset's raw files are in place."""
    kind, raw = dataset_block(params, name)["kind"], raw_dir(params, name)
    return f"{raw}/VOCdevkit/TOY/toy_manifest.json" if kind == "toy" else f"{raw}/manifest.json"


def train_images_dir(name: str) -> str:
    """COCO train images of a dataset's subset (fetched one by one after the long-tail step). They
    live beside the dataset, not in the raw folder, so that every folder has exactly one writer."""
    return L.fill(L.TRAIN_IMAGES, dataset=name)


def image_root(params: dict, name: str, part: str) -> str:
    """Folder the ``path`` column of a dataset's train ('train') or test ('test') table is relative to."""
    kind, raw = dataset_block(params, name)["kind"], raw_dir(params, name)
    if kind == "toy":
        return f"{raw}/VOCdevkit/TOY"
    if kind == "voc":
        return f"{raw}/VOCdevkit/{'VOC2012' if part == 'train' else 'VOC2007'}"
    return train_images_dir(name) if part == "train" else raw


def _download_args(params: dict) -> list[str]:
    dl = params.get("download") or {}
    return (["--mirror", dl["mirror"]] if dl.get("mirror") else []) + ["--retries", str(dl.get("retries", 5))]


def raw_argv(params: dict, name: str) -> list[str]:
    """`noisymlt make-toy` (toy) or `noisymlt download` (voc, coco) into raw_dir."""
    block = dataset_block(params, name)
    kind, raw = block["kind"], raw_dir(params, name)
    if "toy" in block or kind == "toy":
        opts = block.get("toy", {})
        layout = ["--layout", "voc"] if kind == "voc" else []
        return ["make-toy", "--out", raw, *layout] + [a for k, v in opts.items()
                                                     for a in (f"--{k.replace('_', '-')}", str(v))]
    return ["download", "--dataset", kind, "--root", raw] + _download_args(params)


def asset_argv(params: dict, path: str) -> list[str]:
    """`noisymlt fetch-asset` of the asset stored at ``path`` (a key of noisymlt.data.assets.entries)."""
    from noisymlt.data.assets import entries

    known = entries(params)
    if path not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise NoisyMLTError(f"{path}: not an asset of the params (assets.imagenet / assets.glove give: {listed})")
    spec = known[path]
    return (["fetch-asset", "--url", spec["url"], "--sha256", spec["sha256"], "--out", path,
             "--name", f"assets.{spec['group']}.{spec['name']}"] + _download_args(params))


def parse_argv(params: dict, name: str, part: str, out: str) -> list[str]:
    """`noisymlt parse` of the train source pool ('train_source') or the test set ('test')."""
    if part not in PARTS:
        raise NoisyMLTError(f"--part must be one of {', '.join(PARTS)}, got {part!r}")
    kind, raw = dataset_block(params, name)["kind"], raw_dir(params, name)
    train = part == "train_source"
    if kind == "toy":
        src = ["--format", "voc", "--source", f"{raw}/VOCdevkit/TOY", "--image-set", "trainval" if train else "test"]
    elif kind == "voc":
        year, image_set = ("VOC2012", "trainval") if train else ("VOC2007", "test")
        src = ["--format", "voc", "--source", f"{raw}/VOCdevkit/{year}", "--image-set", image_set]
    else:
        split = "train2017" if train else "val2017"
        src = ["--format", "coco", "--source", f"{raw}/annotations/instances_{split}.json", "--image-dir", split]
    return ["parse", *src, "--out", out]


def longtail_argv(params: dict, name: str, labels: str, out: str, split_out: str) -> list[str]:
    block = dataset_block(params, name)
    lt = block["longtail"]
    argv = ["longtail", "--labels", labels, "--out", out, "--split-out", split_out, "--source", lt["source"],
            "--b", str(lt.get("b", 6)), "--max", str(lt.get("max", 800)), "--min", str(lt.get("min", 1)),
            "--seed", str(lt.get("seed", 0))]
    if lt.get("cap_to_available"):
        argv.append("--cap-to-available")
    if lt.get("groups", "fixed") != "fixed":
        argv += ["--groups", lt["groups"]]
    if lt["source"] == "official":
        argv += ["--dataset", block["kind"]]
    return argv


def train_images_argv(params: dict, name: str, ids: str, out: str) -> list[str] | None:
    """`noisymlt fetch-coco-images` for COCO; None for kinds whose train images are in the raw folder."""
    if dataset_block(params, name)["kind"] != "coco":
        return None
    return ["fetch-coco-images", "--annotations", f"{raw_dir(params, name)}/annotations/instances_train2017.json",
            "--ids", ids, "--out", f"{out}/train2017"] + _download_args(params)


def pretrain_argv(params: dict, name: str, out: str) -> list[str]:
    """`noisymlt pretrain` of block pretrain.NAME (the Snakemake rule passes the same JSON)."""
    blocks = params.get("pretrain", {})
    if name not in blocks:
        known = ", ".join(sorted(blocks)) or "none"
        raise NoisyMLTError(f"{out}: no block pretrain.{name} in params (configured: {known})")
    return ["pretrain", "--config", json.dumps(blocks[name], sort_keys=True), "--out", out, "--no-progress"]


def cache_size(params: dict, name: str) -> int:
    """train.cache_size with the dataset's train block over it: one cache per dataset, shared by its runs."""
    from noisymlt.config import deep_merge

    train = deep_merge(params["train"], dataset_block(params, name).get("train", {}))
    if "cache_size" not in train:
        raise NoisyMLTError(f"params: train.cache_size is not set (dataset {name})")
    return int(train["cache_size"])


def cache_argv(params: dict, name: str, part: str, out: str) -> list[str]:
    """`noisymlt cache-images` of a dataset's train subset or test set at its cache size (the train cache holds the
    subset's images, whose rows the noisy copies share)."""
    labels = L.fill(L.LABELS, dataset=name, part="train" if part == "train" else "test")
    return ["cache-images", "--labels", labels, "--images", image_root(params, name, part),
            "--size", str(cache_size(params, name)), "--out", out, "--no-progress"]


def cache_args(name: str, loader: str, candidate: bool = False) -> list[str]:
    """The train command's cache arguments for a run whose train.loader is ``loader``: its train subset's and test
    set's caches, or a selection candidate's (``candidate``: the fit and val images')."""
    if loader != "cache":
        return []
    pattern, parts = (L.SELECT_CACHE, ("fit", "val")) if candidate else (L.CACHE, ("train", "test"))
    return ["--train-cache", L.fill(pattern, dataset=name, part=parts[0]),
            "--test-cache", L.fill(pattern, dataset=name, part=parts[1])]


def select_split_argv(params: dict, dataset: str, out: str) -> list[str]:
    from noisymlt.pipeline.selection import split_tables

    block = params["selection"]
    tables = [f"{name}={path}" for name, path in split_tables(params, dataset).items()]
    return ["select", "split", "--noisy", *tables, "--held-out", str(block["held_out"]),
            "--seed", str(block["split_seed"]), "--out", out]


def select_cache_argv(params: dict, dataset: str, part: str, out: str) -> list[str]:
    """`noisymlt cache-images` of the fit or val images, from the first selection set's table of that part (the
    other sets' tables hold the same rows, which is all a cache checks)."""
    from noisymlt.pipeline.selection import selection_sets

    gamma, seed = selection_sets(params)[0]
    return ["cache-images", "--labels", L.fill(L.SELECT_PART, dataset=dataset, gamma=gamma, seed=seed, part=part),
            "--images", image_root(params, dataset, "train"), "--size", str(cache_size(params, dataset)),
            "--out", out, "--no-progress"]


def run_dir(dataset: str, gamma: float, seed: int, method: str, root: str = "runs") -> str:
    """A run's folder (layout.RUN), with ``root`` in place of its first component, the runs folder."""
    path = L.fill(L.RUN, dataset=dataset, gamma=gamma, seed=seed, method=method)
    return root + path[path.index("/"):]


CLEAN = 0.0  # the noise rate of the clean column: the noise step copies the clean labels


def grid_runs(params: dict) -> list[tuple[str, float, int, str]]:
    """(dataset, gamma, seed, method) of every run in the grid, in Snakemake's expansion order, then the clean
    column's (gamma 0, grid.clean_methods) at every dataset and seed."""
    g = params["grid"]
    return ([(d, float(gm), int(s), m) for d in g["datasets"] for gm in g["gammas"] for s in g["seeds"]
             for m in g["methods"]]
            + [(d, CLEAN, int(s), m) for d in g["datasets"] for s in g["seeds"] for m in g.get("clean_methods", [])])


def ablation_runs(params: dict, name: str) -> list[tuple[str, float, int, str]]:
    """(dataset, gamma, seed, method) of every run of the ablation block ``name``."""
    block = params["ablations"][name]
    return [(block["dataset"], float(gm), int(s), m) for gm in block["gammas"] for s in block["seeds"]
            for m in block["methods"]]


def all_runs(params: dict) -> list[tuple[str, float, int, str]]:
    """Every run the workflow trains: the main grid, then each ablation in grid.ablations; a run in
    both is trained once (the Snakemake rules and the paper grid's cost plan read this list)."""
    runs = grid_runs(params)
    for name in params["grid"].get("ablations", []):
        runs += ablation_runs(params, name)
    return list(dict.fromkeys(runs))


def method_labels(params: dict) -> str:
    """Every method's title in the tables and figures (methods.*.label), as the JSON their --labels takes."""
    return json.dumps({m: b.get("label", m) for m, b in params["methods"].items()})


def final_run(params: dict, dataset: str, method: str, gamma: float, seed: int, choice: str | None) -> dict:
    """A final run's resolved config, with its method's chosen values read from the choice file (if any) as the
    configuration's last layer (config.resolve_run)."""
    from noisymlt.config import resolve_run
    from noisymlt.pipeline.selection import read_choice

    chosen = read_choice(choice) if choice else None
    return resolve_run(params, dataset, method, gamma, seed, chosen=chosen, chosen_by=str(choice or ""))


def config_text(resolved: dict) -> str:
    """A run's resolved config as the text both routes write to OUT/requested_config.json (Snakemake's train job
    prints it with a final newline, as the DVC train stage writes it): the train job reads it."""
    return json.dumps(resolved, sort_keys=True, indent=1)


def requested_config(params: dict, dataset: str, method: str, gamma: float, seed: int, choice: str | None) -> str:
    """A final run's requested_config.json text (final_run, config_text)."""
    return config_text(final_run(params, dataset, method, gamma, seed, choice))
