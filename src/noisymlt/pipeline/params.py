"""Layered params files -> dvc-params.json, the one params file DVC's pipeline (dvc.yaml) reads.

Snakemake layers a profile over params.yaml itself (``--configfile``). DVC cannot layer files, and its
templating always loads params.yaml, whose keys another ``vars`` file may not redefine. So
``noisymlt params LAYER... --out dvc-params.json`` writes the merged, validated params (what every
stage's command reads and every stage's ``params:`` tracks) plus a ``dvc`` block, the only part dvc.yaml's
templating loads (``vars: - dvc-params.json:dvc``):

  layers        the files it was merged from, with their sha256: load_params (config.check_layers)
                refuses the file once one of them changed, so DVC never runs on a stale merge
  layer_args    the same paths as one command-line string, and layer_files the same paths padded to
                LAYER_SLOTS entries: dvc.yaml's `params` stage rewrites this file from them when one
                changes (`dvc exp run -S params.yaml:...`), and DVC's templating can neither splice a list
                into `deps` nor vary their number
  grid          datasets, gammas, seeds of the main grid (the report's stages expand its datasets)
  raw, parse_labels, longtail, pretrain, fetch_images, assets, caches, select_datasets, select_caches
                the lists of the stages whose words depend on a dataset's kind (each item's `args`: the words
                the step's Snakemake rule runs, from its declaration, noisymlt.pipeline.steps, with_step_args):
                the datasets, datasets x parts, the pretrain blocks some run's weights_path names
                (data/pretrained/NAME.pt), the datasets whose train images are fetched after the long-tail step
                (COCO), the external files runs read, the image caches and the selection's splits and caches
  runs          the training runs of the main grid and the ablations (paths.all_runs), keyed
                DATASET-LEVEL-SEED-METHOD (LEVEL: the rate, and a noise model other than the paper's after a dash:
                layout.noise_level): dataset, gamma, noise (layout.noise_tag), seed, method, its raw folder's marker file, the image
                folders it reads (image_deps), its weights and embeddings files, its selection choice file and
                config_key. Not in this file but split by shard into files of their own, beside it (runs_file):
                dvc-params-runs/SHARD.json holds, as `dvc_runs_SHARD`, the runs and the selection's candidates
                (selection_block) whose key falls in that shard (shard_of), the lists workflow/dvc/runs/SHARD/dvc.yaml
                expands (dvc_yaml.py). Why apart: DVC converts a whole `vars` block for each dvc.yaml that loads
                it, and it looks up each param a stage tracks by walking every leaf of the params file (dpath),
                once per stage and key: at the demo's 292 runs these lists were three quarters of the leaves, and
                their walks 40% of a `dvc status`.
  run_configs   config_key (the run's key with `_` for `.`: DVC splits params keys on dots) -> the run id,
                the hash of its resolved configuration: the param a train stage tracks, so a change
                reruns exactly the runs whose configuration it changes (a changed train.lr that the
                [DB] schedule overrides reruns no [DB]-recipe run)
  authors_checkpoints
                NAME -> one trained model of [CL]'s (params authors_checkpoints) and what its evaluation reads
                (paths.authors_items): dataset, file, checksum (its sha256), test images' folder, raw marker, the
                optional settings' words
  preload       the environment prefix of every stage's command: NOISYMLT_PRELOAD=shared with workflow.preload
                (the demo: DVC starts a process per stage, whose imports cost more than a demo run trains), else
                NOISYMLT_PRELOAD= (none)
  train_lr      DATASET -> METHOD -> the lr its runs train at, after every layer (or `selected: CHOICE FILE`):
                also tracked by the train stages, as a readable column beside the hash in `dvc exp show`, so
                an experiment's row and its baseline's both show the lr they trained at

When it rewrites an existing file, ``noisymlt params`` warns about a changed train setting that some
grid methods never see, because their schedule (or their own train block) sets that key: e.g. the
[DB]-recipe baselines take lr from ``schedules.db.train``, so a changed ``train.lr`` leaves them as they were.

Those lists are computed here because DVC's templating can neither branch nor look a value up by
another (a run's weights file depends on its resolved config). A run without a weights file (scratch) gets its
raw folder's marker file instead (paths.raw_marker, a file inside the raw stage's output that the run's manifest
records anyway), already one of its dependencies: DVC has no optional dependencies, and a small file costs
nothing to hash where a folder costs a walk of every file in it.

The file is JSON, not YAML: DVC reads a params file once per stage that tracks one of its keys, and parses
YAML with ruamel's pure-Python round-trip loader (0.2 s for the demo's file, so 35 s of every `dvc status`
over the demo's 180 such stages), JSON with the standard library (under a millisecond). DVC picks the parser
by everything after the file name's first dot, so the name has one dot: dvc-params.json (a `dvc.params.json`
would be parsed as YAML). Each clone writes it from its own layers and commits it with dvc.lock (DVC loads
dvc.yaml through it at every revision it compares).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from pathlib import Path

from noisymlt.errors import NoisyMLTError
from noisymlt.config import SHARD_BLOCK  # + SHARD: the key of a shard's file (runs_file)
from noisymlt.core.files import write_json, write_text
from noisymlt.data.noise_models import PAPER
from noisymlt.pipeline.dvc_yaml import DVC_SHARDS, shard_of

LAYER_SLOTS = 4  # dvc.yaml's `params` stage lists this many layer files (dvc.layer_files[0..3])

# JSON has no comments: the note goes first in the dvc block
WRITTEN_BY = ("written by `noisymlt params {layers} --out {out}`: DVC's view of those params files, merged. Do not "
              "edit; edit the layers and rerun the command (dvc.yaml reads `dvc` for its templating)")


def shard_blocks(runs: dict, candidates: dict, preload: str) -> dict:
    """dvc_runs_SHARD -> {"preload": ..., "runs": ..., "candidates": ...}: the run stages of each shard's dvc.yaml."""
    out = {f"{SHARD_BLOCK}{i:02d}": {"preload": preload, "runs": {}, "candidates": {}} for i in range(DVC_SHARDS)}
    for part, entries in (("runs", runs), ("candidates", candidates)):
        for key, entry in entries.items():
            out[SHARD_BLOCK + shard_of(key)][part][key] = entry
    return out


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dvc_block(params: dict, layers: list[str]) -> dict:
    from noisymlt.data import assets
    from noisymlt.data.assets import run_files
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline import paths, selection
    from noisymlt.config import resolve_run
    from noisymlt.core.manifest import run_id

    grid = params["grid"]
    runs, run_configs, pretrain, train_lr = {}, {}, [], {}
    known_assets, used_assets = assets.entries(params), set()
    for dataset, gamma, seed, method, noise in paths.all_runs(params):  # the ablations' runs too: every file in runs/ is
        # an output of some stage, so a pulled clone's `runs` folder (the aggregate's dependency) is whole
        # the choice file a final run reads (fixed values: the raw marker, below); its values are the choice's to
        # set, so the tracked hash holds placeholders for them (selection.placeholders)
        choice = selection.final_choice_file(params, dataset, method)
        chosen = None
        if choice:
            who = selection.owner(params, method)
            chosen = selection.placeholders(params, who, len(selection.stages(params, who)))
        resolved = resolve_run(params, dataset, method, gamma, seed, chosen=chosen, chosen_by=choice or "", noise=noise)
        weights = resolved["train"].get("weights_path")
        name = Path(weights).stem if weights else None
        if weights and weights == L.fill(L.PRETRAINED, name=name) and name in params.get("pretrain", {}):
            pretrain.append(name)
        marker = paths.raw_marker(params, dataset)
        key = f"{dataset}-{L.noise_level(gamma, noise)}-{seed}-{method}"
        embeddings = resolved["method_cfg"].get("embeddings_file")
        runs[key] = {
            "dataset": dataset, "gamma": gamma, "noise": L.noise_tag(noise), "seed": seed, "method": method,
            "raw_marker": marker,
            **image_deps(params, dataset, resolved), "weights": weights or marker,
            "embeddings": embeddings or marker, "config_key": key.replace(".", "_"),
        }
        used_assets.update(f for f in run_files(resolved) if f in known_assets)
        runs[key]["choice"] = choice or marker
        run_configs[key.replace(".", "_")] = run_id(resolved)
        train_lr.setdefault(dataset, {})[method] = f"selected: {choice}" if choice else resolved["train"]["lr"]
    if len(layers) > LAYER_SLOTS:
        raise NoisyMLTError(f"noisymlt params: at most {LAYER_SLOTS} layers (dvc.yaml's `params` stage lists "
                            f"{LAYER_SLOTS} files), got {len(layers)}: {' '.join(map(str, layers))}")
    select = selection_block(params, runs)
    datasets = list(grid["datasets"])
    block = {
        "layers": [{"path": str(f), "sha256": _sha256(Path(f))} for f in layers],
        "layer_args": " ".join(str(f) for f in layers),
        # DVC accepts a path listed twice as a dependency: unused slots repeat the first layer
        "layer_files": [str(f) for f in layers] + [str(layers[0])] * (LAYER_SLOTS - len(layers)),
        "grid": {"datasets": list(grid["datasets"]), "gammas": [float(g) for g in grid["gammas"]],
                 "seeds": [int(s) for s in grid["seeds"]]},
        # the lists of the stages whose words depend on a dataset's kind: each item gets its `args` below
        # raw files: once per folder, for the kinds that write them (a user's folder is there already)
        "raw": raw_items(params, datasets),
        "parse_labels": {f"{d}-{part}": {"dataset": d, "part": part, "raw": paths.raw_dir(params, d)}
                         for d in datasets for part in paths.PARTS},
        "longtail": {d: {"dataset": d} for d in datasets},
        "pretrain": {name: {"name": name} for name in dict.fromkeys(pretrain)},
        # the external files the runs read (a candidate reads its run's): GROUP-NAME -> path, group, name
        "assets": {f"{known_assets[f]['group']}-{known_assets[f]['name']}":
                   {"path": f, "group": known_assets[f]["group"], "name": known_assets[f]["name"]}
                   for f in sorted(used_assets)},
        "fetch_images": {d: {"dataset": d, "raw": paths.raw_dir(params, d)} for d in datasets
                         if paths.fetches_train_images(params, d)},
        # decoded-image caches and the stage output holding each part's images (COCO's train subset is fetched)
        "caches": {f"{d}-{part}": {"dataset": d, "part": part, "images": paths.train_images_folder(params, d)
                                   if part == "train" else paths.raw_dir(params, d)}
                   for d in grid["datasets"] for part in ("train", "test")},
        # the prefix of every command: with workflow.preload, each runs in a child of one shared preload server
        # (noisymlt.pipeline.preload.SHARED), as Snakemake's jobs run in its own; else in its own process
        "preload": f"NOISYMLT_PRELOAD={'shared' if params.get('workflow', {}).get('preload') else ''}",
        # the report's tables and figure: their methods and titles, as the words Snakemake's rules pass (quoted)
        "report": {"labels": shlex.quote(paths.method_labels(params)), "methods": " ".join(grid["methods"])},
        # [CL]'s trained models evaluated on a test set (params authors_checkpoints; none by default)
        "authors_checkpoints": paths.authors_items(params),
        "runs": runs,
        "run_configs": run_configs,
        "train_lr": train_lr,
        **select,
        # DATASET-LEVEL-SEED -> one noisy label set (LEVEL: layout.noise_level, the rate and a model other than the
        # paper's): the grid's and the selection's (a selection set may lie outside the grid, e.g. a second seed
        # when the grid has one; the selection reads the paper's model)
        "noisy_sets": {f"{d}-{L.noise_level(g, n)}-{s}": {"dataset": d, "gamma": g, "seed": s,
                                                          "noise": L.noise_tag(n), "model": n,
                                                          "model_file": paths.noise_file(params, d, g, n)}
                       for d, g, s, n in dict.fromkeys(
                           [(r.dataset, r.gamma, r.seed, r.noise) for r in paths.grid_runs(params)]  # clean column too
                           + [(v["dataset"], v["gamma"], v["seed"], PAPER) for v in select["select_sets"].values()])},
    }
    return with_step_args(params, block)


