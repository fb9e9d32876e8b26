"""Data steps and params validation import no torch; the package has no import cycle."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from noisymlt.pipeline import codedeps

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
    for entry in ("noisymlt.pipeline.config", "noisymlt.pipeline.paths", "noisymlt.data.noise", "noisymlt.data.parse",
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
from noisymlt.pipeline.config import load_params
load_params("params.yaml", "workflow/profiles/demo/params.yaml")
rc = main(["noise", "--labels", {str(tiny_toy["train"])!r}, "--gamma", "0.5", "--seed", "1",
           "--out", {str(tmp_path / "n.parquet")!r}, "--stats", {str(tmp_path / "n.json")!r}])
print(json.dumps({{"rc": rc, "loaded": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""
    repo = codedeps.ROOT.parents[1]
    proc = subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "loaded": []}
