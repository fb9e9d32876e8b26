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
import importlib
import marshal
import os
import sys
import tempfile
import zlib
from functools import lru_cache
from pathlib import Path

from noisymlt.errors import NoisyMLTError

PACKAGE = "noisymlt"
ROOT = Path(__file__).resolve().parents[1]  # the package: this module is in noisymlt/core
# What `python -m noisymlt <command>` always runs before the command's own module (the CLI reads the command
# table, noisymlt.commands, to find that module).
CLI = ("noisymlt", "noisymlt.__main__", "noisymlt.cli", "noisymlt.commands", "noisymlt.errors")
# The module that turns a training run's resolved configuration and inputs into its result (the Trainer).
TRAINER = "noisymlt.training.trainer"


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


def _source(data: bytes) -> str:
    """A file's text as ``Path.read_text`` gives it (UTF-8, universal newlines)."""
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


@lru_cache(maxsize=None)
def _tree(name: str) -> ast.Module:
    """Module ``name``'s syntax tree (for the tests that read it)."""
    path = modules()[name]
    return ast.parse(_source(path.read_bytes()), filename=str(path))


def _read_facts(tree: ast.Module) -> dict:
    """What this module needs of a file's syntax tree, from one walk: the names its import statements may load
    (absolute ones), its string constants (they name data files) and its code text (``code_text``)."""
    targets, strings = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from noisymlt.a import b`: b may be a submodule or a name defined in noisymlt.a
            targets.extend([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
    return {"targets": targets, "strings": sorted(strings), "code": _canonical(tree)}


# Parsing, walking and rendering every package file costs each process (a Snakemake run, the preload server, a
# job) about 0.7 CPU s; their facts are kept beside the bytecode, under the sha256 of the file's bytes, this
# module's own bytes (an edit here may read files differently) and the Python version (its syntax trees and
# marshal's format). Compressed: the source's text in them would otherwise turn up in a search of the sources.
FACTS_DIR = ROOT / "__pycache__" / "codedeps"
_READER = hashlib.sha256(Path(__file__).read_bytes() + sys.version.encode()).hexdigest()[:16]


@lru_cache(maxsize=1024)
def _facts_of(path: str, size: int, mtime_ns: int) -> dict:
    data = Path(path).read_bytes()
    kept = FACTS_DIR / f"{hashlib.sha256(data).hexdigest()}-{_READER}.facts"
    try:
        facts = marshal.loads(zlib.decompress(kept.read_bytes()))
        if isinstance(facts, dict) and set(facts) == {"targets", "strings", "code"}:
            return facts
    except (OSError, ValueError, EOFError, TypeError, zlib.error):
        pass  # not kept yet, or unreadable: read the file
    facts = _read_facts(ast.parse(_source(data), filename=path))
    try:  # a cache: a folder that cannot be written only costs the time
        FACTS_DIR.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=FACTS_DIR, suffix=".tmp")
    except OSError:
        return facts
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(zlib.compress(marshal.dumps(facts), 1))
        os.replace(tmp, kept)  # whole or not at all, beside other processes doing the same
    except OSError:
        Path(tmp).unlink(missing_ok=True)
    return facts


@lru_cache(maxsize=None)
def _facts(name: str) -> dict:
    """Module ``name``'s facts as this process first read them (the import graph is the process's)."""
    st = modules()[name].stat()
    return _facts_of(str(modules()[name]), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=None)
def imports_of(name: str) -> frozenset[str]:
    """The package modules that module ``name`` imports anywhere in its code (and their parent packages)."""
    known = modules()
    found: set[str] = set()
    for target in _facts(name)["targets"]:
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
    strings = set(_facts(name)["strings"])
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


def code_text(path: Path) -> bytes:
    """What of a package file can change a result: a module's syntax tree without comments, docstrings,
    layout or line numbers (so rewording or reflowing retrains nothing); a data file's bytes. Read again
    whenever the file's size or modification time differ from the last reading."""
    st = Path(path).stat()
    return _code_text(str(path), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=1024)
def _code_text(path: str, size: int, mtime_ns: int) -> bytes:
    if not path.endswith(".py"):
        return Path(path).read_bytes()
    return _facts_of(path, size, mtime_ns)["code"].encode()


# The nodes whose body may open with a docstring: text for readers, which no result reads.
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:] or [ast.Pass()]
    return body


def _canonical(node) -> str:
    """A syntax tree as text: node types and their non-empty fields, without positions or docstrings. Empty fields
    are left out so that a Python release that adds one (3.12's type_params) does not change every digest."""
    if isinstance(node, ast.AST):
        documented = isinstance(node, _DOCUMENTED)
        fields = []
        for name in node._fields:
            value = getattr(node, name, None)
            if documented and name == "body":
                value = _without_docstring(value)
            if value is not None and value != []:
                fields.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({' '.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    return repr(node)


def fresh_digest(*entries: str) -> str:
    """sha256 (16 hex digits) over the relative paths and ``code_text`` of ``files(*entries)``, read from
    disk now. The import graph is the process's (its structure rarely changes; a new import changes the
    importing module's text, so the digest still moves)."""
    h = hashlib.sha256()
    for path in files(*entries):
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + code_text(path) + b"\0")
    return h.hexdigest()[:16]


@lru_cache(maxsize=None)  # read once per process: what a job records is the code it loaded (see load_code)
def digest(*entries: str) -> str:
    """``fresh_digest(*entries)``, taken the first time a process asks: a job asks when it starts."""
    return fresh_digest(*entries)


# Set by the preload server in the jobs it forks (noisymlt.pipeline.preload), whose modules the server imported before the
# job read its digest: raises if the source has changed since that import, so the digest names what runs.
loaded_check = None


def load_code(*entries: str) -> str:
    """Import every module of the closure of ``entries`` now and return their digest: from here on the job
    runs the code this digest names, whatever is edited on disk later (imports deferred into functions
    would otherwise load a later version). ``check_unchanged`` tells, at the end, whether the disk still
    holds it."""
    value = digest(*entries)
    for name in closure(*entries):
        importlib.import_module(name)
    if loaded_check is not None:
        loaded_check()
    return value


def check_unchanged(ran: str, *entries: str, what: str) -> None:
    """Raise when the package source of ``entries`` on disk no longer gives ``ran``, the digest of the code
    the job loaded: its result would be recorded under code that did not make it."""
    now = fresh_digest(*entries)
    if now != ran:
        raise NoisyMLTError(
            f"{what}: the package source changed while this job ran (it ran code {ran}, the files on disk now "
            f"give {now}); its result is not recorded. Run it again: it trains with the code on disk")


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