def raw_items(params: dict, datasets: list[str]) -> dict:
    """The raw stage's list: one item a raw folder (datasets of a kind share theirs), for the kinds whose raw files
    a command writes (a user's folder is there already)."""
    from noisymlt.pipeline import paths

    items: dict[str, dict] = {}
    for d in datasets:
        raw = paths.raw_dir(params, d)
        if paths.raw_argv(params, d) is not None and all(item["raw"] != raw for item in items.values()):
            items[d] = {"dataset": d, "raw": raw}
    return items


def with_step_args(params: dict, block: dict) -> dict:
    """Each item of a list a stage with computed words runs over (noisymlt.pipeline.steps: `args`) gets them, as
    one shell text: the stage's command is `python -m noisymlt ${item.args}`, the words Snakemake's rule runs."""
    from noisymlt.pipeline.steps import STEPS

    for step in STEPS:
        if step.args is not None and step.over and not step.shard:
            items = block[step.over[len("${dvc."):-1]]
            for fields in items.values():
                words = step.args(params, fields)
                fields["args"], fields["command"] = shlex.join(words), words[0]  # command: its code digest's name
    return block


def image_deps(params: dict, dataset: str, resolved: dict) -> dict:
    """The image folders a run reads: `images` (its train images: COCO's fetched subset, else the raw folder) and
    `raw` (its test images' raw folder). Under train.loader: cache a run reads the decoded caches instead (their
    own dependencies), so both name the raw folder's marker file: DVC hashes a folder dependency file by file on
    every `dvc status`, and 156 demo runs naming a 6,800-file folder three times each made that take minutes."""
    from noisymlt.pipeline import paths

    if resolved["train"].get("loader", "pil") == "cache":
        marker = paths.raw_marker(params, dataset)
        return {"images": marker, "raw": marker}
    return {"images": paths.train_images_folder(params, dataset), "raw": paths.raw_dir(params, dataset)}


