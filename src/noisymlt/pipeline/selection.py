"""Model selection as the paper does it: hyper-parameters cross-validated on held-out *noisy* training labels.

The paper cross-validates the initial lr in {0.02, 0.08, 0.14, 0.2}, alpha in {0.7, 0.8, 0.9} and beta in
{0.1, 0.2, 0.3, 0.4}. Here (params `selection`):

1. ``split``: a seeded subset of the long-tailed training images is held out, stratified on the noisy labels of
   every selection set (noise rate x seed) so that each class keeps positives on both sides. One file per
   dataset (data/<dataset>/select/split.json).
2. ``parts``: each selection set's noisy table is cut into fit and val tables holding the noisy labels only
   (the clean_* columns are not even read).
3. Candidates are ordinary training runs on the fit table, evaluated against the val table, one per value
   combination of a *stage* (e.g. lr first, then alpha x beta at the chosen lr).
4. ``choose``: a stage's candidates are ranked by their validation mAP (the method's ranked head), averaged
   over the selection sets. The choice accumulates over the stages.
5. The final runs train on the whole training set with the chosen values, which enter their resolved
   configuration (so their run id): a changed choice reruns exactly the runs that read it.

Nothing here opens the test set or a clean label (tests/test_selection.py holds it to that).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from pathlib import Path

import numpy as np

from noisymlt.data.splits import stratified_split  # in the data layer: a user folder's test part draws with it too
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.options import BRANCH_NAMES
from noisymlt.config import (PSEUDO_KEYS, chosen_that_apply, method_entry, read_choice, threshold_groups,
                             uses_pseudo_labels)
from noisymlt.core.files import read_json, write_json
from noisymlt.pipeline import layout as L

log = logging.getLogger(__name__)


def tie_rule(block: dict) -> str:
    """The stated rule a stage's winner follows (recorded in every stage file and shown by the README)."""
    margin = float(block.get("tie_margin", 0.0))
    prefer = ", ".join(f"{k} {v:g}" for k, v in (block.get("prefer") or {}).items())
    return (f"scores are compared at 0.01 mAP points (the tables' precision); candidates within {margin:g} points of "
            "the best are tied (selection.tie_margin: closer than the selection can resolve)"
            + (f"; of tied candidates the one with the most of the references' values ({prefer}) wins" if prefer else "")
            + ", then the first in the stage's grid order (each grid lists its values from the most conservative: "
              "the smallest lr, the highest alpha, the lowest beta)")


# ------------------------------------------------------------------------------------------ layout
# The patterns are noisymlt.pipeline.layout's; these fill the ones the Snakemake rules ask for by name.

def candidate_dir(dataset: str, method: str, stage: int, gamma: float, seed: int, tag: str) -> str:
    return L.fill(L.CANDIDATE, dataset=dataset, method=method, stage=stage, gamma=gamma, seed=seed, tag=tag)


def stage_file(dataset: str, method: str, stage: int) -> str:
    """Every candidate's scores and the choice so far; the last stage's file holds every stage."""
    return L.fill(L.STAGE_FILE, dataset=dataset, method=method, stage=stage)


def choice_file(dataset: str, method: str, stage: int) -> str:
    """The values chosen up to a stage, nothing else: what later stages and final runs read, so that a
    rerun selection that chooses the same values leaves their inputs as they were."""
    return L.fill(L.CHOICE_FILE, dataset=dataset, method=method, stage=stage)


# ------------------------------------------------------------------------------------------ params

def enabled(params: dict) -> bool:
    block = params.get("selection") or {}
    return bool(block.get("enabled", False))


def owner(params: dict, method: str) -> str | None:
    """The method whose selection a method's final runs read: itself, its `same_as`, or None (fixed values)."""
    if not enabled(params):
        return None
    entry = method_entry(params, method)
    if entry is None:
        return None
    if isinstance(entry, dict):  # another method's values: none while that method selects nothing itself
        other = entry["same_as"]
        if not isinstance(method_entry(params, other), list):
            return None
        # nor when none of them applies (Ours' alpha and beta alone, for a variant without pseudo labels)
        names = {name for stage in stages(params, other) for name in stage}
        return other if chosen_that_apply(params, method, dict.fromkeys(names, 0.0)) else None
    return method


def stages(params: dict, method: str) -> list[list[str]]:
    """The stages a method selects in (lists of hyper-parameter names); [] when it selects nothing itself."""
    if not enabled(params):
        return []
    entry = method_entry(params, method)
    return [list(stage) for stage in entry] if isinstance(entry, list) else []


def selection_sets(params: dict) -> list[tuple[float, int]]:
    block = params["selection"]
    return [(float(g), int(s)) for g in block["gammas"] for s in block["seeds"]]


