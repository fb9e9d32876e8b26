"""The command table: each `noisymlt` subcommand and the module that registers it (its ``add_cli``).

Plain data, so that what reads it imports no command module: the CLI builds its parser from it (importing each
module then), and a step's code (noisymlt.pipeline.step_code) is the CLI and the module named here.
``tests/test_light_imports.py`` checks the table against what the modules' ``add_cli`` register, in this order
(the order of ``--help``).
"""

from __future__ import annotations

COMMANDS = {
    "make-toy": "noisymlt.data.toy",
    "download": "noisymlt.data.download",
    "fetch-asset": "noisymlt.data.download",
    "fetch-coco-images": "noisymlt.data.coco_images",
    "parse": "noisymlt.data.parse",
    "parse-folder": "noisymlt.data.folder",
    "longtail": "noisymlt.data.longtail",
    "noise": "noisymlt.data.noise",
    "authors-noise": "noisymlt.data.authors_noise",
    "cache-images": "noisymlt.data.imagecache",
    "pretrain": "noisymlt.training.pretrain",
    "convert-cl-checkpoint": "noisymlt.models.cl_checkpoint",
    "eval-cl-checkpoint": "noisymlt.training.cl_evaluate",
    "select": "noisymlt.pipeline.selection",
    "train": "noisymlt.pipeline.train",
    "crossfit": "noisymlt.pipeline.crossfit",
    "clean-labels": "noisymlt.pipeline.cleaning",
    "evaluate": "noisymlt.evaluation.evaluate",
    "inference-time": "noisymlt.report.inference_time",
    "aggregate": "noisymlt.report.aggregate",
    "table": "noisymlt.report.tables",
    "fit-table": "noisymlt.report.fit",
    "paired-table": "noisymlt.report.fit",
    "detection-table": "noisymlt.report.detection",
    "figure": "noisymlt.report.figures",
    "readme-numbers": "noisymlt.report.readme",
    "readme": "noisymlt.report.readme",
    "structure": "noisymlt.report.structure",
    "noise-figure": "noisymlt.report.noise_level",
    "pseudo-label-figure": "noisymlt.report.pseudo_labels",
    "predict": "noisymlt.inference.predict",
    "export": "noisymlt.inference.export",
    "suspects": "noisymlt.inference.suspects",
    "trace": "noisymlt.pipeline.trace",
    "code-deps": "noisymlt.pipeline.step_code",
    "preload": "noisymlt.pipeline.preload",
}


def command_modules() -> tuple[str, ...]:
    """The modules that register commands, each once, in the table's order."""
    return tuple(dict.fromkeys(COMMANDS.values()))


def step_entries(command: str) -> tuple[str, ...]:
    """What `python -m noisymlt COMMAND` runs: the CLI and the command's module (the entries of its code digest)."""
    from noisymlt.core.codedeps import CLI

    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; known: {', '.join(sorted(COMMANDS))}")
    return (*CLI, COMMANDS[command])
