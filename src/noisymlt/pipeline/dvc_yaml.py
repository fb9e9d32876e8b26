"""dvc.yaml and the run stages' shard files, written from the step declarations (noisymlt.pipeline.steps).

DVC reads stages from files; here they are derived, so a step is declared once for both routes. What DVC's
templating does, it does: a stage repeated over a list of the params' ``dvc`` block (``foreach``), with the values
``noisymlt params`` computed into dvc-params.json (``vars``). What it cannot do (branch on a dataset's kind, resolve a
run's configuration, nest loops) stays in Python: the lists themselves, each item with the words a kind's step runs
(noisymlt.pipeline.params), and ``noisymlt step``.

The run stages (a training run or a selection candidate each: most of the pipeline's stages) are spread over
DVC_SHARDS files, workflow/dvc/runs/SHARD/dvc.yaml, by a stable hash of their key (shard_of):
DVC keeps one dvc.lock per dvc.yaml and rewrites all of it after each stage it runs, with ruamel's pure-Python
round trip, which with every run in one file cost more than the training in an experiment on one method
(scripts/benchmark_dvc.py). dvc-params-runs/SHARD.json lists each shard's runs and candidates.

``noisymlt dvc-yaml`` writes the files that differ; ``--check`` writes nothing and fails on a stale one (the test
suite runs it); ``noisymlt params`` rewrites them too, so the DVC route's first command picks up an edited step.
"""

from __future__ import annotations

import argparse
import re
import zlib
from pathlib import Path

import yaml

from noisymlt.pipeline import layout as L
from noisymlt.pipeline.steps import PARAMS_FILE, STEPS, Out, Step, dvc_path

# The run stages are spread over this many dvc.yaml files (workflow/dvc/runs/00 .. 15): DVC rewrites a stage's
# whole dvc.lock after running it, with ruamel's pure-Python round trip (3.6 s at the demo's 190 runs in one
# file), so an experiment on one method's 12 runs spent more time rewriting the lock than training. Sixteen
# keep a shard's lock small at paper scale too (about 50 runs each).
DVC_SHARDS = 16


def shard_of(key: str) -> str:
    """The shard of a run or candidate key: a stable hash, so adding a run moves no other run's stage (a moved
    stage would lose its dvc.lock entry and rerun)."""
    return f"{zlib.crc32(key.encode()) % DVC_SHARDS:02d}"


ROOT_FILE = Path("dvc.yaml")
SHARDS = Path("workflow/dvc/runs")
PLAIN_LISTS = {"${dvc.grid.datasets}"}  # a list of names (its stages' one field is ${item}); the others: dicts
PRELOAD = "${dvc.preload}"  # NOISYMLT_PRELOAD=shared under workflow.preload (the demo), else empty

HEADER = """\
# Written by `noisymlt dvc-yaml` from the step declarations (src/noisymlt/pipeline/steps.py): edit those, then
# rerun the command (`noisymlt params` does too). The Snakemake rules take the same declarations.
#
# DVC's view of the pipeline: the same `python -m noisymlt` steps on the same paths, so `dvc repro` plans the runs
# `snakemake` plans. DVC reads one params file, dvc-params.json, which `noisymlt params` merges from the layers
# Snakemake would use (noisymlt/pipeline/params.py):
#   noisymlt params params.yaml --out dvc-params.json                     paper scale
#   noisymlt params params.yaml workflow/profiles/demo/params.yaml       the demo (`make demo-dvc` does it all)
#   dvc repro                 run what is missing or out of date (the `params` stage first rewrites
#                             dvc-params.json from the same layers if one changed: `dvc exp run -S`)
#   dvc metrics show / dvc plots show / dvc exp show --only-changed      the results (README, DVC)
#   dvc push / dvc pull       share data, runs and reports through a DVC remote (see README)
# Run it inside the noisymlt environment (`python` must be its interpreter). DVC's templating cannot branch on a
# dataset's kind, resolve a run's config or nest loops, so dvc-params.json's `dvc` block carries the lists the
# stages expand over, with the words of a step that depend on a dataset's kind (`${item.args}`: the command the
# Snakemake rule runs); a run, a candidate, a selection's choice and the aggregate go through `noisymlt step ...`,
# which resolves their configuration and files from the params file, prints the explicit command and runs it.
# Raw data live under data/raw/<kind>: DVC stages are keyed by dataset name, so every dataset in grid.datasets
# must be named after its kind (voc, coco, toy), as in the shipped params files.
# Covered: the main grid and the ablations' runs (every file under runs/, but the .dvcignore'd logs and timings,
# is a stage's output, so a pulled clone's `runs` folder is whole), results.parquet, table_total, the
# head/medium/tail tables, the fit diagnostics, the figure, each dataset's structure report; each run's map.json
# as DVC metrics, the runs' training curves as DVC plots. Snakemake only: the paired-difference table, the
# ablation tables and sweep figures, the training-dynamics figures (each reads its own list of runs), the
# running-time table (a measurement that differs on every run, not a versioned result) and the README's numbers.
# No output holds a time or a host: a rerun that reproduces the results is no new version.
# Every command starts with ${dvc.preload}: NOISYMLT_PRELOAD=shared under workflow.preload (the demo), so it runs
# in a child of one preload server that has imported torch once (noisymlt.pipeline.preload), else empty.
# Each stage depends on the digest file(s) of the steps its command runs (data/code/COMMAND.json,
# data/code/train/METHOD.json), rewritten only when that step's static import closure changed: an edit reruns
# exactly the stages whose code it touches.
"""

