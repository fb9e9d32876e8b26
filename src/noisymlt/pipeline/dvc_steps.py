"""`noisymlt step NAME --params FILE... ...`: a pipeline step with its arguments resolved from params files.

DVC's stages run a few steps through here: a training run or a selection candidate (its resolved configuration is
written first, then the declared command of noisymlt.pipeline.steps runs, the words Snakemake's job runs), the
selection's choice and the aggregate (each reads a list DVC's templating cannot expand). The other subcommands
resolve a dataset kind's arguments (noisymlt.pipeline.paths) for a run by hand. Each prints the explicit
`noisymlt` command, then runs it in this process.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from noisymlt.errors import NoisyMLTError
from noisymlt.pipeline import layout as L
from noisymlt.pipeline.paths import (CACHE_PARTS, PARTS, all_runs, asset_argv, cache_args, cache_argv, config_text,
                                     dataset_block, final_run, image_root, longtail_argv, parse_argv, pretrain_argv,
                                     raw_argv, raw_marker, run_dir, select_cache_argv, select_split_argv,
                                     train_images_argv)
from noisymlt.pipeline.steps import argv, by_name


def _run(words: list[str]) -> int:
    """Print the explicit command (what the Snakemake rule runs), then run it in this process."""
    from noisymlt.cli import main

    print("+ noisymlt " + shlex.join(words), flush=True)
    return main(words)


def _run_declared(name: str, values: dict, device: str, evaluate: bool) -> int:
    """A run's declared command (noisymlt.pipeline.steps: ``train`` or ``train_candidate``, the words Snakemake's
    job runs) with this run's values, on ``device``; then (``evaluate``) its evaluation, as the job runs it after
    training, in this process: a DVC stage runs one command, whose imports serve both."""
    step = by_name()[name]
    code = _run(argv(step.command, values) + ["--device", device])
    if code or not evaluate:
        return code
    return _run(argv(step.then, values))


def _outputs_in(name: str, out: str) -> dict:
    """The declared outputs of a run's step (``output.NAME``: its files, metrics included), in the folder ``out``."""
    return {f"output.{key}": f"{out}/{Path(path).name}" for key, path in by_name()[name].outputs().items()}


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


def _cmd_train(args: argparse.Namespace) -> int:
    """A run as Snakemake's train job runs it: its requested_config.json, then the declared train command."""
    from noisymlt.core.files import write_text
    from noisymlt.pipeline.selection import final_choice_file

    params = _params(args)
    choice = final_choice_file(params, args.dataset, args.method)
    gamma, noise = L.parse_noise_level(args.gamma)
    resolved = final_run(params, args.dataset, args.method, gamma, args.seed, choice, noise)
    values = _outputs_in("train", args.out)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    write_text(Path(values["output.requested"]), config_text(resolved) + "\n")
    values.update({
        "input.train": args.train_labels, "input.test": args.test_labels, "input.split": args.split,
        "input.subset": L.fill(L.TRAIN_LABELS, dataset=args.dataset), "input.raw": raw_marker(params, args.dataset),
        "train_images": image_root(params, args.dataset, "train"),
        "test_images": image_root(params, args.dataset, "test"),
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
                      candidate=True)
    out = S.candidate_dir(args.dataset, args.method, args.stage, args.gamma, args.seed, args.tag)
    Path(out).mkdir(parents=True, exist_ok=True)
    run = _outputs_in("train_candidate", out)
    Path(run["output.requested"]).write_text(config_text(cfg) + "\n")
    run.update({f"input.{name}": L.fill(L.SELECT_PART, dataset=args.dataset, gamma=args.gamma, seed=args.seed,
                                        part=part) for name, part in (("train", "fit"), ("val", "val"))})
    run.update({"input.split": L.fill(L.CLASS_SPLIT, dataset=args.dataset),
                "images": image_root(params, args.dataset, "train"),
                "caches": cache_args(args.dataset, cfg["train"].get("loader", "pil"), candidate=True), "out": out,
                "code": expect_code(args.method, cfg)})
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
        "step", help="run a pipeline step with its arguments resolved from params files",
        description="Resolve a step's arguments (a run's configuration and image folders, the run grid, a dataset "
                    "kind's raw data source, folder layout and long-tail settings) from params files, print the "
                    "explicit `noisymlt` command and run it. dvc.yaml runs a training run, a selection candidate, a "
                    "selection's choice and the aggregate through it; the other subcommands are for runs by hand.",
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
    q.add_argument("--gamma", required=True,
                   help="the noise rate, then the noise model after a dash unless it is the paper's (0.5, 0.5-uniform)")
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