def selection_block(params: dict, runs: dict) -> dict:
    """The model-selection stages' lists (noisymlt.pipeline.selection), for the main grid's methods:
      select_datasets  datasets with a selection (one split each)
      select_sets      DATASET-GAMMA-SEED -> a selection set (its fit and val parts)
      select_caches    DATASET-PART -> the fit / val image caches, with the part table they are built from
      candidates       DATASET-METHOD-STAGE-GAMMA-SEED-TAG -> one candidate run; `previous`: the choice file of the
                       stage before (stage 1: the split file, a dependency anyway); config_key -> its run id in
                       candidate_configs (a later stage's chosen values come in through `previous`)
      selections       DATASET-METHOD-STAGE -> one select stage over the candidates of that stage (their folder:
                       layout.STAGE_DIR)"""
    from noisymlt.config import resolve_run
    from noisymlt.pipeline import layout as L
    from noisymlt.pipeline import selection as S
    from noisymlt.pipeline import paths
    from noisymlt.core.manifest import run_id

    out = {"select_datasets": {}, "select_sets": {}, "select_caches": {}, "candidates": {}, "candidate_configs": {},
           "selections": {}}
    for dataset in params["grid"]["datasets"]:
        owners = S.selecting_methods(params, [r["method"] for r in runs.values() if r["dataset"] == dataset])
        if not owners:
            continue
        out["select_datasets"][dataset] = {"dataset": dataset}
        sets = S.selection_sets(params)
        for gamma, seed in sets:
            out["select_sets"][f"{dataset}-{gamma}-{seed}"] = {"dataset": dataset, "gamma": gamma, "seed": seed}
        for part in ("fit", "val"):
            out["select_caches"][f"{dataset}-{part}"] = {
                "dataset": dataset, "part": part,
                "labels": L.fill(L.SELECT_PART, dataset=dataset, gamma=sets[0][0], seed=sets[0][1], part=part),
                "images": next(r["images"] for r in runs.values() if r["dataset"] == dataset)}
        for method in owners:
            for stage in range(1, len(S.stages(params, method)) + 1):
                previous = (S.choice_file(dataset, method, stage - 1) if stage > 1
                            else L.fill(L.SELECT_SPLIT, dataset=dataset))
                out["selections"][f"{dataset}-{method}-{stage}"] = {
                    "dataset": dataset, "method": method, "stage": stage, "previous": previous}
                for tag, values in S.candidates(params, method, stage):
                    for gamma, seed in sets:
                        key = f"{dataset}-{method}-{stage}-{gamma}-{seed}-{tag}"
                        # earlier stages' values come from `previous`: placeholders here (S.placeholders)
                        cfg = resolve_run(params, dataset, method, gamma, seed, candidate=True,
                                          chosen={**S.placeholders(params, method, stage - 1), **values})
                        out["candidates"][key] = {
                            "dataset": dataset, "method": method, "stage": stage, "gamma": gamma, "seed": seed,
                            "tag": tag, "previous": previous, "config_key": key.replace(".", "_"),
                            **image_deps(params, dataset, cfg),
                            "weights": cfg["train"].get("weights_path") or paths.raw_marker(params, dataset),
                            "embeddings": cfg["method_cfg"].get("embeddings_file") or
                            paths.raw_marker(params, dataset)}
                        out["candidate_configs"][key.replace(".", "_")] = run_id(cfg)
    return out