SHARD_HEADER = """\
# Written by `noisymlt dvc-yaml` from the step declarations (src/noisymlt/pipeline/steps.py): edit those, then
# rerun the command. The run stages of dvc.yaml's pipeline, shard {shard} of {shards}: the training runs and
# model-selection candidates whose key hashes to this shard (noisymlt.pipeline.dvc_yaml.shard_of), which
# dvc-params-runs/{shard}.json lists under dvc_runs_{shard} (why shards: noisymlt/pipeline/dvc_yaml.py). Each file
# has its own dvc.lock beside it: commit them with the root's. Paths are the project root's (wdir). Stage
# addresses: workflow/dvc/runs/{shard}/dvc.yaml:train@KEY (`noisymlt dvc-yaml --where KEY` prints a run's).
"""

PLOTS = [
    {"training_loss": {"template": "workflow/dvc/run_curves.json",
                       "title": "training loss (mean over an epoch's iterations)", "y_label": "loss", "x": "epoch",
                       "y": {"reports/training_curves.json": "loss"}}},
    {"learning_rate": {"template": "workflow/dvc/run_curves.json", "title": "learning rate (at an epoch's last iteration)",
                       "y_label": "learning rate", "x": "epoch", "y": {"reports/training_curves.json": "lr"}}},
    {"pseudo_labels_added": {"template": "workflow/dvc/branch_curves.json", "title": "pseudo labels: missing labels added",
                             "y_label": "labels added per iteration", "x": "epoch",
                             "y": {"reports/pseudo_label_curves.json": "added"}}},
    {"pseudo_labels_removed": {"template": "workflow/dvc/branch_curves.json",
                               "title": "pseudo labels: given labels discarded",
                               "y_label": "labels discarded per iteration", "x": "epoch",
                               "y": {"reports/pseudo_label_curves.json": "removed"}}},
    "reports/map_vs_gamma.png",
]
PLOTS_NOTE = ("`dvc plots show` / `dvc plots diff`: the runs' training curves (one panel per method, one line per run,\n"
              "coloured by noise rate: workflow/dvc/run_curves.json; pseudo labels: one row of panels per branch,\n"
              "branch_curves.json) and the mAP-vs-noise figure.")


def _render(step: Step, text: str, plain: bool) -> str:
    """A command or path with its placeholders as DVC writes them: files as their patterns, computed values from
    the dvc block (``step.dvc_values``) or the stage's item, fields from the item."""
    def path(kind: str, name: str | None) -> str:
        files = step.input if kind == "input" else step.outputs()
        if name is None:  # `{input}`: the step's only input
            (name,) = files
        return dvc_path(files[name], plain)

    def computed(m: re.Match) -> str:
        if m.group(1) not in step.computed:
            return m.group(0)
        return "${%s.%s}" % (f"dvc.{step.dvc_values}" if step.dvc_values else "item", m.group(1))

    text = re.sub(r"\{(input|output)(?:\.([a-z_]+))?\}", lambda m: path(m.group(1), m.group(2)), text)
    text = re.sub(r"(?<!\$)\{([a-z_]+)(?::q)?\}", computed, text)
    return dvc_path(text, plain)


def stage(step: Step) -> dict:
    """The stage of one step (a shard stage as a template: its lists under `${shard.`)."""
    plain = step.over in PLAIN_LISTS
    command = step.dvc_command or step.command
    body: dict = {}
    if step.shard:
        body["wdir"] = "../../../.."
    body["cmd"] = f"{PRELOAD} python -m noisymlt {_render(step, command, plain)}"
    deps = [dvc_path(p, plain) for p in (*step.input.values(), *step.dvc_input.values())]
    deps += [dvc_path(L.CODE.replace("{command}", c), plain) for c in step.code_words() if c != "-"]
    if deps:
        body["deps"] = deps
    if step.params:
        body["params"] = [{PARAMS_FILE: [dvc_path(k, plain) for k in step.params]}]
    outs = []
    for out in step.output.values():
        if isinstance(out, Out):
            options = {**({"cache": False} if not out.cache else {}), **({"persist": True} if out.persist else {})}
            outs.append({dvc_path(out.path, plain): options} if options else dvc_path(out.path, plain))
        else:
            outs.append(dvc_path(out, plain))
    body["outs"] = outs
    if step.metrics:
        body["metrics"] = [dvc_path(p, plain) for p in step.metrics.values()]
    return {"foreach": step.over, "do": body} if step.over else body


