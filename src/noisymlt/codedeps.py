"""Which package code a pipeline step runs: the static import closure of its entry module, and a digest.

Every ``import noisymlt...`` / ``from noisymlt... import ...`` statement of a module counts, also the ones
inside functions (the package defers heavy imports into the functions that need them). Importing
``noisymlt.a.b`` also runs ``noisymlt/__init__.py`` and ``noisymlt/a/__init__.py``. Non-Python files of the
package (the params schema) belong to the modules that name them in a string constant. Modules loaded by
name at run time (a method family, a loss) are not followed: a training run adds them itself, so a run
depends on its own family and losses and on no other.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib
import json
from functools import lru_cache
from pathlib import Path

from noisymlt.errors import NoisyMLTError

PACKAGE = "noisymlt"
ROOT = Path(__file__).resolve().parent
# What `python -m noisymlt <command>` always runs before the command's own module.
CLI = ("noisymlt", "noisymlt.__main__", "noisymlt.cli", "noisymlt.errors")


@lru_cache(maxsize=None)
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its __init__.py)."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@lru_cache(maxsize=None)
def _tree(name: str) -> ast.Module:
    """Module ``name``'s syntax tree, parsed once per process (imports and data files both read it)."""
    path = modules()[name]
    return ast.parse(path.read_text(), filename=str(path))


@lru_cache(maxsize=None)
def imports_of(name: str) -> frozenset[str]:
    """The package modules that module ``name`` imports anywhere in its code (and their parent packages)."""
    known = modules()
    tree = _tree(name)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from noisymlt.a import b`: b may be a submodule or a name defined in noisymlt.a
            targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            if target.split(".")[0] == PACKAGE and target in known:
                found.add(target)
                found.update(p for p in _parents(target) if p in known)
    found.discard(name)
    return frozenset(found)


@lru_cache(maxsize=None)
def _package_data() -> tuple[Path, ...]:
    """The package's non-Python files (the params schema), listed once."""
    return tuple(p for p in sorted(ROOT.rglob("*")) if p.is_file() and p.suffix not in (".py", ".pyc")
                 and "__pycache__" not in p.parts)


@lru_cache(maxsize=None)
def data_files(name: str) -> tuple[Path, ...]:
    """Non-Python package files named (by file name) in a string constant of module ``name``."""
    strings = {n.value for n in ast.walk(_tree(name)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return tuple(p for p in _package_data() if p.name in strings)


def closure(*entries: str) -> list[str]:
    """Sorted module names reachable from ``entries`` (included) through imports."""
    known = modules()
    unknown = [e for e in entries if e not in known]
    if unknown:
        raise ValueError(f"not modules of {PACKAGE}: {unknown}")
    seen: set[str] = set()
    todo = [*entries, *(p for e in entries for p in _parents(e) if p in known)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports_of(name) - seen)
    return sorted(seen)


def files(*entries: str) -> list[Path]:
    """The source and data files of the closure of ``entries``."""
    out = set()
    for name in closure(*entries):
        out.add(modules()[name])
        out.update(data_files(name))
    return sorted(out)


def warm() -> None:
    """Read the whole import graph and every command's module now (what a step's manifest needs; ~0.5 CPU s):
    the preload server does it once, and the jobs it forks inherit it. The file contents are still read and
    hashed by ``digest`` in each job."""
    command_modules()
    for name in modules():
        imports_of(name)
        data_files(name)


@lru_cache(maxsize=None)  # like the import graph above, read once per process: the code does not change under it
def digest(*entries: str) -> str:
    """sha256 (16 hex digits) over the relative paths and contents of ``files(*entries)``."""
    h = hashlib.sha256()
    for path in files(*entries):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cycles() -> list[list[str]]:
    """Import cycles among the package's modules (each as a list of module names), for the tests."""
    graph = {name: imports_of(name) - set(_parents(name)) for name in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


# ---------------------------------------------------------------------------------------- per pipeline step

@lru_cache(maxsize=None)
def command_modules() -> dict[str, str]:
    """Pipeline command -> the module that registers it (each command module's ``add_cli``, run here)."""
    from noisymlt.cli import COMMAND_MODULES

    out = {}
    for name in COMMAND_MODULES:
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).add_cli(sub)
        out.update({command: name for command in sub.choices})
    return out


def step_entries(command: str) -> tuple[str, ...]:
    """What `python -m noisymlt COMMAND` runs: the CLI and the command's module."""
    modules_of = command_modules()
    if command not in modules_of:
        raise ValueError(f"unknown command {command!r}; known: {', '.join(sorted(modules_of))}")
    return (*CLI, modules_of[command])


def step_digest(command: str) -> str:
    return digest(*step_entries(command))


def run_entries(resolved: dict) -> tuple[str, ...]:
    """A training run: the generic trainer, its method's family module and the modules of the losses
    it trains with (both loaded by name at run time, hence not in the trainer's own closure)."""
    from noisymlt.config import method_options
    from noisymlt.losses import LOSSES
    from noisymlt.methods import FAMILY_MODULES
    from noisymlt.methods.options import losses_used

    family = resolved["method_cfg"]["family"]
    losses = losses_used(family, method_options(resolved["method_cfg"]))
    return (*step_entries("train"), FAMILY_MODULES[family], *sorted({LOSSES[name] for name in losses}))


def run_digest(resolved: dict) -> str:
    return digest(*run_entries(resolved))


def method_entries(params: dict, method: str) -> tuple[str, ...]:
    """``run_entries`` of any run of ``method``: a run's code depends on its method block, not on its
    dataset, noise rate or seed."""
    from noisymlt.config import resolve_run

    return run_entries(resolve_run(params, next(iter(params["datasets"])), method, 0.5, 0))


def digests(params: dict) -> dict[str, str]:
    """Every pipeline command's digest, and one per method for training (``train/METHOD``)."""
    out = {command: step_digest(command) for command in sorted(command_modules())}
    for method in sorted(params["methods"]):
        out[f"train/{method}"] = digest(*method_entries(params, method))
    return out


def write_digests(params: dict, out_dir: Path) -> list[Path]:
    """One small file per digest (DVC stages depend on their own file); files whose digest did not
    change are left untouched, and stale ones removed."""
    out_dir = Path(out_dir)
    written = []
    for key, value in digests(params).items():
        path = out_dir / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"step": key, "code_digest": value}) + "\n"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    for stale in set(out_dir.rglob("*.json")) - set(written):
        stale.unlink()
    return written


def _cmd(args: argparse.Namespace) -> int:
    from noisymlt.config import json_object_arg, load_params, validate_params

    if args.params_json:  # Snakemake's config, layered in memory (it names no params file)
        params = json_object_arg(args.params_json, "--params-json")
        validate_params(params, source="--params-json")
    else:
        params = load_params(*args.params)
    if args.out:
        paths = write_digests(params, Path(args.out))
        print(f"{args.out}: {len(paths)} code digests")
        return 0
    if args.method:
        entries = method_entries(params, args.method)
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
                    "its job as a param; DVC stages depend on the digest files that --out writes.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--params", nargs="+", default=["params.yaml"], help="params files, layered left to right")
    src.add_argument("--params-json", help="the merged params as JSON text or a JSON file (the Snakemake rule)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", help="write one digest file per command and per method (train/METHOD.json) here")
    what.add_argument("--command", help="list the modules of this command's closure")
    what.add_argument("--method", help="list the modules of this method's training closure")
    p.set_defaults(func=_cmd)