def _leaves(tree: dict, prefix: tuple = ()) -> dict[tuple, object]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, prefix + (key,)))
        else:
            out[prefix + (key,)] = value
    return out


def _get(tree: dict, path: tuple):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def unreached_changes(old: dict, new: dict) -> list[str]:
    """Changed keys of the train block (global or a dataset's) that some grid methods do not see, because
    their schedule's or their own train block sets the same key (noisymlt.config.resolve_run's layers):
    one line per key, naming the methods and the key that wins for them."""
    from noisymlt.config import DEFAULT_SCHEDULE

    old_leaves, new_leaves = _leaves(old), _leaves(new)
    notes = []
    for path in sorted(k for k in new_leaves.keys() | old_leaves.keys()
                       if old_leaves.get(k) != new_leaves.get(k)):
        if path[0] == "train":
            key, datasets = path[1:], new["grid"]["datasets"]
        elif path[0] == "datasets" and len(path) > 3 and path[2] == "train":
            key, datasets = path[3:], [path[1]]
        else:
            continue
        winners: dict[str, list[str]] = {}
        for method in new["grid"]["methods"]:
            mcfg = new["methods"][method]
            schedule = mcfg.get("schedule", DEFAULT_SCHEDULE)
            for where, block in ((f"methods.{method}.train", mcfg.get("train", {})),
                                 (f"schedules.{schedule}.train", new["schedules"][schedule].get("train", {}))):
                if _get(block, key) is not None:
                    winners.setdefault(f"{where}.{'.'.join(key)}", []).append(method)
                    break
            else:
                if path[0] == "train" and any(_get(new["datasets"][d].get("train", {}), key) is not None
                                              for d in datasets):
                    winners.setdefault(f"datasets.<name>.train.{'.'.join(key)}", []).append(method)
        for where, methods in winners.items():
            notes.append(f"{'.'.join(path)} changed ({old_leaves.get(path)!r} -> {new_leaves.get(path)!r}) but does "
                         f"not reach {', '.join(methods)}: {where} overrides it for them (train < "
                         f"datasets.<name>.train < schedules.<schedule>.train < methods.<name>.train); "
                         f"change that key to reach them")
    return notes


