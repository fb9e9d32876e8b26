"""Where every file of the pipeline lives: each path pattern spelled once.

A pattern is a ``str.format`` template whose fields are the pipeline's wildcards (dataset, gamma, noise, seed,
method, part, stage, tag, name, command). ``noise`` follows the rate in a noisy set's and a run's name: empty for
the paper's noise model (its paths are those of every finished result), ``-MODEL`` for another (``g0.5-uniform``). The same text serves two readers:

- Snakemake rules use a pattern as it is (its fields are the rule's wildcards);
- the package fills it with ``fill()``, which writes a noise rate as the rules' wildcards do (``gtag``).

Only the raw folders depend on a dataset's kind: the kind names its folder under RAW_ROOT (noisymlt.data.kinds,
asked by ``noisymlt.pipeline.paths``).
"""

from __future__ import annotations

import string
from pathlib import PurePath

from noisymlt.data.noise_models import PAPER

# ---------------------------------------------------------------------------------------- data
RAW_ROOT = "data/raw"  # each kind's raw files in a folder of their own (noisymlt.data.kinds), or the user's folder
RAW = RAW_ROOT + "/{raw}"  # raw: the folder's name, the kind's raw_folder
RAW_MARKER = RAW + "/{marker}"  # marker: the file, under the folder, that exists once the files are there
SOURCE_LABELS = "data/{dataset}/train_source_labels.parquet"  # every labelled train image of the source
LABELS = "data/{dataset}/{part}_labels.parquet"  # part: train_source, train (the long-tailed subset), test
TRAIN_LABELS = "data/{dataset}/train_labels.parquet"  # the clean long-tailed subset
TEST_LABELS = "data/{dataset}/test_labels.parquet"
CLASS_SPLIT = "data/{dataset}/class_split.json"  # head / medium / tail
TRAIN_IMAGES = "data/{dataset}/train_images"  # fetched train images (COCO), one writer per folder
TRAIN_IMAGES_READY = "data/{dataset}/train_images/train2017/manifest.json"  # written once every image is there
NOISY = "data/{dataset}/noisy/g{gamma}{noise}_s{seed}.parquet"  # a noisy copy of the subset per model, rate and seed
NOISY_STATS = "data/{dataset}/noisy/g{gamma}{noise}_s{seed}.json"  # its measured noise
CACHE = "data/{dataset}/cache/{part}.npy"  # decoded images of the train subset or the test set
CACHE_INDEX = "data/{dataset}/cache/{part}.json"
CACHE_MANIFEST = "data/{dataset}/cache/{part}.manifest.json"
PRETRAINED = "data/pretrained/{name}.pt"  # a backbone pretrained on the synthetic source task
PRETRAINED_REPORT = "data/pretrained/{name}.json"
PRETRAINED_MANIFEST = "data/pretrained/{name}.manifest.json"

# ---------------------------------------------------------------------------------------- model selection
SELECT_SPLIT = "data/{dataset}/select/split.json"
SELECT_PART = "data/{dataset}/select/g{gamma}_s{seed}_{part}.parquet"  # part: fit, val (noisy labels only)
SELECT_CACHE = "data/{dataset}/cache/select_{part}.npy"
SELECT_CACHE_INDEX = "data/{dataset}/cache/select_{part}.json"
SELECT_CACHE_MANIFEST = "data/{dataset}/cache/select_{part}.manifest.json"
STAGE_DIR = "runs/{dataset}/select/{method}/stage{stage}"
STAGE_FILE = "runs/{dataset}/select/{method}/stage{stage}.json"  # every candidate's score and the choice so far
CHOICE_FILE = "runs/{dataset}/select/{method}/stage{stage}.choice.json"  # the values chosen, nothing else
CANDIDATE = "runs/{dataset}/select/{method}/stage{stage}/g{gamma}/s{seed}/{tag}"

# ---------------------------------------------------------------------------------------- cross-fitting
CROSSFIT_FOLDS = "data/{dataset}/crossfit/folds.json"  # one fold an image, over every noisy set of the grid
# one noisy set cut for a fold's run: part train (every other fold), held (the fold; noisy labels only)
CROSSFIT_PART = "data/{dataset}/crossfit/g{gamma}{noise}_s{seed}_fold{fold}_{part}.parquet"
CROSSFIT_CACHE = "data/{dataset}/cache/crossfit_fold{fold}_{part}.npy"
CROSSFIT_CACHE_INDEX = "data/{dataset}/cache/crossfit_fold{fold}_{part}.json"
CROSSFIT_CACHE_MANIFEST = "data/{dataset}/cache/crossfit_fold{fold}_{part}.manifest.json"
CROSSFIT_RUN = "runs/{dataset}/crossfit/{method}/g{gamma}{noise}/s{seed}/fold{fold}"
# every training image's probabilities from the fold run that held it out (noisymlt crossfit gather)
OUT_OF_SAMPLE = "runs/{dataset}/crossfit/{method}/g{gamma}{noise}/s{seed}/out_of_sample.npz"
CROSSFIT_RUN_FILES = ("requested_config.json", "predictions.npz", "manifest.json", "run_config.json")
# a noisy set with the labels a cleaning flags dropped or flipped (noisymlt clean-labels), and its .json record
CLEANED = "runs/{dataset}/cleaned/g{gamma}{noise}_s{seed}_{flags}_{action}.parquet"

