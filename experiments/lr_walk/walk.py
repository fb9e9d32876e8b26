#!/usr/bin/env python
"""The learning rate's walk, measured: which of the package's functions the lr passes through on its way from the
rule's resolved configuration to the optimizer, in how many files, and how many of those calls climb to a higher
layer (.importlinter's order).

One run on a project's data, traced in-process with ``sys.setprofile``: the lr is set to a value no other setting
holds (in the method's params block, or with --selected in a model selection's choice file), the run config is
resolved as the train rule's param does (``requested_config``), written to a file as the rule's shell does, and
``noisymlt train --run-config`` trains it for one iteration with the files the train rule names. A function
*receives* the lr when the value is among its arguments or in what it returns (searched through dicts, lists, tuples
and text, not through objects' attributes, so that a method of an object that merely holds the config does not),
or when it calls one that receives it among its arguments (it held the value to hand it on). The *walk* is the
receivers on the call stack at each arrival (the rule's text made by ``config_text``, torch's ``SGD`` receiving the
lr, each step's rate ``lr_at`` computes in the training loop), and the functions that returned the value to one of
them; a *climb* is a call on the walk whose callee's layer is above its caller's. The rule's own function
(``final_run_config`` in the workflow) calls ``requested_config`` and is counted as the first stop.

    python experiments/lr_walk/walk.py --project DEMO --src SRC --out result.json

DEMO: a project whose demo data phase has run; SRC: the package source to trace (this tree's, or an older
commit's ``src`` to compare). experiments/lr_walk/README.md has the readings.
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SENTINEL = 0.0123456789  # no other setting of the demo holds this number


def holds(value, depth: int = 0) -> bool:
    if isinstance(value, float):
        return value == SENTINEL
    if depth > 8:
        return False
    if isinstance(value, dict):
        return any(holds(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(holds(v, depth + 1) for v in value)
    if isinstance(value, str):
        return repr(SENTINEL) in value
    return False


def layers(repo: Path) -> list[str]:
    parser = configparser.ConfigParser()
    parser.read(repo / ".importlinter")
    return parser["importlinter:contract:layers"]["layers"].split()


class Walk:
    def __init__(self, src: Path, order: list[str]):
        self.src, self.order = str(src.resolve()), order
        self.stops: dict[str, None] = {}  # every receiver ("FILE:FUNCTION"), in order
        self.paths: list[list[str]] = []
        self.stack: list[tuple[str | None, bool]] = []  # (name if in the package, holds the value)
        self.built = False  # torch's SGD has received the lr
        self.first: dict[str, int] = {}  # every package function, in the order of its first call
        self.made: dict[str, set] = {}  # a function that returned the value -> the package functions it returned to

    def path(self) -> list[str]:
        """The stops on the call stack at each arrival, and the functions that made what one of them received."""
        on = list(dict.fromkeys(s for p in self.paths for s in p))
        grew = True
        while grew:
            extra = [f for f, to in self.made.items() if f not in on and to & set(on)]
            on += extra
            grew = bool(extra)
        return sorted(on, key=self.first.get)

    def name(self, frame) -> str | None:
        path = frame.f_code.co_filename
        if not path.startswith(self.src):
            return None
        qualname = frame.f_code.co_qualname
        for inner in (".<locals>.<listcomp>", ".<locals>.<dictcomp>", ".<locals>.<setcomp>", ".<locals>.<genexpr>"):
            qualname = qualname.removesuffix(inner)  # a comprehension is a line of its function, not a stop
        return f"{os.path.relpath(path, self.src)}:{qualname}"

    def __call__(self, frame, event, arg):
        if event == "call":
            own = self.name(frame)
            if own:
                self.first.setdefault(own, len(self.first))
            code = frame.f_code
            names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            got = holds([frame.f_locals[k] for k in names if k in frame.f_locals and k != "self"])
            if got:
                self.mark_caller()
            self.stack.append((own, got))
            if got and own:
                self.stops[own] = None
            if got and own is None and code.co_qualname == "SGD.__init__":
                self.arrive()
                self.built = True
        elif event == "return" and self.stack:
            own, got = self.stack[-1]
            if own and holds(arg):  # it made the value (or a config holding it) for its caller
                self.stops[own] = None
                receiver = next((o for o, _ in reversed(self.stack[:-1]) if o), None)
                self.made.setdefault(own, set()).add(receiver)
            if own and not self.built and own.endswith(":config_text"):
                self.stack[-1] = (own, True)
                self.arrive()  # the text the rule's shell writes to requested_config.json
            if own and own.endswith(":lr_at") and any(o and o.endswith("._fit") for o, _ in self.stack):
                self.stack[-1] = (own, True)
                self.arrive()  # a training step's rate, which the loop sets on the optimizer's groups
            self.stack.pop()

    def mark_caller(self):
        """The nearest package frame under the one called held the value, to hand it on."""
        for i in range(len(self.stack) - 1, -1, -1):
            own, got = self.stack[i]
            if own:
                self.stack[i] = (own, True)
                self.stops[own] = None
                return

    def arrive(self):
        self.paths.append([own for own, got in self.stack if own and got])

    def layer(self, stop: str) -> int:
        module = stop.split(":")[0].split(os.sep)
        top = module[1].removesuffix(".py") if module[0] == "noisymlt" else module[0]
        return self.order.index(top) if top in self.order else -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--project", required=True, type=Path, help="a project whose data phase has run")
    ap.add_argument("--src", required=True, type=Path, help="the package source folder to trace (its src/)")
    ap.add_argument("--layer", nargs="*", default=["workflow/profiles/demo/params.yaml"],
                    help="params files over params.yaml, as the run's profile layers them (default: the demo's)")
    ap.add_argument("--dataset", default="toy")
    ap.add_argument("--method", default="erm")
    ap.add_argument("--gamma", type=float, default=0.9, help="a noise rate whose noisy set (seed --seed) exists")
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--selected", action="store_true",
                    help="the lr comes from a model selection's choice file (the method's selection must choose lr)")
    ap.add_argument("--out", type=Path, help="JSON to write (default: print)")
    args = ap.parse_args()
    src = args.src.resolve()
    sys.path.insert(0, str(src))
    os.chdir(args.project)
    from noisymlt.config import load_params
    try:
        from noisymlt.config import requested_config
    except ImportError:  # before issue 71 it lived in pipeline.paths
        from noisymlt.pipeline.paths import requested_config
    from noisymlt.cli import main as cli
    from noisymlt.pipeline import layout, paths

    params = load_params("params.yaml", *args.layer)
    block = params["methods"][args.method].setdefault("train", {})
    block.update(epochs=1, max_iters_per_epoch=1, warmup_iters=1, lr_steps=[])  # one step: the walk, not the run
    walk = Walk(src, layers(src.parent))
    with tempfile.TemporaryDirectory() as tmp:
        choice = None
        if args.selected:
            choice = Path(tmp) / "choice.json"
            choice.write_text(json.dumps({"chosen": {"lr": SENTINEL}}))
        else:
            block["lr"] = SENTINEL
        sys.setprofile(walk)
        text = requested_config(params, args.dataset, args.method, args.gamma, args.seed, choice and str(choice))
        sys.setprofile(None)
        resolved = json.loads(text)
        assert resolved["train"]["lr"] == SENTINEL, "the lr did not reach the run config"
        run_config = Path(tmp) / "requested_config.json"
        run_config.write_text(text + "\n")
        name = args.dataset  # the files as the train rule names them
        argv = ["train", "--run-config", str(run_config),
                "--train-labels", layout.fill(layout.NOISY, dataset=name, gamma=args.gamma, seed=args.seed),
                "--test-labels", layout.fill(layout.TEST_LABELS, dataset=name),
                "--split", layout.fill(layout.CLASS_SPLIT, dataset=name),
                "--train-images", paths.image_root(params, name, "train"),
                "--test-images", paths.image_root(params, name, "test"),
                *paths.cache_args(name, resolved["train"].get("loader", "pil")),
                "--out", str(Path(tmp) / "run"), "--no-progress", "--device", "cpu", "--cores", "1"]
        sys.setprofile(walk)
        try:
            if cli(argv):
                raise SystemExit("the traced training run failed")
        finally:
            sys.setprofile(None)
    path = ["workflow/rules/common.smk:final_run_config", *walk.path()]
    calls = [(caller, callee) for p in walk.paths for caller, callee in zip(p, p[1:])]
    calls += [(to, made) for made, tos in walk.made.items() if made in path for to in tos if to in path]
    climbs = [f"{caller} -> {callee}" for caller, callee in calls if walk.layer(callee) < walk.layer(caller)]
    result = {
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True).stdout.strip(),
        "run": {"dataset": args.dataset, "method": args.method, "gamma": args.gamma, "seed": args.seed,
                "lr_from": "a selection's choice file" if args.selected else f"methods.{args.method}.train.lr"},
        "path": {"stops": len(path), "files": len({s.split(':')[0] for s in path}),
                 "climbs": len(dict.fromkeys(climbs)), "functions": path, "climb_calls": list(dict.fromkeys(climbs))},
        "every_receiver": {"stops": len(walk.stops) + 1, "files": len({s.split(":")[0] for s in walk.stops}) + 1,
                           "functions": ["workflow/rules/common.smk:final_run_config",
                                         *sorted(walk.stops, key=walk.first.get)]},
    }
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
