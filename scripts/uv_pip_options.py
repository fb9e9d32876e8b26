"""Print, for `uv pip install`, the package sources pip is configured with (pip.conf, PIP_* variables).

`make env` installs requirements.lock with uv (about a quarter of pip's time for the same pinned versions), but uv
reads no pip configuration: a machine whose packages come from a mirror or a wheel folder named only in pip.conf
would otherwise install from elsewhere or not at all. pip looks at its default index and every extra one alike, so
uv is told to as well (--index-strategy unsafe-best-match). A setting with no uv flag here (a certificate, a proxy)
makes uv fail, and the Makefile then installs with pip, which reads it.

    python scripts/uv_pip_options.py      # e.g. --find-links /srv/wheels --extra-index-url file:///srv/simple
"""

from __future__ import annotations

import ast
import subprocess
import sys

# pip option (as `pip config list` names it, after its section) -> uv flag; values are whitespace-separated lists
FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraints"}


def pip_settings() -> dict[str, list[str]]:
    """pip's effective settings, every section (global, install, the PIP_* variables) merged in pip's own order."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         check=True).stdout
    settings: dict[str, list[str]] = {}
    for line in out.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            settings[name.rpartition(".")[2]] = str(ast.literal_eval(value)).split()
    return settings


def uv_options(settings: dict[str, list[str]]) -> list[str]:
    options = ["--index-strategy", "unsafe-best-match"]
    for key, flag in FLAGS.items():
        for value in settings.get(key, []):
            options += [flag, value]
    if (settings.get("no-index") or ["false"])[0].lower() in {"1", "true", "yes", "on"}:  # an empty value: unset
        options.append("--no-index")
    return options


if __name__ == "__main__":
    print(" ".join(uv_options(pip_settings())))