# ---------------------------------------------------------------------------------------- runs
RUN = "runs/{dataset}/g{gamma}{noise}/s{seed}/{method}"
# what a run's job writes (train, then evaluate); checkpoint.pt too, which Snakemake must not own (train.smk)
RUN_FILES = ("requested_config.json", "predictions.npz", "manifest.json", "run_config.json", "noise_level.jsonl",
             "metrics.json", "metrics.manifest.json")
# a trained model of [CL]'s own (params authors_checkpoints.NAME) evaluated on the test set (noisymlt eval-cl-checkpoint)
AUTHORS_RUN = "runs/{dataset}/authors/{name}"
AUTHORS_FILES = ("predictions.npz", "metrics.json", "map.json", "manifest.json")

# ---------------------------------------------------------------------------------------- reports
# the report's files, each a stem its step adds extensions to (.tex, .md, .html, ...)
RESULTS = "reports/results.parquet"  # every run's metrics, long format, with provenance
CURVES = "reports/training_curves.json"  # the runs' per-epoch records (DVC's plots)
PSEUDO_LABEL_CURVES = "reports/pseudo_label_curves.json"
STRUCTURE = "reports/structure_{dataset}"
TABLE_TOTAL = "reports/table_total"
TABLE_GROUPS = "reports/table_groups_{dataset}"
FIT_TABLE = "reports/fit_{dataset}"
PAIRED_TABLE = "reports/paired_{dataset}"
ABLATION = "reports/ablation_{name}"  # its table, and its figure when it sweeps an option
MAP_FIGURE = "reports/map_vs_gamma"
INFERENCE_TIME = "reports/inference_time_{dataset}"
NOISE_FIGURE = "reports/noise_level_{dataset}"
PSEUDO_FIGURE = "reports/pseudo_labels_{dataset}"
README_NUMBERS = "reports/readme_numbers.json"
# a main-grid run's suspect training labels (.csv) and how well its rankings find the wrong ones (.json)
SUSPECTS = "reports/suspects/{dataset}/g{gamma}{noise}_s{seed}_{method}"
DETECTION_TABLE = "reports/label_detection_{dataset}"


def gtag(gamma: float | str) -> str:
    """A noise rate as written in paths: Python's float text (0.5 -> '0.5', 0 -> '0.0'), one name a rate."""
    return str(float(gamma))


def noise_tag(model: str) -> str:
    """A noise model as paths write it after the rate: nothing for the paper's, ``-MODEL`` for another."""
    return "" if model == PAPER else f"-{model}"


def noise_name(tag: str) -> str:
    """The noise model of a ``noise`` wildcard's value (noise_tag's inverse)."""
    return tag[1:] if tag else PAPER


def noise_level(gamma: float | str, model: str = PAPER) -> str:
    """A noisy set's name without its seed: the rate, then the model unless it is the paper's (0.5, 0.5-uniform):
    how paths, run keys and the step commands' --gamma name it."""
    return gtag(gamma) + noise_tag(model)


def parse_noise_level(text: str) -> tuple[float, str]:
    """(rate, model) of a noise_level text."""
    rate, _, model = str(text).partition("-")
    return float(rate), model or PAPER


def with_noise(pattern: str, model: str) -> str:
    """A pattern with its ``noise`` field fixed (the selection reads the paper model's noisy sets)."""
    return pattern.replace("{noise}", noise_tag(model))


def stage_file_of(choice: str | PurePath) -> str:
    """The stage file beside a choice file (CHOICE_FILE -> STAGE_FILE of the same stage: the scores behind it)."""
    return str(choice).replace(CHOICE_FILE.rpartition("}")[2], STAGE_FILE.rpartition("}")[2])


def raw_parts(marker: str) -> dict[str, str]:
    """A raw marker file's RAW_MARKER fields: its folder's name under RAW_ROOT and its path in that folder."""
    root = PurePath(RAW_ROOT)
    path = PurePath(marker)
    if root not in path.parents or len(path.relative_to(root).parts) < 2:
        raise ValueError(f"{marker}: a command writes raw files under {RAW_ROOT}/FOLDER only (noisymlt.data.kinds: "
                         "raw_folder)")
    folder, *rest = path.relative_to(root).parts
    return {"raw": folder, "marker": PurePath(*rest).as_posix()}


def fields(pattern: str) -> list[str]:
    """The wildcards of a pattern, in order of first appearance."""
    return list(dict.fromkeys(name for _, name, _, _ in string.Formatter().parse(pattern) if name))


def fill(pattern: str, **values) -> str:
    """The path of one file: a pattern with its fields filled (a gamma written as ``gtag``, a seed as an int, the
    noise model, default the paper's, as ``noise_tag``)."""
    if "{noise}" in pattern:
        values["noise"] = noise_tag(values.get("noise", PAPER))
    if "gamma" in values:
        values["gamma"] = gtag(values["gamma"])
    if "seed" in values:
        values["seed"] = int(values["seed"])
    return pattern.format(**values)


def within(folder: str, name: str) -> str:
    """A file in a folder pattern (a run's manifest.json), still a pattern."""
    return f"{folder}/{name}"


def ext(stem: str, extension: str) -> str:
    """A report's file: its stem pattern with an extension (``ext(TABLE_TOTAL, "tex")``)."""
    return f"{stem}.{extension}"


def part(pattern: str, name: str) -> str:
    """A pattern with its ``part`` field fixed (a rule or stage per part: the selection's fit and val tables)."""
    return pattern.replace("{part}", name)

