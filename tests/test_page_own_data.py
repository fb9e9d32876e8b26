"""The manual's "Add your own data" page (docs/own-data.md), followed in copies of the project: a folder of images
and a CSV runs through the structure report and one training run, and the page's example kind module is all a new
kind takes. Then, on the same copy, the grid of the "Noise models" page (docs/noise-models.md): a second noise model
beside the paper's, through to the main table, which shows both.

The images are written as the page describes them (a folder and a labels table: helpers.write_folder); every other
file the runs need comes from the page's blocks: the params layer, the commands, the kind module and its dataset block.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from noisymlt.data.labels import read_labels
from helpers import (BIN, OWN_DATA_CLASSES as CLASSES, SNAKEMAKE, blocks, commands, copy_build, page, project_copy,
                     run_line as run, tool_env as _env)

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "own-data.md"
NOISE_PAGE = REPO / "docs" / "noise-models.md"


@pytest.mark.slow
def test_a_folder_dataset_runs_as_the_page_says(tmp_path, own_data_runs):
    if not SNAKEMAKE.exists():
        pytest.skip(f"snakemake is not installed next to {sys.executable}")
    text = page(PAGE, "Add your own data")
    (smk,) = commands(text)
    assert smk.startswith("snakemake "), "the page's command changed"

    # the page's project after its command (conftest.own_data_runs: its data made first, then the command whole)
    root = copy_build(own_data_runs, tmp_path / "smk")
    assert "Nothing to be done" in run(smk.replace("snakemake ", "snakemake -n ", 1), root)  # finished, as named
    md = (root / "reports/structure_mydata.md").read_text()
    train, test = (read_labels(root / f"data/mydata/{part}_labels.parquet") for part in ("train", "test"))
    assert len(train) + len(test) == 400 and len(test) / 400 == pytest.approx(0.25, abs=0.02)  # test_fraction
    assert f"({len(train)} images, 4 classes)" in md and f"({len(test)} images)" in md, md[:600]
    split = json.loads((root / "data/mydata/class_split.json").read_text())
    assert sorted(i for g in split.values() for i in g) == [0, 1, 2, 3]
    metrics = json.loads((root / "runs/mydata/g0.5/s0/erm/metrics.json").read_text())
    assert metrics["classes"] == CLASSES and metrics["num_test_images"] == len(test)
    assert 0.0 < metrics["heads"]["main"]["map"]["total"] <= 1.0
    noisy = root / "data/mydata/noisy/g0.5_s0.parquet"
    paper_set = noisy.read_bytes()

    # then docs/noise-models.md on the same copy: its layer adds the uniform model, and the main table shows both
    noise_page = page(NOISE_PAGE, "Noise models")
    layer = blocks(noise_page, "yaml")[0]
    assert layer.startswith("# noise.yaml\n") and "noise_models: [cooccurrence, uniform]" in layer
    smk_noise = commands(noise_page)[0]
    assert "mydata.yaml noise.yaml" in smk_noise
    (root / "noise.yaml").write_text(layer)
    run(smk_noise, root)
    shown = blocks(noise_page, "text")[-1].splitlines()
    table = (root / "reports/table_total.md").read_text()
    assert table.startswith(shown[0] + "\n") and shown[-1] in table, table  # as the page shows it
    rows = [line for line in table.splitlines() if line.startswith("| ERM |")]
    assert len(rows) == 1 and rows[0].count("|") == 4  # one ERM cell per model
    cells = json.loads((root / "reports/table_total.cells.json").read_text())["cells"]
    assert sorted(cells) == ["erm/main/mydata/cooccurrence/0.5", "erm/main/mydata/uniform/0.5"]
    paper_run = cells["erm/main/mydata/cooccurrence/0.5"]["runs"][0]
    assert paper_run["manifest"] == "runs/mydata/g0.5/s0/erm/manifest.json"  # the paper's model: its run as it was
    assert json.loads((root / paper_run["manifest"]).read_text())["run"].get("noise") is None
    uniform = read_labels(root / "data/mydata/noisy/g0.5-uniform_s0.parquet")
    assert uniform.meta["noise"] == {"model": "uniform"} and noisy.read_bytes() == paper_set  # the paper's untouched
    assert (uniform.labels != read_labels(noisy).labels).any()  # another model, another noisy set
    results = pd.read_parquet(root / "reports/results.parquet")
    assert set(results["noise_model"]) == {"cooccurrence", "uniform"}


@pytest.mark.slow
def test_the_pages_kind_module_is_all_a_new_kind_takes(tmp_path):
    if not SNAKEMAKE.exists():
        pytest.skip(f"snakemake is not installed next to {sys.executable}")
    text = page(PAGE, "Add your own data")
    (module,) = blocks(text, "python")
    block = yaml.safe_load(blocks(text, "yaml")[1])["datasets"]
    (name, dataset), = block.items()
    root = project_copy(tmp_path / "project")
    path = module.splitlines()[0].removeprefix("# ").strip()
    assert path.startswith("src/noisymlt/data/kinds/") and not (root / path).exists()
    (root / path).write_text(module)

    # images annotated in VOC's XML layout: the toy generator writes that layout
    python = [str(BIN / "python"), "-m", "noisymlt"]
    subprocess.run([*python, "make-toy", "--out", "build", "--n-trainval", "240", "--n-test", "60"], cwd=root,
                   env=_env(root), check=True, capture_output=True)
    (root / "build/VOCdevkit/TOY").rename(root / dataset[dataset["kind"]]["root"])
    layer = {"grid": {"datasets": [name], "gammas": [0.5], "seeds": [0], "methods": ["erm"], "clean_methods": [],
                      "ablations": []}, "datasets": block}
    (root / "labelled.yaml").write_text(yaml.safe_dump(layer))
    run(f"{SNAKEMAKE} --profile workflow/profiles/demo --configfile workflow/profiles/demo/params.yaml labelled.yaml "
        f"--cores 2 -- reports/structure_{name}.md", root)
    md = (root / f"reports/structure_{name}.md").read_text()
    assert "20 classes" in md
    log = (root / f"logs/data/parse_{name}_train_source.log").read_text()
    assert "240 images" in log, log  # the module's parse command read the folder in place

    # the registry found it; the params check reads its block (a wrong key is refused, naming it)
    check = ("from noisymlt.data.kinds import KIND_MODULES; print(KIND_MODULES[" + repr(dataset["kind"]) + "])")
    out = subprocess.run([*python[:1], "-c", check], cwd=root, env=_env(root), capture_output=True, text=True)
    assert out.stdout.strip() == "noisymlt.data.kinds." + Path(path).stem, out.stderr
    bad = {**layer, "datasets": {name: {**dataset, dataset["kind"]: {"root": "labelled", "rooot": 1}}}}
    (root / "bad.yaml").write_text(yaml.safe_dump(bad))
    done = subprocess.run([*python, "code-deps", "--params", "params.yaml", "bad.yaml", "--digests"], cwd=root,
                          env=_env(root), capture_output=True, text=True)
    assert done.returncode != 0 and f"datasets.{name}.{dataset['kind']}.rooot" in done.stderr, done.stderr[-800:]