def selected_changes(old: dict, new: dict) -> list[str]:
    """Changed lr / pseudo-label threshold keys that grid methods under model selection do not see: their
    selected values replace them (noisymlt.pipeline.selection). One line per key, naming the methods."""
    from noisymlt.pipeline import selection

    old_leaves, new_leaves = _leaves(old), _leaves(new)
    notes = []
    for path in sorted(k for k in new_leaves.keys() | old_leaves.keys() if old_leaves.get(k) != new_leaves.get(k)):
        if path[-1] == "lr" and "train" in path and path[0] in ("train", "datasets", "schedules", "methods"):
            name = "lr"
        elif path[0] in ("methods", "datasets") and "thresholds" in path:
            name = "alpha"
        else:
            continue
        hidden = []
        for method in new["grid"]["methods"]:
            who = selection.owner(new, method)
            if who is None or path[0] == "methods" and path[1] != method:
                continue
            keys = {k for stage in selection.stages(new, who) for k in stage}
            if name in keys or name == "alpha" and "beta" in keys:
                hidden.append(method)
        if hidden:
            notes.append(f"{'.'.join(path)} changed ({old_leaves.get(path)!r} -> {new_leaves.get(path)!r}) but does not "
                         f"reach {', '.join(hidden)}: model selection chooses it for them (selection.methods); set "
                         f"selection.methods.NAME: null to train them with fixed values")
    return notes


