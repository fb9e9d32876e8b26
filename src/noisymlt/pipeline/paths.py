"""params.yaml -> the explicit arguments of the pipeline steps, and the file layout per dataset kind.

Snakemake computes each rule's arguments in Python; DVC cannot branch on a dataset's kind (toy
data are generated, VOC/COCO downloaded, each kind has its own folder layout) and cannot expand
the run grid into a file list. ``noisymlt step <name> --params params.yaml --dataset NAME ...``
does that resolution here, prints the equivalent explicit command and runs it, so dvc.yaml calls
the same commands on the same paths as the Snakemake rules. ``workflow/rules/common.smk`` can build
its commands from these functions too, so the layout is written down once. The path patterns themselves are
``noisymlt.pipeline.layout``'s; only the raw folders, which depend on a dataset's kind, are spelled here.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

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


def cache_args(name: str, loader: str) -> list[str]:
    """The train command's cache arguments for a run whose train.loader is ``loader``."""
    if loader != "cache":
        return []
    return ["--train-cache", L.fill(L.CACHE, dataset=name, part="train"),
            "--test-cache", L.fill(L.CACHE, dataset=name, part="test")]


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


# ---------------------------------------------------------------------------------------- CLI

def _run(argv: list[str]) -> int:
    """Print the explicit command (what the Snakemake rule runs), then run it in this process."""
    from noisymlt.cli import main

    print("+ noisymlt " + shlex.join(argv), flush=True)
    return main(argv)


def _run_declared(name: str, values: dict, device: str, evaluate: bool) -> int:
    """A run's declared command (noisymlt.pipeline.steps: ``train`` or ``train_candidate``, the words Snakemake's
    job runs) with this run's values, on ``device``; then (``evaluate``) its evaluation, as the job runs it after
    training, in this process: a DVC stage runs one command, whose imports serve both."""
    from noisymlt.pipeline.steps import argv, by_name

    step = by_name()[name]
    code = _run(argv(step.command, values) + ["--device", device])
    if code or not evaluate:
        return code
    return _run(argv(step.then, values))


def _run_outputs(out: str) -> dict:
    return {"output.requested": f"{out}/requested_config.json", "output.predictions": f"{out}/predictions.npz",
            "output.metrics": f"{out}/metrics.json", "output.map": f"{out}/map.json"}


def _params(args: argparse.Namespace) -> dict:
    from noisymlt.config import load_params

    return load_params(*args.params)


def _cmd_raw(args: argparse.Namespace) -> int:
    return _run(raw_argv(_params(args), args.dataset))


def _cmd_asset(args: argparse.Namespace) -> int:
    return _run(asset_argv(_params(args), args.out))


def _cmd_parse(args: argparse.Namespace) -> int:
    return _run(parse_argv(_params(args), args.dataset, args.part, args.out))


def _cmd_longtail(args: argparse.Namespace) -> int:
    return _run(longtail_argv(_params(args), args.dataset, args.labels, args.out, args.split_out))


def _cmd_pretrain(args: argparse.Namespace) -> int:
    return _run(pretrain_argv(_params(args), args.name, args.out))


def _cmd_train_images(args: argparse.Namespace) -> int:
    params = _params(args)
    argv = train_images_argv(params, args.dataset, args.ids, args.out)
    if argv is not None:
        return _run(argv)
    # dvc.yaml runs this step for COCO only; other kinds need no download: record where their images are.
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    note = {"dataset": args.dataset, "kind": dataset_block(params, args.dataset)["kind"],
            "train_images": image_root(params, args.dataset, "train")}
    (out / "manifest.json").write_text(json.dumps(note, indent=1, sort_keys=True) + "\n")
    print(f"{out}: nothing to fetch; {args.dataset} train images are read from {note['train_images']}")
    return 0


def _cmd_cache_images(args: argparse.Namespace) -> int:
    return _run(cache_argv(_params(args), args.dataset, args.part, args.out))


def expect_code(method: str, resolved: dict) -> str:
    """The code a DVC train stage's job must load: its code dependency (data/code/train/METHOD.json), which the job
    checks against the code it loads, so a source edited since `code_digests` ran stops the job instead of
    training under another name; without that file (a run by hand), the digest of the code as it is now."""
    from noisymlt.methods import run_digest

    path = Path(L.fill(L.RUN_CODE, method=method))
    return str(path) if path.is_file() else run_digest(resolved)


def requested_config(params: dict, dataset: str, method: str, gamma: float, seed: int, choice: str | None) -> str:
    """A run's resolved config with its method's chosen values (from the choice file, if any), as the text both
    routes write to OUT/requested_config.json (Snakemake's train job prints it with a final newline, as
    the DVC train stage writes it): the train job reads it."""
    from noisymlt.config import resolve_run
    from noisymlt.pipeline.selection import read_choice

    chosen = read_choice(choice) if choice else None
    resolved = resolve_run(params, dataset, method, gamma, seed, chosen=chosen, chosen_by=str(choice or ""))
    return json.dumps(resolved, sort_keys=True, indent=1)


