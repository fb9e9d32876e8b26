"""Which package code a pipeline step runs: the static import closure of its entry module, and a digest.

Every ``import noisymlt...`` / ``from noisymlt... import ...`` statement of a module counts, also the ones
inside functions (the package defers heavy imports into the functions that need them). Importing
``noisymlt.a.b`` also runs ``noisymlt/__init__.py`` and ``noisymlt/a/__init__.py``. Non-Python files of the
package (the params schema) belong to the modules that name them in a string constant. Modules loaded by
name at run time (a method family, a loss) are not followed: a training run adds them itself, so a run
depends on its own family and losses and on no other.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path

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
def imports_of(name: str) -> frozenset[str]:
    """The package modules that module ``name`` imports anywhere in its code (and their parent packages)."""
    known = modules()
    tree = ast.parse(known[name].read_text(), filename=str(known[name]))
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
def data_files(name: str) -> tuple[Path, ...]:
    """Non-Python package files named (by file name) in a string constant of module ``name``."""
    tree = ast.parse(modules()[name].read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    files = [p for p in sorted(ROOT.rglob("*")) if p.is_file() and p.suffix not in (".py", ".pyc")
             and "__pycache__" not in p.parts]
    return tuple(p for p in files if p.name in strings)


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
