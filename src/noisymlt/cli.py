"""The `noisymlt` command. Every workflow rule calls one of these subcommands.

Each command lives in the module that does the work and registers itself through ``add_cli``;
modules keep heavy imports (torch, pycocotools) inside their functions so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from functools import lru_cache

from noisymlt import __version__
from noisymlt.errors import NoisyMLTError, describe_os_error

COMMAND_MODULES = (
    "noisymlt.data.toy",
    "noisymlt.data.download",
    "noisymlt.data.coco_images",
    "noisymlt.data.parse",
    "noisymlt.data.longtail",
    "noisymlt.data.noise",
    "noisymlt.data.imagecache",
    "noisymlt.training.pretrain",
    "noisymlt.pipeline.selection",
    "noisymlt.pipeline.train",
    "noisymlt.evaluation.evaluate",
    "noisymlt.report.inference_time",
    "noisymlt.report.aggregate",
    "noisymlt.report.tables",
    "noisymlt.report.fit",
    "noisymlt.report.figures",
    "noisymlt.report.readme",
    "noisymlt.report.structure",
    "noisymlt.report.noise_level",
    "noisymlt.report.pseudo_labels",
    "noisymlt.pipeline.trace",
    "noisymlt.pipeline.paths",
    "noisymlt.pipeline.params",
    "noisymlt.pipeline.dvc_yaml",
    "noisymlt.pipeline.step_code",
    "noisymlt.pipeline.preload",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="noisymlt",
        description=(
            "Noisy multi-label long-tailed recognition pipeline (VOC-MLT-Noise, COCO-MLT-Noise). "
            "Each subcommand is one pipeline step; Snakemake and DVC call them in order: "
            "download -> parse -> longtail -> cache-images -> noise -> train -> evaluate -> aggregate -> table."
        ),
    )
    parser.add_argument("--version", action="version", version=f"noisymlt {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")  # not "command": code-deps has --command
    for name in COMMAND_MODULES:
        module = importlib.import_module(name)
        module.add_cli(sub)
    return parser


@lru_cache(maxsize=None)
def command_modules() -> dict[str, str]:
    """Pipeline command -> the module that registers it (each command module's ``add_cli``, run here)."""
    out = {}
    for name in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).add_cli(sub)
        out.update({command: name for command in sub.choices})
    return out


def step_entries(command: str) -> tuple[str, ...]:
    """What `python -m noisymlt COMMAND` runs: the CLI and the command's module."""
    from noisymlt.core.codedeps import CLI

    modules_of = command_modules()
    if command not in modules_of:
        raise ValueError(f"unknown command {command!r}; known: {', '.join(sorted(modules_of))}")
    return (*CLI, modules_of[command])


def _load_step_code(command: str) -> tuple[tuple[str, ...], str] | None:
    """The step's code (the CLI and its command's module: noisymlt.pipeline.step_code), loaded now with its digest: the
    digest its manifest records is the code that ran, and a source edited while it ran fails the step
    (Snakemake then deletes its outputs, DVC does not record them) instead of crediting them to other code."""
    from noisymlt.core.codedeps import load_code

    if command == "train" or command not in command_modules():  # the Trainer loads and checks a run's own code
        return None
    entries = step_entries(command)
    return entries, load_code(*entries)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        code = _load_step_code(args.subcommand)
        result = args.func(args)
        if code is not None:  # what it wrote is the work of the code it loaded, or it is not recorded
            from noisymlt.core.codedeps import check_unchanged

            check_unchanged(code[1], *code[0], what=f"noisymlt {args.subcommand}")
    except NoisyMLTError as exc:
        print(f"noisymlt {args.subcommand}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a folder it may not write: the file and the cause, not a traceback
        print(f"noisymlt {args.subcommand}: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"noisymlt {args.subcommand}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)

