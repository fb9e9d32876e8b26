"""The manual's "Add a method" page (docs/add-a-method.md), followed to the letter in a copy of the project, is all
it takes.

The test reads the page's code blocks: each Python block names its file on its first line and is written
there; each YAML block is a method block, put under `methods:` in params.yaml as the page says. Then each new
method runs once through Snakemake with the demo profile, its command taken from the page. Nothing else is
edited: a registry, schema or list that still had to be told about the new loss or family fails the run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import SNAKEMAKE, blocks, commands as page_commands, copy_build, page

REPO = Path(__file__).resolve().parents[1]


PAGE = REPO / "docs" / "add-a-method.md"


@pytest.mark.slow
def test_the_readme_adds_a_loss_and_a_family_and_nothing_else(tmp_path, demo_pretrained):
    if not SNAKEMAKE.exists():
        pytest.skip(f"snakemake is not installed next to {sys.executable}")
    text = page(PAGE, "Add a method")
    modules, methods = blocks(text, "python"), blocks(text, "yaml")
    commands = [line for line in page_commands(text) if "snakemake" in line]
    assert len(modules) == 2 and len(methods) == 2 and len(commands) == 1, "the page's shape changed"
    root = copy_build(demo_pretrained, tmp_path / "project")  # the project, the demo's backbone made (conftest)

    for module in modules:
        path = module.splitlines()[0].removeprefix("# ").strip()
        assert path.startswith("src/noisymlt/") and not (root / path).exists(), path
        (root / path).write_text(module)
    params = (root / "params.yaml").read_text()
    assert params.count("\nmethods:\n") == 1
    names = [re.match(r"  (\w+):\n", block).group(1) for block in methods]
    (root / "params.yaml").write_text(params.replace("\nmethods:\n", "\nmethods:\n" + "".join(methods), 1))

    target = commands[0].split()[-1]  # runs/toy/g0.5/s0/asl/metrics.json
    targets = [target.replace(f"/{names[0]}/", f"/{name}/") for name in names]
    command = [str(SNAKEMAKE), *commands[0].split()[1:-1], "--cores", "2", *targets]
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONPATH": str(root / "src"),
           "HOME": str(tmp_path)}
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]

    for name, target in zip(names, targets):
        metrics = json.loads((root / target).read_text())
        assert np.isfinite(metrics["heads"]["main"]["map"]["total"]), name
        manifest = json.loads((root / Path(target).parent / "manifest.json").read_text())
        assert manifest["run"]["method"] == name
        modules_run = set(manifest["code_modules"])
        if name == names[0]:  # the new loss is this run's code, and no other loss is
            assert "noisymlt.losses.asymmetric" in modules_run
            assert not modules_run & {"noisymlt.losses.db", "noisymlt.losses.focal", "noisymlt.losses.ldam"}
        else:  # the new family is this run's code
            assert "noisymlt.methods.weight_average" in modules_run
    # what the page says about the registries holds in the copy
    check = ("from noisymlt.losses import LOSSES; from noisymlt.methods import FAMILY_MODULES; "
             "print(LOSSES['asl'], FAMILY_MODULES['weight_average'])")
    out = subprocess.run([sys.executable, "-c", check], cwd=root, env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["noisymlt.losses.asymmetric", "noisymlt.methods.weight_average"], out.stderr
