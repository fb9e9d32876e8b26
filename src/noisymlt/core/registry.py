"""Registries read from the source: a module of a package names what it provides in its own code, and the
package's registry finds those names without importing anything (so it stays torch-free for params checks).
Adding a loss, a method family, a dataset kind or a noise model is then adding its module."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Iterable
from pathlib import Path

from noisymlt.errors import NoisyMLTError


def registered(package_init: str, package: str, names: Callable[[ast.Module], Iterable[str]],
               what: str, marker: str) -> dict[str, str]:
    """Name -> module for every module of ``package`` (beside ``package_init``, its ``__init__.py``) and every
    name that ``names`` finds in that module's syntax tree; a name found twice is refused. Only modules whose
    text holds ``marker`` are parsed (every process that checks params reads the registries: parsing the
    package's other modules too cost about 20 ms)."""
    found: dict[str, str] = {}
    for path in sorted(Path(package_init).parent.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        text = path.read_text()
        if marker not in text:
            continue
        module = f"{package}.{path.stem}"
        try:
            listed = names(ast.parse(text, filename=str(path)))
        except NoisyMLTError as exc:
            raise NoisyMLTError(f"{path}: {exc}") from exc
        for name in listed:
            if name in found:
                raise NoisyMLTError(f"{what} {name!r} is registered by {found[name]} and {module}")
            found[name] = module
    return found


def decorated_classes(package_init: str, package: str, decorator: str, what: str) -> dict[str, str]:
    """Name -> module for every ``@decorator("name")`` class decorator in the modules of ``package``: the registry
    of method families, dataset kinds and noise models."""
    def names(tree: ast.Module) -> list[str]:
        return [deco.args[0].value for node in tree.body if isinstance(node, ast.ClassDef)
                for deco in node.decorator_list
                if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == decorator
                and deco.args and isinstance(deco.args[0], ast.Constant)]

    return registered(package_init, package, names, what, marker=f"@{decorator}(")


def import_registered(modules: dict[str, str], name: str, what: str) -> None:
    """Import the module that registers ``name`` (it registers itself on import); an unknown name is refused with
    the known ones."""
    if name not in modules:
        raise NoisyMLTError(f"unknown {what} {name!r}; known: {', '.join(sorted(modules))}")
    importlib.import_module(modules[name])