def _previous(out: Path) -> dict | None:
    """The params an existing file of this kind holds (stale or not), without its dvc block."""
    try:
        previous = json.loads(out.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(previous, dict) or "dvc" not in previous:
        return None
    previous.pop("dvc")
    return {k: v for k, v in previous.items() if not k.startswith(SHARD_BLOCK)}


def write(layers: list[str], out: str | Path) -> Path:
    from noisymlt.config import load_params

    params = load_params(*layers)
    previous = _previous(Path(out))
    if previous is not None:
        for note in unreached_changes(previous, params) + selected_changes(previous, params):
            print(f"warning: {note}", file=sys.stderr, flush=True)
    block = {"written_by": WRITTEN_BY.format(layers=" ".join(map(str, layers)), out=out), **dvc_block(params, layers)}
    shards = shard_blocks(block.pop("runs"), block.pop("candidates"), block["preload"])
    for name, shard in shards.items():  # first: DVC loads a shard's dvc.yaml through its file
        write_json(runs_file(out, name[len(SHARD_BLOCK):]), {name: shard})
    return write_text(Path(out), json.dumps({"dvc": block, **params}, indent=1) + "\n")


def runs_file(out: str | Path, shard: str) -> Path:
    """The file of a shard's run stages' lists: OUT-STEM-runs/SHARD.json beside the params file ``out``
    (dvc-params-runs/03.json), named after it so that writing another params file beside it leaves it alone."""
    out = Path(out)
    return out.parent / f"{out.stem}-runs" / f"{shard}.json"


def _cmd(args: argparse.Namespace) -> int:
    from noisymlt.pipeline import dvc_yaml  # the stage files, written from the step declarations

    out = write(args.layers, args.out)
    print(f"{out}: {' + '.join(args.layers)}")
    root = Path(args.out).parent
    if (root / dvc_yaml.ROOT_FILE).is_file():  # a project: its stages follow an edited step declaration
        for path in dvc_yaml.write(root):
            print(f"{path}: rewritten from the step declarations (noisymlt/pipeline/steps.py)")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "params", help="merge params files (params.yaml, then a profile's) into the one file DVC reads",
        description="Layer params files left to right as Snakemake's --configfile does, validate the result and "
                    "write it with a `dvc` block (the lists dvc.yaml's stages expand over, the layers' sha256) to "
                    "OUT. dvc.yaml reads dvc-params.json: run this before `dvc repro`, and again after editing a "
                    "layer (steps refuse a stale file). In a project (dvc.yaml beside OUT) it also rewrites the "
                    "stage files that differ from the step declarations (as `noisymlt dvc-yaml` does).",
    )
    p.add_argument("layers", nargs="+", help="params files, layered left to right (params.yaml first)")
    p.add_argument("--out", default="dvc-params.json", help="file to write (default: dvc-params.json)")
    p.set_defaults(func=_cmd)
