"""The run stages' dvc.yaml files: workflow/dvc/runs/SHARD/dvc.yaml, one per shard, from one template.

DVC keeps one dvc.lock per dvc.yaml and rewrites all of it after each stage it runs. The pipeline's run
stages (a training run or a selection candidate each: most of its stages) are therefore spread over
params.DVC_SHARDS files by a stable hash of their key (params.shard_of); dvc-params-runs/SHARD.json (written with
dvc-params.json) lists each shard's runs and candidates under config.SHARD_BLOCK + SHARD, e.g. dvc_runs_03. The files
differ only in their shard number, so they are written from workflow/dvc/run_stages.yaml (edit that, then run
`noisymlt dvc-shards`); the test suite checks that the committed files are the template's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from noisymlt.pipeline.params import DVC_SHARDS, shard_of

TEMPLATE = Path("workflow/dvc/run_stages.yaml")
FOLDER = Path("workflow/dvc/runs")
MARK = "@SHARD@"
GENERATED = "# Written by `noisymlt dvc-shards` from {template}: edit that file, then rerun the command.\n"


def shards() -> list[str]:
    return [f"{i:02d}" for i in range(DVC_SHARDS)]


def render(template: str, shard: str) -> str:
    return GENERATED.format(template=TEMPLATE.as_posix()) + template.replace(MARK, shard)


def expected(root: Path) -> dict[Path, str]:
    """Shard file -> the text the template gives it."""
    template = (root / TEMPLATE).read_text()
    return {FOLDER / shard / "dvc.yaml": render(template, shard) for shard in shards()}


def stale(root: Path) -> list[Path]:
    """Shard files missing or not the template's, and files of shards that no longer exist."""
    want = expected(root)
    wrong = [p for p, text in want.items() if not (root / p).is_file() or (root / p).read_text() != text]
    extra = [p.relative_to(root) for p in sorted((root / FOLDER).glob("*/dvc.yaml")) if p.relative_to(root) not in want]
    return wrong + extra


def write(root: Path) -> list[Path]:
    """Write the shard files that differ from the template's; returns them."""
    changed = []
    for path, text in expected(root).items():
        target = root / path
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            changed.append(path)
    return changed


def address(key: str, stage: str = "train") -> str:
    """The DVC address of a run's stage (train) or a candidate's (train_candidate), e.g. for `dvc dag`."""
    return f"{(FOLDER / shard_of(key) / 'dvc.yaml').as_posix()}:{stage}@{key}"


def _cmd(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if args.where:
        print(address(args.where, "train_candidate" if args.candidate else "train"))
        return 0
    if args.check:
        wrong = stale(root)
        for path in wrong:
            print(f"{path}: not what {TEMPLATE} gives; run `noisymlt dvc-shards`")
        return 1 if wrong else 0
    changed = write(root)
    print(f"{FOLDER}: {len(changed)} of {DVC_SHARDS} shard files written from {TEMPLATE}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "dvc-shards", help="write the run stages' dvc.yaml files from their template (DVC route)",
        description=f"Write {FOLDER}/SHARD/dvc.yaml ({DVC_SHARDS} shards) from {TEMPLATE}: the training and "
                    "candidate stages of the DVC pipeline, spread over several files so that DVC rewrites a small "
                    "dvc.lock after each stage it runs. Run it after editing the template. --where KEY prints "
                    "the address of a run's stage (KEY: DATASET-GAMMA-SEED-METHOD, e.g. toy-0.5-0-erm).",
    )
    p.add_argument("--root", default=".", help="project root (default: .)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a shard file is not the template's")
    p.add_argument("--where", metavar="KEY", help="print the DVC address of this run's stage and exit")
    p.add_argument("--candidate", action="store_true", help="with --where: KEY is a selection candidate's key")
    p.set_defaults(func=_cmd)
