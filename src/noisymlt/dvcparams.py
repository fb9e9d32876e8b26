"""Layered params files -> dvc.params.yaml, the one params file DVC's pipeline (dvc.yaml) reads.

Snakemake layers a profile over params.yaml itself (``--configfile``). DVC cannot layer files, and its
templating always loads params.yaml, whose keys another ``vars`` file may not redefine. So
``noisymlt params LAYER... --out dvc.params.yaml`` writes the merged, validated params (what every
stage's command reads and every stage's ``params:`` tracks) plus a ``dvc`` block, the only part dvc.yaml's
templating loads (``vars: - dvc.params.yaml:dvc``):

  layers        the files it was merged from, with their sha256: load_params (config.check_layers)
                refuses the file once one of them changed, so DVC never runs on a stale merge
  grid          datasets, gammas, seeds of the main grid (DVC's matrix stages expand them)
  pretrain      the pretrain blocks some run's weights_path names (data/pretrained/NAME.pt)
  fetch_images  datasets whose train images are fetched after the long-tail step (COCO)
  runs          one entry per training run of the main grid, keyed DATASET-GAMMA-SEED-METHOD: dataset,
                gamma, seed, method, the folder its train images come from and its weights file

Those lists are computed here because DVC's templating can neither branch nor look a value up by
another (a run's weights file depends on its resolved config). A run without a weights file (torchvision
download, scratch) gets its raw-data folder instead, already one of its dependencies: DVC has no optional
dependencies. The file is generated: git ignores it, and each route writes it from its own layers.
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import yaml

HEADER = ("# Written by `noisymlt params {layers} --out {out}`: DVC's view of those params files,\n"
          "# merged. Do not edit; edit the layers and rerun the command (dvc.yaml reads `dvc` for its templating).\n")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dvc_block(params: dict, layers: list[str]) -> dict:
    from noisymlt import steps
    from noisymlt.config import resolve_run

    grid = params["grid"]
    runs, pretrain = {}, []
    for dataset, gamma, seed, method in steps.grid_runs(params):
        weights = resolve_run(params, dataset, method, gamma, seed)["train"].get("weights_path")
        name = Path(weights).stem if weights else None
        if weights and weights == f"data/pretrained/{name}.pt" and name in params.get("pretrain", {}):
            pretrain.append(name)
        raw = steps.raw_dir(params, dataset)
        coco = params["datasets"][dataset]["kind"] == "coco"
        runs[f"{dataset}-{steps.gtag(gamma)}-{seed}-{method}"] = {
            "dataset": dataset, "gamma": gamma, "seed": seed, "method": method,
            "images": steps.train_images_dir(dataset) if coco else raw, "weights": weights or raw,
        }
    return {
        "layers": [{"path": str(f), "sha256": _sha256(Path(f))} for f in layers],
        "grid": {"datasets": list(grid["datasets"]), "gammas": [float(g) for g in grid["gammas"]],
                 "seeds": [int(s) for s in grid["seeds"]]},
        "pretrain": list(dict.fromkeys(pretrain)),
        "fetch_images": [d for d in grid["datasets"] if params["datasets"][d]["kind"] == "coco"],
        # decoded-image caches and the stage output holding each part's images (COCO's train subset is fetched)
        "caches": {f"{d}-{part}": {"dataset": d, "part": part, "images": steps.train_images_dir(d)
                                   if part == "train" and params["datasets"][d]["kind"] == "coco"
                                   else steps.raw_dir(params, d)}
                   for d in grid["datasets"] for part in ("train", "test")},
        "runs": runs,
    }


def write(layers: list[str], out: str | Path) -> Path:
    from noisymlt.config import load_params

    params = load_params(*layers)
    text = HEADER.format(layers=" ".join(layers), out=out)
    text += yaml.safe_dump({"dvc": dvc_block(params, layers), **params}, sort_keys=False, width=120)
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return out


def _cmd(args: argparse.Namespace) -> int:
    out = write(args.layers, args.out)
    print(f"{out}: {' + '.join(args.layers)}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "params", help="merge params files (params.yaml, then a profile's) into the one file DVC reads",
        description="Layer params files left to right as Snakemake's --configfile does, validate the result and "
                    "write it with a `dvc` block (the lists dvc.yaml's stages expand over, the layers' sha256) to "
                    "OUT. dvc.yaml reads dvc.params.yaml: run this before `dvc repro`, and again after editing a "
                    "layer (steps refuse a stale file).",
    )
    p.add_argument("layers", nargs="+", help="params files, layered left to right (params.yaml first)")
    p.add_argument("--out", default="dvc.params.yaml", help="file to write (default: dvc.params.yaml)")
    p.set_defaults(func=_cmd)