def _cmd_train(args: argparse.Namespace) -> int:
    """A run as Snakemake's train job runs it: its requested_config.json, then the declared train command."""
    from noisymlt.core.files import write_text
    from noisymlt.pipeline.selection import final_choice_file

    params = _params(args)
    choice = final_choice_file(params, args.dataset, args.method)
    text = requested_config(params, args.dataset, args.method, args.gamma, args.seed, choice)
    resolved = json.loads(text)
    values = _run_outputs(args.out)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_text(Path(values["output.requested"]), text + "\n")
    values.update({
        "input.train": args.train_labels, "input.test": args.test_labels, "input.split": args.split,
        "input.subset": L.fill(L.TRAIN_LABELS, dataset=args.dataset), "input.raw": raw_marker(params, args.dataset),
        "train_images": image_root(params, args.dataset, "train"), "test_images": image_root(params, args.dataset, "test"),
        "caches": cache_args(args.dataset, resolved["train"].get("loader", "pil")), "out": args.out,
        "code": expect_code(args.method, resolved), "selection": ["--selection", choice] if choice else []})
    return _run_declared("train", values, args.device, args.evaluate)


def _cmd_select_split(args: argparse.Namespace) -> int:
    return _run(select_split_argv(_params(args), args.dataset, args.out))


def _cmd_select_cache(args: argparse.Namespace) -> int:
    return _run(select_cache_argv(_params(args), args.dataset, args.part, args.out))


def _cmd_train_candidate(args: argparse.Namespace) -> int:
    """A model-selection candidate as Snakemake's train_candidate job runs it: its resolved
    config written to OUT/requested_config.json, then `noisymlt train` on the fit part, validated on the val part."""
    from noisymlt.config import resolve_run
    from noisymlt.pipeline import selection as S

    params = _params(args)
    values = dict(S.candidates(params, args.method, args.stage))
    if args.tag not in values:
        raise NoisyMLTError(f"{args.tag}: no candidate of {args.method} stage {args.stage} is called so "
                            f"(candidates: {', '.join(values)})")
    earlier = S.read_choice(S.choice_file(args.dataset, args.method, args.stage - 1)) if args.stage > 1 else {}
    cfg = resolve_run(params, args.dataset, args.method, args.gamma, args.seed, chosen={**earlier, **values[args.tag]},
                      chosen_by="candidate", candidate=True)
    out = S.candidate_dir(args.dataset, args.method, args.stage, args.gamma, args.seed, args.tag)
    Path(out).mkdir(parents=True, exist_ok=True)
    run = _run_outputs(out)
    Path(run["output.requested"]).write_text(json.dumps(cfg, sort_keys=True, indent=1) + "\n")
    caches = []
    if cfg["train"].get("loader", "pil") == "cache":
        caches = ["--train-cache", S.cache_path(args.dataset, "fit"), "--test-cache", S.cache_path(args.dataset, "val")]
    run.update({f"input.{name}": L.fill(L.SELECT_PART, dataset=args.dataset, gamma=args.gamma, seed=args.seed, part=part)
                for name, part in (("train", "fit"), ("val", "val"))})
    run.update({"input.split": L.fill(L.CLASS_SPLIT, dataset=args.dataset), "images": image_root(params, args.dataset, "train"),
                "caches": caches, "out": out, "code": expect_code(args.method, cfg)})
    return _run_declared("train_candidate", run, args.device, args.evaluate)


def _cmd_select_choose(args: argparse.Namespace) -> int:
    from noisymlt.pipeline import selection as S

    params = _params(args)
    previous = ["--previous", S.choice_file(args.dataset, args.method, args.stage - 1)] if args.stage > 1 else []
    return _run(["select", "choose", "--selection", json.dumps(params["selection"], sort_keys=True),
                 "--dataset", args.dataset, "--method", args.method, "--stage", str(args.stage), *previous])


def _cmd_aggregate(args: argparse.Namespace) -> int:
    params = _params(args)
    files = [f"{run_dir(*run, root=args.runs)}/metrics.json" for run in all_runs(params)]  # as Snakemake's rule
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise NoisyMLTError(f"{len(missing)} of {len(files)} grid run(s) have no metrics yet, e.g. {missing[:3]}")
    curves = ["--curves", args.curves] if args.curves else []
    if args.pseudo_label_curves:
        curves += ["--pseudo-label-curves", args.pseudo_label_curves]
    return _run(["aggregate", *files, "--out", args.out, *curves])


