"""The code of each pipeline step (the `code-deps` command): what a job's code param holds.

A step's code is the static import closure (noisymlt.core.codedeps) of the `noisymlt` CLI and the module that
registers its command, as the command table (noisymlt.commands) names it: read here as data, so this module imports
neither the CLI nor any other command's module. A training run's code is its trainer, family and losses
(``noisymlt.methods.run_entries``); a noisy set's, its command and its noise model's module (``noise_entries``).
"""

from __future__ import annotations

import argparse
import json

from noisymlt.commands import COMMANDS, step_entries
from noisymlt.errors import NoisyMLTError
from noisymlt.core.codedeps import closure, code_text, data_files, digest, imports_of, modules
from noisymlt.methods import run_entries


def warm() -> None:
    """Read the whole import graph and every file's code text now (what a step's digest and manifest need; about
    a CPU second): the preload server does it once, after its parser has imported every command's module, and the
    jobs it forks inherit it (a train job saved ~0.1 s of parsing). A job still stats each file: ``code_text`` is
    keyed by its size and modification time, and the server takes no job once a file has changed."""
    for name, path in modules().items():
        imports_of(name)
        for file in (path, *data_files(name)):
            code_text(file)


def step_digest(command: str) -> str:
    return digest(*step_entries(command))


def noise_entries(model: str) -> tuple[str, ...]:
    """What a noisy set of ``model`` runs: its command (``noisymlt noise``, or [CL]'s reader) and the model's module,
    which the command imports by name: its own digest, so a new or edited model reruns its own sets only."""
    from noisymlt.data.noise_models import NOISE_MODULES, noise_model

    return (*step_entries(noise_model(model).command), NOISE_MODULES[model])


def noise_digest(model: str) -> str:
    return digest(*noise_entries(model))


def method_entries(params: dict, method: str) -> tuple[str, ...]:
    """``run_entries`` of any run of ``method``: a run's code depends on its method block, not on its
    dataset, noise rate or seed."""
    from noisymlt.config import resolve_run

    return run_entries(resolve_run(params, next(iter(params["datasets"])), method, 0.5, 0))


def digests(params: dict) -> dict[str, str]:
    """Every pipeline command's digest, one per method for training (``train/METHOD``) and one per noise model for
    its noisy sets (``noise/MODEL``)."""
    from noisymlt.data.noise_models import NOISE_MODULES

    out = {command: step_digest(command) for command in sorted(COMMANDS)}
    out.update({f"noise/{model}": noise_digest(model) for model in sorted(NOISE_MODULES)})
    for method in sorted(params["methods"]):
        out[f"train/{method}"] = digest(*method_entries(params, method))
    return out


def _cmd(args: argparse.Namespace) -> int:
    from noisymlt.config import load_params

    if args.digests:
        print(json.dumps(digests(load_params(*args.params)), indent=1, sort_keys=True))
        return 0
    if args.method:
        entries = method_entries(load_params(*args.params), args.method)
    else:
        try:
            entries = step_entries(args.command)
        except ValueError as exc:
            raise NoisyMLTError(f"--command: {exc}") from exc
    print("\n".join(closure(*entries)))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "code-deps", help="the package modules a step runs, and their digests (what makes a step rerun)",
        description="A step's code dependency is the static import closure of its entry module (a training run: "
                    "the trainer, its method family and its losses). Snakemake passes each closure's digest to "
                    "its job as a param: a job reruns when, and only when, code it runs changes.",
    )
    p.add_argument("--params", nargs="+", default=["params.yaml"], help="params files, layered left to right")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--digests", action="store_true",
                      help="print every command's digest, one per method (train/METHOD) and noise model (noise/MODEL)")
    what.add_argument("--command", help="list the modules of this command's closure")
    what.add_argument("--method", help="list the modules of this method's training closure")
    p.set_defaults(func=_cmd)