def selecting_methods(params: dict, methods: list[str]) -> list[str]:
    """The methods that run candidates for final runs of ``methods`` (their owners), in first-seen order."""
    owners = (owner(params, m) for m in methods)
    return list(dict.fromkeys(o for o in owners if o is not None))


def recorded_selections(params: dict, methods: list[str]) -> list[tuple[str, str]]:
    """(method, record file) for each of ``methods`` whose values are fixed here and that `selection.records`
    names: a selection run elsewhere (a profile layer), committed, whose choice those values must be."""
    records = params["selection"].get("records") or {}
    return [(m, records[m]) for m in dict.fromkeys(methods) if m in records and owner(params, m) is None]


def record_mismatch(params: dict, method: str, path: str | Path) -> str | None:
    """Why the record at ``path`` is not the choice ``method``'s runs train with here, or None when it is: it is
    the method's, on this selection's sets and tie margin, and each value it chose is the one the method's
    resolved config holds (lr; alpha and beta in every branch's selected class groups)."""
    from noisymlt.config import resolve_run
    from noisymlt.methods.pseudo_labels import reference_thresholds

    try:
        rec = json.loads(Path(path).read_text())
        chosen, dataset, sets = rec["chosen"], rec["dataset"], [(float(s["gamma"]), int(s["seed"])) for s in rec["sets"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"cannot read a selection record ({exc})"
    if rec.get("method") != method:
        return f"records the selection of {rec.get('method')!r}, not {method!r}"
    if sets != selection_sets(params):
        return f"was selected on the sets {sets}, this selection's are {selection_sets(params)}"
    margin = params["selection"].get("tie_margin")
    if rec.get("tie_margin") != margin:
        return f"was selected with tie margin {rec.get('tie_margin')}, this selection's is {margin}"
    gamma, seed = sets[0]
    resolved = resolve_run(params, dataset, method, gamma, seed)
    held = {"lr": float(resolved["train"]["lr"])}
    if uses_pseudo_labels(params, method):
        groups = threshold_groups(params)
        thresholds = reference_thresholds(resolved)
        for key in PSEUDO_KEYS:
            found = {thresholds.get(b, {}).get(key, {}).get(g) for b in BRANCH_NAMES for g in groups.get(key, [])}
            held[key] = found.pop() if len(found) == 1 else sorted(found, key=str)
    wrong = {k: (v, held.get(k)) for k, v in chosen_that_apply(params, method, chosen).items() if held.get(k) != float(v)}
    if wrong:
        return "chose " + ", ".join(f"{k} {v:g} where {method}'s runs train with {h}" for k, (v, h) in wrong.items())
    return None


# ------------------------------------------------------------------------------------------ candidates

def stage_grid(params: dict, keys: list[str]) -> list[dict]:
    """Every value combination of a stage, in grid order (the first key varies slowest)."""
    grids = params["selection"]["grids"]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grids[k] for k in keys))]


def candidate_tag(values: dict) -> str:
    """A candidate's folder name: lr0.08, alpha0.8_beta0.2."""
    return "_".join(f"{k}{float(v):g}" for k, v in values.items())


def candidates(params: dict, method: str, stage: int) -> list[tuple[str, dict]]:
    """(tag, values) of a stage's candidates (stages count from 1)."""
    return [(candidate_tag(v), v) for v in stage_grid(params, stages(params, method)[stage - 1])]


def final_choice_file(params: dict, dataset: str, method: str) -> str | None:
    """The choice file a final run of ``method`` reads, or None when its values are fixed."""
    who = owner(params, method)
    if who is None:
        return None
    return choice_file(dataset, who, len(stages(params, who)))


# ------------------------------------------------------------------------------------------ split

def write_split(tables: dict[str, Path], out: Path, fraction: float, seed: int) -> dict:
    """split.json from the noisy tables of the selection sets (noisy labels only)."""
    from noisymlt.data.parts import read_noisy_copies

    read = read_noisy_copies(tables)
    first = next(iter(read.values()))
    val, unsplit = stratified_split([t.labels for t in read.values()], fraction, seed)
    for name, classes in zip(read, unsplit):
        if classes:
            log.warning("%s: class(es) %s have fewer than two noisy positives (or lost them to rarer classes) and "
                        "cannot be on both sides of the split: left out of the validation mAP", name,
                        [first.classes[c] for c in classes])
    record = {
        "held_out": fraction, "seed": seed, "images": {"fit": int((~val).sum()), "val": int(val.sum())},
        "val_image_ids": [i for i, v in zip(first.image_ids, val) if v],
        "positives": {name: {"fit": t.labels[~val].sum(0).astype(int).tolist(),
                             "val": t.labels[val].sum(0).astype(int).tolist()} for name, t in read.items()},
        "classes": first.classes,
        "unsplit_classes": {name: [first.classes[c] for c in u] for name, u in zip(read, unsplit)},
        "stratified_on": {name: str(path) for name, path in tables.items()},
    }
    write_json(out, record)
    return record


