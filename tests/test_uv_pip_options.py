"""scripts/uv_pip_options.py: `make env`'s uv install gets the package sources pip is configured with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "uv_pip_options.py"


def _options(tmp_path: Path, conf: str, **env: str) -> list[str]:
    (tmp_path / "pip.conf").write_text(conf)
    # only this file: no PIP_* variable of the caller, no site (XDG_CONFIG_DIRS) or user (HOME) configuration
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    clean.update(PIP_CONFIG_FILE=str(tmp_path / "pip.conf"), XDG_CONFIG_DIRS=str(tmp_path / "site"),
                 XDG_CONFIG_HOME=str(tmp_path / "user"), HOME=str(tmp_path), **env)
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True, env=clean)
    return out.stdout.split()


def test_every_source_of_pip_conf_and_pip_variables_becomes_a_uv_flag(tmp_path: Path) -> None:
    conf = ("[global]\nindex-url = https://mirror.example/simple\n"
            "extra-index-url = file:///srv/a/simple file:///srv/b/simple\nfind-links = /srv/wheels\n"
            "[install]\nconstraint = /srv/caps.txt\n")
    options = _options(tmp_path, conf, PIP_NO_INDEX="1")
    pairs = list(zip(options[:-1], options[1:]))
    assert ("--index-strategy", "unsafe-best-match") in pairs  # pip weighs every index alike
    assert ("--index-url", "https://mirror.example/simple") in pairs
    for extra in ("file:///srv/a/simple", "file:///srv/b/simple"):
        assert ("--extra-index-url", extra) in pairs
    assert ("--find-links", "/srv/wheels") in pairs and ("--constraints", "/srv/caps.txt") in pairs
    assert options[-1] == "--no-index"


def test_without_configuration_uv_keeps_its_defaults(tmp_path: Path) -> None:
    assert _options(tmp_path, "") == ["--index-strategy", "unsafe-best-match"]