def add_cli(sub) -> None:
    p = sub.add_parser(
        "step", help="run a pipeline step with its dataset-specific arguments resolved from params files",
        description="Resolve a step's dataset-dependent arguments (raw data source, folder layout, long-tail "
                    "settings, image folders, the run grid) from params files, print the explicit `noisymlt` "
                    "command and run it. dvc.yaml uses this because DVC cannot branch on a dataset's kind.",
    )
    steps = p.add_subparsers(dest="step", metavar="STEP", required=True)

    def step(name: str, help_text: str, func, dataset: bool = True) -> argparse.ArgumentParser:
        q = steps.add_parser(name, help=help_text, description=help_text)
        q.add_argument("--params", nargs="+", default=["params.yaml"], help="params files, layered left to right")
        if dataset:
            q.add_argument("--dataset", required=True, help="dataset name (a key under datasets:)")
        q.set_defaults(func=func)
        return q

    step("raw", "generate (toy) or download (voc, coco) the raw files into data/raw/KIND", _cmd_raw)
    q = step("asset", "fetch an external file runs read (assets.imagenet / assets.glove entry) into OUT",
             _cmd_asset, dataset=False)
    q.add_argument("--out", required=True, help="the asset's path (data/assets/GROUP/FILE)")
    q = step("parse", "parse the train source pool or the test set into a label table", _cmd_parse)
    q.add_argument("--part", required=True, choices=PARTS)
    q.add_argument("--out", required=True, help="label table to write")
    q = step("longtail", "draw the long-tailed subset with the dataset's longtail settings", _cmd_longtail)
    q.add_argument("--labels", required=True, help="train source label table")
    q.add_argument("--out", required=True, help="subset label table to write")
    q.add_argument("--split-out", required=True, help="class split JSON to write")
    q = step("train-images", "fetch the subset's COCO train images (other kinds: write OUT/manifest.json only)",
             _cmd_train_images)
    q.add_argument("--ids", required=True, help="subset label table (its image ids)")
    q.add_argument("--out", required=True, help="folder for the images (data/NAME/train_images)")
    q = step("pretrain", "pretrain a backbone on the synthetic source task of block pretrain.NAME", _cmd_pretrain,
             dataset=False)
    q.add_argument("--name", required=True, help="a key under pretrain:")
    q.add_argument("--out", required=True, help="weights file to write (data/pretrained/NAME.pt)")
    q = step("cache-images", "decode a dataset's train subset or test set into its image cache", _cmd_cache_images)
    q.add_argument("--part", required=True, choices=CACHE_PARTS)
    q.add_argument("--out", required=True, help="cache array to write (data/NAME/cache/PART.npy)")
    q = step("train", "train one run, with the dataset's image folders filled in", _cmd_train)
    q.add_argument("--method", required=True)
    q.add_argument("--gamma", required=True, type=float)
    q.add_argument("--seed", required=True, type=int)
    for opt in ("--train-labels", "--test-labels", "--split", "--out"):
        q.add_argument(opt, required=True)
    q.add_argument("--device", default="auto", help="auto, cpu or cuda:N")
    q.add_argument("--evaluate", action="store_true",
                   help="then evaluate its predictions into OUT/metrics.json and OUT/map.json (as Snakemake's train job does)")
    q = step("select-split", "hold out the model-selection split of a dataset (params `selection`)", _cmd_select_split)
    q.add_argument("--out", required=True, help="split file to write (data/NAME/select/split.json)")
    q = step("select-cache", "decode the fit or val images of the selection split into their cache", _cmd_select_cache)
    q.add_argument("--part", required=True, choices=("fit", "val"))
    q.add_argument("--out", required=True, help="cache array to write (data/NAME/cache/select_PART.npy)")
    q = step("train-candidate", "train one model-selection candidate on the fit part, predicting the val part",
             _cmd_train_candidate)
    q.add_argument("--method", required=True)
    q.add_argument("--stage", required=True, type=int)
    q.add_argument("--tag", required=True, help="the candidate's name (lr0.08, alpha0.8_beta0.2)")
    q.add_argument("--gamma", required=True, type=float)
    q.add_argument("--seed", required=True, type=int)
    q.add_argument("--device", default="auto", help="auto, cpu or cuda:N")
    q.add_argument("--evaluate", action="store_true",
                   help="then evaluate its predictions against the val part (OUT/metrics.json, OUT/map.json)")
    q = step("select-choose", "rank a stage's candidates by validation mAP and write the choice", _cmd_select_choose)
    q.add_argument("--method", required=True)
    q.add_argument("--stage", required=True, type=int)
    q = step("aggregate", "collect the metrics of exactly the runs of the grid and the ablations (grid.ablations), "
             "as Snakemake's rule does", _cmd_aggregate, dataset=False)
    q.add_argument("--runs", default="runs", help="runs folder (default: runs)")
    q.add_argument("--out", required=True, help="results Parquet to write")
    q.add_argument("--curves", help="per-epoch training records of the runs (JSON rows, DVC's plots)")
    q.add_argument("--pseudo-label-curves", help="pseudo-label counts per epoch and branch (JSON rows, DVC's plots)")
