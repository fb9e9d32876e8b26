"""Data steps and params validation import no torch; the package has no import cycle, and its layers
(.importlinter) hold: no module imports from a layer above its own."""

from __future__ import annotations

import ast
import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from noisymlt.core import codedeps

HEAVY = ("torch", "torchvision", "sklearn")


def test_no_import_cycles_in_the_package():
    assert codedeps.cycles() == []


def _imports_heavy_at_top(name: str) -> bool:
    tree = ast.parse(codedeps.modules()[name].read_text())
    for node in tree.body:  # module level only: imports inside functions run when the function does
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in HEAVY for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in HEAVY:
            return True
    return False


def test_data_steps_and_params_validation_reach_no_torch_module():
    for entry in ("noisymlt.config", "noisymlt.pipeline.paths", "noisymlt.data.noise", "noisymlt.data.parse",
                  "noisymlt.data.longtail", "noisymlt.data.toy", "noisymlt.report.aggregate", "noisymlt.report.tables",
                  "noisymlt.report.noise_level"):
        heavy = [m for m in codedeps.closure(entry) if _imports_heavy_at_top(m)]
        assert heavy == [], (entry, heavy)
    # the check can fail: the training code does import torch at module level
    assert _imports_heavy_at_top("noisymlt.methods.base") and _imports_heavy_at_top("noisymlt.losses.db")


def test_a_noise_step_and_params_validation_run_without_importing_torch(tiny_toy, tmp_path):
    script = f"""
import json, sys
from noisymlt.cli import main
from noisymlt.config import load_params
load_params("params.yaml", "workflow/profiles/demo/params.yaml")
rc = main(["noise", "--labels", {str(tiny_toy["train"])!r}, "--gamma", "0.5", "--seed", "1",
           "--out", {str(tmp_path / "n.parquet")!r}, "--stats", {str(tmp_path / "n.json")!r}])
print(json.dumps({{"rc": rc, "loaded": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""
    repo = codedeps.ROOT.parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "loaded": []}


REPO = codedeps.ROOT.parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _contract() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    return config


def test_the_layers_contract_names_every_part_of_the_package_and_ignores_no_import():
    contract = _contract()["importlinter:contract:layers"]
    layers = contract["layers"].split()
    top_level = {name.split(".")[1] for name in codedeps.modules() if name.count(".") >= 1}
    assert sorted(layers) == sorted(top_level)
    assert contract.getboolean("exhaustive") and "ignore_imports" not in contract


def test_lint_imports_keeps_the_layers_and_refuses_an_upward_import(tmp_path):
    ok = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "2 kept, 0 broken" in ok.stdout
    # the same package with one upward import (a data module reaching into training) breaks the layers, and a use
    # of a finished run importing a method's module breaks the second contract
    copy = tmp_path / "src"
    shutil.copytree(codedeps.ROOT, copy / "noisymlt", ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "noisymlt" / "data" / "toy.py", "a") as f:
        f.write("\n\ndef _upward():\n    from noisymlt.training import trainer  # noqa: F401\n")
    with open(copy / "noisymlt" / "inference" / "suspects.py", "a") as f:
        f.write("\n\ndef _family():\n    from noisymlt.methods import dividemix  # noqa: F401\n")
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    bad = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "noisymlt.data.toy -> noisymlt.training.trainer" in bad.stdout
    assert "noisymlt.inference.suspects -> noisymlt.methods.dividemix" in bad.stdout
    assert "0 kept, 2 broken" in bad.stdout


def test_the_command_table_is_what_the_modules_register_in_its_order():
    """noisymlt.commands is data, read without importing a command module: it must say what each module's
    ``add_cli`` registers (a command added without its entry fails here), in the order of ``--help``, and name
    every module of the package that has an ``add_cli``."""
    import argparse
    import importlib

    from noisymlt.commands import COMMANDS, command_modules

    registered = []
    for name in command_modules():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(name).add_cli(sub)
        registered += [(command, name) for command in sub.choices]
    assert registered == list(COMMANDS.items())
    with_add_cli = {name for name in codedeps.modules() if any(
        isinstance(node, ast.FunctionDef) and node.name == "add_cli" for node in codedeps._tree(name).body)}
    assert with_add_cli == set(command_modules())


def test_the_step_code_imports_neither_the_cli_nor_another_command():
    """A step's code digest reads the command table as data: no import loop through the CLI, which loads
    noisymlt.pipeline.step_code by name."""
    script = """
import json, sys
from noisymlt.pipeline import step_code
from noisymlt.commands import COMMANDS
step_code.step_digest("evaluate")
print(json.dumps(sorted(m for m in {"noisymlt.cli", *COMMANDS.values()} if m in sys.modules)))
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["noisymlt.pipeline.step_code"]
