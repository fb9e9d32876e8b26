"""docs/use-a-trained-model.md, followed to the letter on a copy of the own-data page's project: its runs trained by
that page's command, then every command line of this page in order and its Python block, each checked for what the
page says it writes."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import pytest

from helpers import OWN_DATA_CLASSES, REPO, blocks, commands, copy_build, page, run_line, tool_env

PAGE = REPO / "docs" / "use-a-trained-model.md"


@pytest.mark.slow
def test_the_page_predicts_exports_and_lists_suspects_on_the_own_data_runs(own_data_runs, tmp_path):
    text = page(PAGE, "Use a trained model")
    project = copy_build(own_data_runs, tmp_path / "project")  # "after its Snakemake command" (conftest)
    images = project / "mydata" / "images"
    for name, source in (("cat_on_sofa.png", "000.png"), ("garden/0001.png", "001.png")):  # the page's folder
        (project / "new_images" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(images / source, project / "new_images" / name)

    lines = commands(text)
    assert [line.split()[:2] for line in lines] == [["noisymlt", "predict"], ["noisymlt", "export"],
                                                   ["noisymlt", "suspects"], ["snakemake", "--profile"],
                                                   ["noisymlt", "suspects"]], lines
    for line in lines:
        run_line(line, project)

    with open(project / "predictions/new_images.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["image"] for r in rows] == ["cat_on_sofa.png", "garden/0001.png"]
    assert all(r["head"] == "main" and set(r) == {"image", "head", *OWN_DATA_CLASSES, "predicted"} for r in rows)
    record = json.loads((project / "predictions/new_images.json").read_text())
    assert record["images"] == 2 and record["threshold"]["rule"] == 0.5

    exported = project / "exported/erm"
    spec = json.loads((exported / "model.json").read_text())
    assert {f.name for f in exported.iterdir()} == {"model.json", *(rec["file"] for rec in spec["files"].values())}
    assert spec["classes"] == OWN_DATA_CLASSES
    (python,) = blocks(text, "python")
    shown = subprocess.run([sys.executable, "-c", python], cwd=project, env=tool_env(project), capture_output=True,
                           text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    # the page's ONNX Runtime snippet labels the images as `noisymlt predict` does at 0.5
    printed = [line.split(" ", 1) for line in shown.stdout.splitlines()]
    by_file = {path.removeprefix("new_images/"): labels for path, labels in printed}
    assert by_file == {r["image"]: repr([c for c in r["predicted"].split(";") if c]) for r in rows}, shown.stdout

    with open(project / "suspects/erm.csv", newline="") as fh:
        suspects = list(csv.DictReader(fh))
    erm = json.loads((project / "suspects/erm.json").read_text())
    assert suspects and "wrong" in suspects[0] and {"model", "cleanlab"} == set(erm["scorers"])
    assert all("detection" in rec for rec in erm["scorers"].values())
    assert sum(r["model_flagged"] == "1" for r in suspects) == erm["scorers"]["model"]["flagged"]
    with open(project / "suspects/my_labels.csv", newline="") as fh:
        mine = list(csv.DictReader(fh))
    own = json.loads((project / "suspects/my_labels.json").read_text())
    assert (not mine or "wrong" not in mine[0]) and all("detection" not in r for r in own["scorers"].values())
    assert own["gamma"] == 0.0  # the labels as given
