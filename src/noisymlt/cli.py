"""The `noisymlt` command. Every workflow rule calls one of these subcommands.

Each command lives in the module that does the work and registers itself through ``add_cli``; the command table
(noisymlt.commands) names that module, and the parser imports it by name. Modules keep heavy imports (torch,
pycocotools) inside their functions so ``--help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from noisymlt import __version__
from noisymlt.commands import COMMANDS, command_modules, step_entries
from noisymlt.core.heap import keep_freed_memory
from noisymlt.errors import NoisyMLTError, describe_os_error


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="noisymlt",
        description=(
            "Noisy multi-label long-tailed recognition pipeline (VOC-MLT-Noise, COCO-MLT-Noise). "
            "Each subcommand is one pipeline step; Snakemake's rules call them in order: "
            "download -> parse -> longtail -> cache-images -> noise -> train -> evaluate -> aggregate -> table."
        ),
    )
    parser.add_argument("--version", action="version", version=f"noisymlt {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND")  # not "command": code-deps has --command
    for name in command_modules():
        importlib.import_module(name).add_cli(sub)
    return parser


def _load_step_code(command: str) -> tuple[tuple[str, ...], str] | None:
    """The step's code (the CLI and its command's module: noisymlt.pipeline.step_code), loaded now with its digest: the
    digest its manifest records is the code that ran, and a source edited while it ran fails the step
    (Snakemake then deletes its outputs, DVC does not record them) instead of crediting them to other code."""
    from noisymlt.core.codedeps import load_code

    if command == "train" or command not in COMMANDS:  # the Trainer loads and checks a run's own code
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
    keep_freed_memory()  # before the step allocates (noisymlt.core.heap)
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