def write_parts(noisy: Path, split: Path, fit_out: Path, val_out: Path) -> tuple[int, int]:
    """The fit and val tables of one selection set: its noisy labels, cut by the split."""
    from noisymlt.data.labels import read_labels
    from noisymlt.data.parts import write_cut

    table = read_labels(noisy, noisy_only=True)
    try:
        val_ids = set(json.loads(Path(split).read_text())["val_image_ids"])
    except (OSError, ValueError, KeyError) as exc:
        raise NoisyMLTError(f"{split}: cannot read the selection split ({exc})") from exc
    unknown = val_ids - set(table.image_ids)
    if unknown:
        raise NoisyMLTError(f"{split}: {len(unknown)} validation image(s) are not in {noisy}, e.g. {sorted(unknown)[0]}")
    val, fit = write_cut(table, np.array([i in val_ids for i in table.image_ids]), val_out, fit_out)
    return fit, val


# ------------------------------------------------------------------------------------------ choice

def choose(scores: list[float], values: list[dict] | None = None, block: dict | None = None) -> tuple[int, list[int]]:
    """(winner, tied) indices by ``tie_rule``: scores are validation mAP in percent, in grid order; ``values`` the
    candidates' values and ``block`` the params' selection block (its tie_margin and prefer)."""
    block = block or {}
    rounded = [round(float(s), 2) for s in scores]
    if any(np.isnan(rounded)):
        raise NoisyMLTError("a candidate has no validation score")
    margin = float(block.get("tie_margin", 0.0))
    best = max(rounded)
    tied = [i for i, s in enumerate(rounded) if best - s <= margin + 1e-9]
    prefer = block.get("prefer") or {}

    def departures(i: int) -> int:  # how many of a candidate's values differ from the references'
        given = (values or [{}] * len(scores))[i]
        return sum(1 for k, v in given.items() if k in prefer and abs(float(v) - float(prefer[k])) > 1e-12)

    return min(tied, key=lambda i: (departures(i), i)), tied


def candidate_score(metrics_path: Path) -> tuple[float, str, str | None]:
    """(validation mAP in percent, the head it is of, run id) from a candidate's metrics.json: the head the
    tables rank the method by (its ensemble if it has one)."""
    try:
        m = json.loads(Path(metrics_path).read_text())
        heads = m["heads"]
        head = "ensemble" if "ensemble" in heads else sorted(heads)[0]
        return 100 * float(heads[head]["map"]["total"]), head, m.get("run_id")
    except (OSError, ValueError, KeyError) as exc:
        raise NoisyMLTError(f"{metrics_path}: cannot read a candidate's validation mAP ({exc})") from exc


def select_stage(params: dict, dataset: str, method: str, stage: int, runs: str | Path = ".",
                 previous: Path | None = None) -> dict:
    """Score one stage's candidates (their metrics.json files under ``runs``) and write its stage and choice
    files. ``previous``: the choice file of the stage before, whose values every candidate carried."""
    root = Path(runs)
    prior = read_choice(previous) if previous else {}
    sets = selection_sets(params)
    rows = []
    for tag, values in candidates(params, method, stage):
        scores, ids, head = {}, {}, None
        for gamma, seed in sets:
            path = root / candidate_dir(dataset, method, stage, gamma, seed, tag) / "metrics.json"
            score, head, run = candidate_score(path)
            scores[f"g{L.gtag(gamma)}_s{seed}"], ids[f"g{L.gtag(gamma)}_s{seed}"] = round(score, 4), run
        rows.append({"tag": tag, "values": values, "scores": scores, "mean": round(float(np.mean(list(scores.values()))), 4),
                     "run_ids": ids})
    best, tied = choose([r["mean"] for r in rows], [r["values"] for r in rows], params["selection"])
    chosen = {**prior, **rows[best]["values"]}
    keys = stages(params, method)[stage - 1]
    record = {
        "dataset": dataset, "method": method, "stage": stage, "keys": keys,
        "metric": f"mAP (%) of the {head} head against the held-out noisy labels, mean over the selection sets",
        "sets": [{"gamma": g, "seed": s} for g, s in sets], "held_out": params["selection"]["held_out"],
        "tie_rule": tie_rule(params["selection"]), "tie_margin": float(params["selection"].get("tie_margin", 0.0)),
        "tied": [rows[i]["tag"] for i in tied], "previous": prior, "candidates": rows, "winner": rows[best]["tag"],
        "chosen": chosen,
    }
    if previous:
        earlier = read_json(L.stage_file_of(previous), "the earlier stage's record", require_object=True)
        record["earlier_stages"] = earlier.get("earlier_stages", []) + [
            {k: earlier.get(k) for k in ("stage", "keys", "candidates", "tie_margin", "tied", "winner", "chosen")}]
    write_json(root / stage_file(dataset, method, stage), record)
    write_json(root / choice_file(dataset, method, stage),
               {"dataset": dataset, "method": method, "stage": stage, "chosen": chosen})
    return record


