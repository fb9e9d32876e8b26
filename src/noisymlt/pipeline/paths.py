"""params.yaml -> the words of the steps that a plug-in spells, the values the other rules write, and the run grid.

Each dataset kind (noisymlt.data.kinds) says how its raw files arrive and how its parts become label tables, and a
noise model how it draws a noisy set: these functions ask the plug-in for a step's words (the rules that run them
take them as their `args` param, so `snakemake -n -p` prints the words a job runs). Every other rule writes its
command in its `shell:`, with values from here (image folders, cache size, asset entries, pretrain blocks, the
long-tail options a block may leave out); a script that needs the data asks Snakemake for it
(scripts/device_check.py), so no command is spelled twice.
The path patterns are ``noisymlt.pipeline.layout``'s; the raw folders under ``layout.RAW_ROOT`` are the kinds'.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from noisymlt.data.kinds.base import PARTS
from noisymlt.data.noise_models import PAPER
from noisymlt.errors import NoisyMLTError
from noisymlt.pipeline import layout as L

CACHE_PARTS = ("train", "test")


def dataset_block(params: dict, name: str) -> dict:
    try:
        return params["datasets"][name]
    except KeyError:
        known = ", ".join(sorted(params.get("datasets", {}))) or "none"
        raise NoisyMLTError(f"params: no block datasets.{name} (configured: {known})") from None


def kind(params: dict, name: str):
    """The dataset kind (noisymlt.data.kinds) of block datasets.NAME."""
    from noisymlt.data.kinds import dataset_kind

    return dataset_kind(dataset_block(params, name))


def raw_dir(params: dict, name: str) -> str:
    """Raw files of a dataset: a folder under data/raw per kind (shared by datasets of the kind; a VOC stand-in drawn
    by the toy generator has its own, so it never takes VOC's place), or the user's own folder."""
    return kind(params, name).raw_dir(dataset_block(params, name), L.RAW_ROOT)


def raw_marker(params: dict, name: str) -> str:
    """File that exists once a dataset's raw files are in place."""
    return kind(params, name).raw_marker(dataset_block(params, name), raw_dir(params, name))


def train_images_dir(name: str) -> str:
    """Train images fetched for a dataset's subset after the long-tail step (COCO's). They live beside the
    dataset, not in the raw folder, so that every folder has exactly one writer."""
    return L.fill(L.TRAIN_IMAGES, dataset=name)


def fetches_train_images(params: dict, name: str) -> bool:
    return kind(params, name).fetches_train_images


def train_images_ready(params: dict, name: str) -> str:
    """The file a dataset's train images are ready with: the fetch step's, or the raw files' marker."""
    return L.fill(L.TRAIN_IMAGES_READY, dataset=name) if fetches_train_images(params, name) else raw_marker(params, name)


def train_images_folder(params: dict, name: str) -> str:
    """The folder holding a dataset's train images: the fetched ones, or the raw folder."""
    return train_images_dir(name) if fetches_train_images(params, name) else raw_dir(params, name)


def image_root(params: dict, name: str, part: str) -> str:
    """Folder the ``path`` column of a dataset's train ('train') or test ('test') table is relative to."""
    return kind(params, name).image_root(dataset_block(params, name), raw_dir(params, name), part,
                                          train_images_dir(name))


def _download_args(params: dict) -> list[str]:
    dl = params.get("download") or {}
    return (["--mirror", dl["mirror"]] if dl.get("mirror") else []) + ["--retries", str(dl.get("retries", 5))]


def raw_argv(params: dict, name: str) -> list[str] | None:
    """The command that writes a dataset's raw files into raw_dir (`noisymlt make-toy`, `noisymlt download`); None
    when they are the user's own, already in place."""
    return kind(params, name).raw_argv(dataset_block(params, name), raw_dir(params, name), _download_args(params))


def asset_entry(params: dict, path: str) -> dict:
    """The params entry of the asset stored at ``path`` (noisymlt.data.assets.entries): the fetch_asset rule's
    url, sha256 and name."""
    from noisymlt.data.assets import entries

    known = entries(params)
    if path not in known:
        listed = ", ".join(sorted(known)) or "none"
        raise NoisyMLTError(f"{path}: not an asset of the params (assets.imagenet / assets.glove give: {listed})")
    return known[path]


def parse_argv(params: dict, name: str, part: str, out: str) -> list[str]:
    """The command that writes the label table of the train source pool ('train_source') or the test set ('test')."""
    if part not in PARTS:
        raise NoisyMLTError(f"--part must be one of {', '.join(PARTS)}, got {part!r}")
    return kind(params, name).parse_argv(dataset_block(params, name), raw_dir(params, name), part, out)


def longtail_options(params: dict, name: str) -> dict[str, list[str]]:
    """The longtail rule's options that a dataset's longtail block may leave out, each as its words (none when left
    out): the draw's settings with the command's defaults (none for source all, the set as it is),
    --cap-to-available, --groups, and the kind whose published list source official reads."""
    block = dataset_block(params, name)
    lt = block["longtail"]
    draw = [] if lt["source"] == "all" else ["--b", str(lt.get("b", 6)), "--max", str(lt.get("max", 800)),
                                             "--min", str(lt.get("min", 1)), "--seed", str(lt.get("seed", 0))]
    return {"draw": draw,
            "cap": ["--cap-to-available"] if lt.get("cap_to_available") else [],
            "groups": [] if lt.get("groups", "fixed") == "fixed" else ["--groups", lt["groups"]],
            "official": ["--dataset", block["kind"]] if lt["source"] == "official" else []}  # kinds: official_list


def train_images_argv(params: dict, name: str, ids: str, out: str) -> list[str] | None:
    """The command that fetches a dataset's train images for its subset (`noisymlt fetch-coco-images`); None for
    kinds whose train images are in the raw folder."""
    return kind(params, name).train_images_argv(dataset_block(params, name), raw_dir(params, name), ids, out,
                                                _download_args(params))


def pretrain_block(params: dict, name: str) -> dict:
    """Block pretrain.NAME, which the pretrain rule passes as JSON."""
    blocks = params.get("pretrain", {})
    if name not in blocks:
        known = ", ".join(sorted(blocks)) or "none"
        raise NoisyMLTError(f"{L.fill(L.PRETRAINED, name=name)}: no block pretrain.{name} in params "
                            f"(configured: {known})")
    return blocks[name]


def cache_size(params: dict, name: str) -> int:
    """train.cache_size with the dataset's train block over it: one cache per dataset, shared by its runs."""
    from noisymlt.config import deep_merge

    train = deep_merge(params["train"], dataset_block(params, name).get("train", {}))
    if "cache_size" not in train:
        raise NoisyMLTError(f"params: train.cache_size is not set (dataset {name})")
    return int(train["cache_size"])


def cache_args(name: str, loader: str, pattern: str = L.CACHE, parts: tuple[str, str] = ("train", "test"),
               **fields) -> list[str]:
    """The train command's cache arguments for a run whose train.loader is ``loader``: the caches of ``pattern``'s
    two ``parts``, the images it trains on and those it predicts (a final run: its train subset and the test set; a
    selection candidate: SELECT_CACHE's fit and val; a cross-fitting run: CROSSFIT_CACHE's train and held, with
    ``fold``)."""
    if loader != "cache":
        return []
    return ["--train-cache", L.fill(pattern, dataset=name, part=parts[0], **fields),
            "--test-cache", L.fill(pattern, dataset=name, part=parts[1], **fields)]


class Run(NamedTuple):
    """One training run of the workflow; ``noise``: its noise model (the paper's unless the grid lists others)."""

    dataset: str
    gamma: float
    seed: int
    method: str
    noise: str = PAPER


def run_dir(dataset: str, gamma: float, seed: int, method: str, noise: str = PAPER, root: str = "runs") -> str:
    """A run's folder (layout.RUN), with ``root`` in place of its first component, the runs folder."""
    path = L.fill(L.RUN, dataset=dataset, gamma=gamma, seed=seed, method=method, noise=noise)
    return root + path[path.index("/"):]


CLEAN = 0.0  # the noise rate of the clean column: the noise step copies the clean labels


def noise_models(params: dict) -> list[str]:
    """The noise models the grid's noisy columns expand over (grid.noise_models; default: the paper's alone)."""
    return list(params["grid"].get("noise_models", [PAPER]))


def grid_runs(params: dict) -> list[Run]:
    """Every run in the grid, in Snakemake's expansion order (dataset, noise model, rate, seed, method), then the
    clean column's (gamma 0, grid.clean_methods; no noise model) at every dataset and seed."""
    g = params["grid"]
    return ([Run(d, float(gm), int(s), m, n) for d in g["datasets"] for n in noise_models(params)
             for gm in g["gammas"] for s in g["seeds"] for m in g["methods"]]
            + [Run(d, CLEAN, int(s), m) for d in g["datasets"] for s in g["seeds"] for m in g.get("clean_methods", [])])


def suspect_levels(params: dict) -> list[tuple[str, float, int]]:
    """(noise model, rate, seed) of each noisy set the main grid trains on, in grid order: the runs whose suspect
    labels the detection table scores (a clean run has no wrong label to find)."""
    g = params["grid"]
    return [(n, float(gm), int(s)) for n in noise_models(params) for gm in g["gammas"] if float(gm) > 0
            for s in g["seeds"]]


def cleaning_of(params: dict, method: str) -> dict | None:
    """A clean-then-retrain method's cleaning (its block's ``clean``: flags, action), None for any other method."""
    return (params["methods"].get(method) or {}).get("clean")


def cleaned_table(params: dict, dataset: str, gamma: float, seed: int, method: str, noise: str = PAPER) -> str:
    """The training table of a clean-then-retrain run (layout.CLEANED): one a noisy set and cleaning, shared by the
    methods that clean alike."""
    clean = cleaning_of(params, method)
    return L.fill(L.CLEANED, dataset=dataset, gamma=gamma, seed=seed, noise=noise, flags=clean["flags"],
                  action=clean["action"])


def crossfit_levels(params: dict, dataset: str) -> list[tuple[str, float, int]]:
    """(noise model, rate, seed) of each noisy set of ``dataset`` that is cross-fitted (params crossfit): those whose
    suspect labels the detection table scores and those a clean-then-retrain method cleans by cross-fitted flags
    (the clean column's too), in grid order; none without a crossfit block."""
    block = params.get("crossfit")
    if not block or not block.get("enabled", True):
        return []
    levels = suspect_levels(params) if dataset in params["grid"]["datasets"] else []
    levels += [(r.noise, r.gamma, r.seed) for r in all_runs(params) if r.dataset == dataset
               and (cleaning_of(params, r.method) or {}).get("flags", "oracle") != "oracle"]
    return sorted(dict.fromkeys(levels), key=lambda level: (level[0] != PAPER, level[0], level[1], level[2]))


def suspects_stem(dataset: str, method: str, level: tuple[str, float, int]) -> str:
    """The files of one run's suspect labels (layout.SUSPECTS, .csv and .json), a field left as a pattern where
    ``dataset`` or ``method`` is one ("{dataset}")."""
    noise, gamma, seed = level
    return L.SUSPECTS.format(dataset=dataset, method=method, gamma=L.gtag(gamma), seed=seed, noise=L.noise_tag(noise))


def ablation_runs(params: dict, name: str) -> list[Run]:
    """Every run of the ablation block ``name`` (the paper's noise model, as the paper's ablations)."""
    block = params["ablations"][name]
    return [Run(block["dataset"], float(gm), int(s), m) for gm in block["gammas"] for s in block["seeds"]
            for m in block["methods"]]


def all_runs(params: dict) -> list[Run]:
    """Every run the workflow trains: the main grid, then each ablation in grid.ablations; a run in
    both is trained once (the Snakemake rules and the paper grid's cost plan read this list)."""
    runs = grid_runs(params)
    for name in params["grid"].get("ablations", []):
        runs += ablation_runs(params, name)
    return list(dict.fromkeys(runs))


def noise_argv(params: dict, dataset: str, gamma: float, seed: int, noise: str) -> list[str]:
    """The words that write one noisy set: the model's (noisymlt.data.noise_models: NoiseModel.argv), with its
    settings (params noise.MODEL); the paper's model's are `noise --labels ... --gamma ... --seed ... --out ...
    --stats ...`."""
    from noisymlt.data.noise_models import noise_model

    where = {"dataset": dataset, "gamma": gamma, "seed": seed, "noise": noise}
    return noise_model(noise).argv(params.get("noise", {}).get(noise) or {}, dataset, L.gtag(gamma), seed,
                                   L.fill(L.TRAIN_LABELS, dataset=dataset), L.fill(L.NOISY, **where),
                                   L.fill(L.NOISY_STATS, **where))


def noise_files(params: dict, dataset: str, gamma: float, noise: str) -> list[str]:
    """The files a noise model's settings name for one set (class_conditional's matrix, [CL]'s file and id list)."""
    from noisymlt.data.noise_models import noise_model

    return noise_model(noise).files(params.get("noise", {}).get(noise) or {}, dataset, gamma)


def method_labels(params: dict) -> str:
    """Every method's title in the tables and figures (methods.*.label), as the JSON their --labels takes."""
    return json.dumps({m: b.get("label", m) for m, b in params["methods"].items()})


def authors_checkpoints(params: dict) -> dict:
    """The trained models of [CL]'s own the params name (authors_checkpoints: NAME -> dataset, file, sha256)."""
    return params.get("authors_checkpoints") or {}


def authors_entry(params: dict, name: str, dataset: str | None = None) -> dict:
    """Block authors_checkpoints.NAME (whose evaluation goes to layout.AUTHORS_RUN: its dataset, when given, must be
    the block's)."""
    blocks = authors_checkpoints(params)
    if name not in blocks:
        known = ", ".join(sorted(blocks)) or "none"
        raise NoisyMLTError(f"params: no block authors_checkpoints.{name} (configured: {known})")
    entry = blocks[name]
    if dataset is not None and entry["dataset"] != dataset:
        raise NoisyMLTError(f"{L.fill(L.AUTHORS_RUN, dataset=dataset, name=name)}: authors_checkpoints.{name} is a "
                            f"checkpoint of dataset {entry['dataset']!r}: ask for "
                            f"{L.fill(L.AUTHORS_RUN, dataset=entry['dataset'], name=name)}")
    return entry


def authors_options(params: dict, name: str) -> list[str]:
    """The words of a block's optional settings (image_size, batch_size), none when it sets none: the command's
    defaults are [CL]'s (noisymlt.training.cl_evaluate)."""
    entry = authors_entry(params, name)
    return [w for key in ("image_size", "batch_size") if key in entry
            for w in (f"--{key.replace('_', '-')}", str(entry[key]))]

