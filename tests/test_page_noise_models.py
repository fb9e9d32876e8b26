"""The manual's "Noise models" page (docs/noise-models.md), followed in copies of the project: its example model
module is all a new noise model takes (and changes no existing set's code digest), and [CL]'s published noisy labels,
laid out as the page says, become a run's noisy set through the workflow. (Its two-model grid runs in
tests/test_page_own_data.py, on that page's dataset.)"""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from noisymlt.data.labels import LabelTable, read_labels, write_labels
from helpers import (BIN, SNAKEMAKE, blocks, commands, copy_build, page, project_copy, run_line as run,
                     tool_env as _env)

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "noise-models.md"
OWN_DATA = REPO / "docs" / "own-data.md"


def test_the_pages_model_module_is_all_a_new_model_takes(tmp_path):
    text = page(PAGE, "Noise models")
    (module,) = blocks(text, "python")
    path = module.splitlines()[0].removeprefix("# ").strip()
    root = project_copy(tmp_path / "project")
    assert path.startswith("src/noisymlt/data/noise_models/") and not (root / path).exists()
    python = [str(BIN / "python"), "-m", "noisymlt"]
    digests = ("from noisymlt.pipeline.step_code import noise_digest; from noisymlt.data.noise_models import "
               "NOISE_MODULES; print({m: noise_digest(m) for m in sorted(NOISE_MODULES)})")
    before = subprocess.run([*python[:1], "-c", digests], cwd=root, env=_env(root), capture_output=True, text=True)
    (root / path).write_text(module)
    after = subprocess.run([*python[:1], "-c", digests], cwd=root, env=_env(root), capture_output=True, text=True)
    old, new = (eval(out.stdout) for out in (before, after))  # noqa: S307 (our own printed dict)
    assert set(new) - set(old) == {"pairflip"} and {m: new[m] for m in old} == old  # nothing that exists reruns

    # the page's command, on a label table of the page's dataset's shape
    rng = np.random.default_rng(0)
    labels = (rng.random((600, 5)) < 0.3).astype(np.uint8)
    labels[np.arange(600), rng.integers(0, 5, 600)] = 1
    (root / "data/mydata").mkdir(parents=True)
    write_labels(LabelTable(image_ids=[f"{i:03d}" for i in range(600)], classes=list("abcde"), labels=labels,
                            paths=None, meta={}), root / "data/mydata/train_labels.parquet")
    line = next(w for w in text.replace("\n", " ").split("`") if w.startswith("python -m noisymlt noise --model"))
    subprocess.run(line.split(), cwd=root, env=_env(root), check=True, capture_output=True)
    out = read_labels(root / "pairflip.parquet")
    stats = json.loads((root / "pairflip.json").read_text())
    moved = np.array(stats["transition_counts"])
    assert out.meta["noise"] == {"model": "pairflip"} and stats["model"] == "pairflip"
    assert (moved[np.arange(5), (np.arange(5) + 1) % 5] == moved.sum(axis=1)).all()  # only i -> i + 1
    assert abs(stats["flip_rate"] - 0.5) < 4 * (0.25 / labels.sum()) ** 0.5

    # the params check knows it: grid.noise_models takes it, a misspelt name is refused naming the known ones
    layer = {"grid": {"noise_models": ["cooccurrence", "pairflip"]}}
    (root / "pf.yaml").write_text(yaml.safe_dump(layer))
    done = subprocess.run([*python, "code-deps", "--params", "params.yaml", "pf.yaml", "--digests"], cwd=root,
                          env=_env(root), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-800:]
    (root / "bad.yaml").write_text(yaml.safe_dump({"grid": {"noise_models": ["pairflp"]}}))
    done = subprocess.run([*python, "code-deps", "--params", "params.yaml", "bad.yaml", "--digests"], cwd=root,
                          env=_env(root), capture_output=True, text=True)
    assert done.returncode != 0 and "grid.noise_models" in done.stderr and "pairflip" in done.stderr, done.stderr


@pytest.mark.slow
def test_the_authors_labels_become_a_noisy_set_as_the_page_says(tmp_path, own_data_project):
    if not SNAKEMAKE.exists():
        pytest.skip(f"snakemake is not installed next to {sys.executable}")
    text = page(PAGE, "Noise models")
    layer = yaml.safe_load(blocks(text, "yaml")[1])
    assert layer["grid"]["noise_models"] == ["cooccurrence", "authors"]
    given = layer["noise"]["authors"]["voc"]
    own = page(OWN_DATA, "Add your own data")
    (smk,) = commands(own)
    root = copy_build(own_data_project, tmp_path / "project")  # folder_project, its data made (conftest)
    # the clean subset first (its ids and rows are what [CL]'s file must match)
    run(smk.replace("reports/structure_mydata.md runs/mydata/g0.5/s0/erm/metrics.json",
                    "data/mydata/train_labels.parquet"), root)
    clean = read_labels(root / "data/mydata/train_labels.parquet")
    folder = root / given["directory"]
    folder.mkdir(parents=True)
    order = np.random.default_rng(1).permutation(len(clean))  # [CL]'s id list has its own order
    rows = clean.labels[order]
    noisy = np.where(np.random.default_rng(2).random(rows.shape) < 0.2, 1 - rows, rows).astype(np.uint8)
    pkl = folder / "class_freq_0.5noise.pkl"
    pkl.write_bytes(pickle.dumps({"labels": noisy, "clean_labels": rows, "class_freq": noisy.sum(axis=0),
                                  "neg_class_freq": len(rows) - noisy.sum(axis=0)}, protocol=2))
    (folder / given["ids"]).write_text("".join(clean.image_ids[r] + "\n" for r in order))
    block = {**given, "sha256": {"0.5": hashlib.sha256(pkl.read_bytes()).hexdigest()}}
    (root / "authors.yaml").write_text(yaml.safe_dump({**layer, "noise": {"authors": {"mydata": block}}}))
    target = "data/mydata/noisy/g0.5-authors_s0.parquet"
    run(f"{SNAKEMAKE} --profile workflow/profiles/demo --configfile workflow/profiles/demo/params.yaml "
        f"mydata.yaml authors.yaml -- {target}", root)
    table = read_labels(root / target)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    assert (table.labels == noisy[back]).all() and (table.clean == clean.labels).all()  # row by row, table order
    assert table.meta["noise"]["model"] == "authors"