# ------------------------------------------------------------------------------------------ CLI

def split_tables(params: dict, dataset: str) -> dict[str, str]:
    """The noisy tables the split is stratified on, one per selection set, by name (g0.5_s0)."""
    return {f"g{L.gtag(g)}_s{s}": L.fill(L.NOISY, dataset=dataset, gamma=g, seed=s) for g, s in selection_sets(params)}


def named_tables(items: list[str]) -> dict[str, Path]:
    """``--noisy NAME=FILE ...`` as {name: path} (selection's split and cross-fitting's)."""
    tables = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            example = L.fill(L.NOISY, dataset="voc", gamma=0.5, seed=0)
            raise NoisyMLTError(f"--noisy {item}: expected NAME=FILE (e.g. g0.5_s0={example})")
        tables[name] = Path(path)
    return tables


def _cmd_split(args: argparse.Namespace) -> int:
    tables = named_tables(args.noisy)
    if not 0 < args.held_out <= 0.5:
        raise NoisyMLTError(f"--held-out {args.held_out}: must lie in (0, 0.5]")
    rec = write_split(tables, Path(args.out), args.held_out, args.seed)
    print(f"{args.out}: {rec['images']['val']} validation and {rec['images']['fit']} fit images, stratified on "
          f"{', '.join(tables)}")
    return 0


def _cmd_parts(args: argparse.Namespace) -> int:
    fit, val = write_parts(Path(args.noisy), Path(args.split), Path(args.fit), Path(args.val))
    print(f"{args.fit}: {fit} images; {args.val}: {val} images (noisy labels only)")
    return 0


def _cmd_choose(args: argparse.Namespace) -> int:
    from noisymlt.core.files import json_object_arg

    params = {"selection": json_object_arg(args.selection, "--selection")}
    rec = select_stage(params, args.dataset, args.method, args.stage, args.runs,
                       Path(args.previous) if args.previous else None)
    for row in rec["candidates"]:
        mark = "  <- chosen" if row["tag"] == rec["winner"] else ""
        print(f"{args.method} stage {args.stage} {row['tag']:>20}: validation mAP {row['mean']:.2f}{mark}")
    print(f"{stage_file(args.dataset, args.method, args.stage)}: chosen {rec['chosen']}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("select", help="model selection on held-out noisy training labels (split, parts, choose)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = p.add_subparsers(dest="select_step", metavar="STEP", required=True)
    q = steps.add_parser("split", help="hold out a stratified, seeded share of the training images (one per dataset)")
    q.add_argument("--noisy", nargs="+", required=True, metavar="NAME=FILE",
                   help="the noisy table of each selection set (noisy labels only are read)")
    q.add_argument("--held-out", type=float, required=True, help="validation share of the images, in (0, 0.5]")
    q.add_argument("--seed", type=int, required=True)
    q.add_argument("--out", required=True, help="split file to write (data/DATASET/select/split.json)")
    q.set_defaults(func=_cmd_split)
    q = steps.add_parser("parts", help="cut one noisy table into its fit and validation tables (noisy labels only)")
    q.add_argument("--noisy", required=True, help="noisy label table of a selection set")
    q.add_argument("--split", required=True, help="split.json of `noisymlt select split`")
    q.add_argument("--fit", required=True, help="fit table to write")
    q.add_argument("--val", required=True, help="validation table to write")
    q.set_defaults(func=_cmd_parts)
    q = steps.add_parser("choose", help="rank one stage's candidates by validation mAP and write the choice")
    q.add_argument("--selection", required=True, help="the params' selection block: JSON text or a JSON file")
    q.add_argument("--dataset", required=True)
    q.add_argument("--method", required=True)
    q.add_argument("--stage", type=int, required=True, help="stage number, from 1")
    q.add_argument("--previous", help="choice file of the stage before (stages after the first)")
    q.add_argument("--runs", default=".", help="project root the candidate folders are under (default: .)")
    q.set_defaults(func=_cmd_choose)