def _comment(note: str, indent: str = "") -> str:
    return "".join(f"{indent}# {line}".rstrip() + "\n" for line in note.splitlines()) if note else ""


def _dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=116, default_flow_style=False)


def _stages_text(steps: list[Step], shard: str | None = None) -> str:
    text = "stages:\n"
    for step in steps:
        body = _dump({step.name: stage(step)})
        if shard is not None:
            body = body.replace("${shard.", f"${{dvc_runs_{shard}.").replace(PRELOAD, f"${{dvc_runs_{shard}.preload}}")
        text += "\n" + _comment(step.note, "  ") + "".join(f"  {line}\n" for line in body.splitlines())
    return text


def root_text() -> str:
    steps = [s for s in STEPS if not s.shard and not s.snakemake_only]
    vars_ = "vars:\n  - dvc-params.json:dvc  # only the generated block: params.yaml, loaded by DVC anyway, owns the rest\n"
    plots = _comment(PLOTS_NOTE) + _dump({"plots": PLOTS})
    return f"{HEADER}\n{vars_}\n{_stages_text(steps)}\n{plots}"


def shard_text(shard: str) -> str:
    vars_ = (f"vars:\n  - ../../../../dvc-params-runs/{shard}.json:dvc_runs_{shard}  # relative to this file "
             "(stages' paths: to their wdir)\n")
    return (SHARD_HEADER.format(shard=shard, shards=DVC_SHARDS) + "\n" + vars_ + "\n"
            + _stages_text([s for s in STEPS if s.shard], shard))


def expected() -> dict[Path, str]:
    """Every generated file -> its text."""
    files = {ROOT_FILE: root_text()}
    files.update({SHARDS / f"{i:02d}" / "dvc.yaml": shard_text(f"{i:02d}") for i in range(DVC_SHARDS)})
    return files


def stale(root: Path) -> list[Path]:
    """Generated files missing or not what the declarations give, and shard files of shards that no longer exist."""
    want = expected()
    wrong = [p for p, text in want.items() if not (root / p).is_file() or (root / p).read_text() != text]
    extra = [p.relative_to(root) for p in sorted((root / SHARDS).glob("*/dvc.yaml")) if p.relative_to(root) not in want]
    return wrong + extra


def write(root: Path) -> list[Path]:
    """Write the files that differ from what the declarations give; returns them."""
    changed = []
    for path, text in expected().items():
        target = root / path
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    return changed


def address(key: str, stage_name: str = "train") -> str:
    """The DVC address of a run's stage (train) or a candidate's (train_candidate), e.g. for `dvc dag`."""
    return f"{(SHARDS / shard_of(key) / 'dvc.yaml').as_posix()}:{stage_name}@{key}"


def _cmd(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if args.where:
        print(address(args.where, "train_candidate" if args.candidate else "train"))
        return 0
    if args.check:
        wrong = stale(root)
        for path in wrong:
            print(f"{path}: not what the step declarations (noisymlt/pipeline/steps.py) give; run `noisymlt dvc-yaml`")
        return 1 if wrong else 0
    changed = write(root)
    print(f"dvc.yaml and {SHARDS}: {len(changed)} of {1 + DVC_SHARDS} files written from the step declarations")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "dvc-yaml", help="write dvc.yaml and the run stages' shard files from the step declarations (DVC route)",
        description=f"Write {ROOT_FILE} and {SHARDS}/SHARD/dvc.yaml ({DVC_SHARDS} shards) from the step declarations "
                    "(noisymlt/pipeline/steps.py), which the Snakemake rules read too. Run it after editing a step "
                    "(`noisymlt params` runs it as well). --where KEY prints the address of a run's stage (KEY: "
                    "DATASET-GAMMA-SEED-METHOD, e.g. toy-0.5-0-erm).",
    )
    p.add_argument("--root", default=".", help="project root (default: .)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    p.add_argument("--where", metavar="KEY", help="print the DVC address of this run's stage and exit")
    p.add_argument("--candidate", action="store_true", help="with --where: KEY is a selection candidate's key")
    p.set_defaults(func=_cmd)
