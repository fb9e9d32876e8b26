"""Dataset kinds (noisymlt.data.kinds): registered from their modules' source, asked by the pipeline, and compared by
name nowhere else."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import numpy as np
import pytest

from noisymlt.config import load_params, validate_params
from noisymlt.data.kinds import KIND_MODULES, kind_of
from noisymlt.data.labels import LabelTable, read_labels, write_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.pipeline import paths

REPO = Path(__file__).resolve().parents[1]

FOLDER = {"kind": "folder", "folder": {"root": "own/set", "labels": "labels.csv", "images": "img", "split_seed": 3,
                                       "classes": ["a", "b"]},
          "longtail": {"source": "all"}, "db_loss": {"neg_scale": 5.0, "map_mu": 0.3}}


def paper_with(**datasets) -> dict:
    params = load_params(REPO / "params.yaml")
    params["datasets"].update(copy.deepcopy(datasets))
    return params


def test_the_registry_reads_the_kinds_from_their_modules():
    assert KIND_MODULES == {name: f"noisymlt.data.kinds.{name}" for name in ("coco", "folder", "toy", "voc")}
    assert kind_of("coco").name == "coco" and kind_of("coco").fetches_train_images
    with pytest.raises(NoisyMLTError, match="unknown dataset kind 'nus'.*known: coco, folder, toy, voc"):
        kind_of("nus")


def test_a_folder_dataset_is_read_in_place_with_its_options():
    params = paper_with(own=FOLDER)
    validate_params(params)
    assert paths.raw_dir(params, "own") == "own/set" and paths.raw_marker(params, "own") == "own/set/labels.csv"
    assert paths.raw_argv(params, "own") is None  # nothing to download or generate
    assert paths.image_root(params, "own", "train") == paths.image_root(params, "own", "test") == "own/set/img"
    assert paths.parse_argv(params, "own", "test", "out.parquet") == [
        "parse-folder", "--labels", "own/set/labels.csv", "--images", "own/set/img", "--part", "test", "--out",
        "out.parquet", "--split-seed", "3", "--classes", "a,b"]
    # source all: the set as it is, none of the longtail rule's optional options
    assert paths.longtail_options(params, "own") == {"draw": [], "cap": [], "groups": [], "official": []}
    assert paths.train_images_ready(params, "own") == "own/set/labels.csv"
    # raw files made by a command (make_raw, download: common.smk raw_targets) for the kinds that have one, each in
    # its kind's folder; none for a folder of the user's
    assert {d: paths.raw_dir(params, d) for d in ("voc", "coco", "own") if paths.raw_argv(params, d) is not None} == {
        "voc": "data/raw/voc", "coco": "data/raw/coco"}


def test_a_kinds_own_block_is_checked_with_its_schema_and_refused_under_another_kind():
    with pytest.raises(NoisyMLTError, match=r"datasets\.own\.folder\.labels.*required|'labels' is a required"):
        validate_params(paper_with(own={**FOLDER, "folder": {"root": "x"}}))
    with pytest.raises(NoisyMLTError, match=r"datasets\.own\.folder\.test_fraction"):
        validate_params(paper_with(own={**FOLDER, "folder": {**FOLDER["folder"], "test_fraction": 1.5}}))
    coco = load_params(REPO / "params.yaml")["datasets"]["coco"]
    with pytest.raises(NoisyMLTError, match=r"datasets\.coco\.toy: kind coco reads no toy block \(kinds that do: "
                                            r"toy, voc\)"):
        validate_params(paper_with(coco={**coco, "toy": {"seed": 0}}))
    with pytest.raises(NoisyMLTError, match=r"datasets\.own\.kind"):
        validate_params(paper_with(own={**FOLDER, "kind": "nuswide"}))


def test_longtail_source_all_keeps_every_image_and_splits_the_classes(tmp_path):
    from noisymlt.cli import main

    rng = np.random.default_rng(0)
    labels = (rng.random((50, 3)) < [0.8, 0.3, 0.05]).astype(np.uint8)
    labels[labels.sum(1) == 0, 0] = 1
    write_labels(LabelTable([f"i{k}" for k in range(50)], ["a", "b", "c"], labels), tmp_path / "in.parquet")
    assert main(["longtail", "--labels", str(tmp_path / "in.parquet"), "--out", str(tmp_path / "out.parquet"),
                 "--split-out", str(tmp_path / "split.json"), "--source", "all", "--groups", "scaled"]) == 0
    out = read_labels(tmp_path / "out.parquet")
    assert out.image_ids == [f"i{k}" for k in range(50)] and (out.labels == labels).all()
    assert out.meta["subset"] == {"source": "all"}


# ------------------------------------------------------------------------------------------ compared nowhere else

# A kind's name as a constant in a comparison, a dict key or a subscript, in the package outside noisymlt.data.kinds;
# or quoted in a rule. Where the same word names something else, the entry says what.
ALLOWED = {
    ("src/noisymlt/data/parse.py", "voc"): "`parse --format voc|coco` names an annotation format (VOC XML, COCO "
                                            "JSON), which the toy and a user's VOC-layout kind read too",
    ("src/noisymlt/data/toy.py", "voc"): "make-toy's --layout voc (VOC's folder layout and class names)",
    ("src/noisymlt/data/toy_scenes.py", "voc"): "the toy's label model fit to VOC2012 (toy.scenes: voc)",
    ("src/noisymlt/report/style.py", "voc"): "the paper's titles of its datasets, by dataset name (a user's dataset "
                                             "is titled by its name)",
    ("src/noisymlt/report/style.py", "coco"): "as voc",
    ("src/noisymlt/report/style.py", "toy"): "as voc",
    ("src/noisymlt/report/tables.py", "voc"): "the paper's column order of its datasets, by dataset name",
    ("src/noisymlt/report/tables.py", "coco"): "as voc",
    ("src/noisymlt/report/figures.py", "voc"): "the paper's order of its datasets in the figure, by dataset name",
    ("src/noisymlt/report/figures.py", "coco"): "as voc",
}


def kind_name_constants(root: Path = REPO) -> set[tuple[str, str]]:
    found = set()
    for path in sorted((root / "src").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("src/noisymlt/data/kinds/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            consts: list = []
            if isinstance(node, ast.Compare):
                for part in (node.left, *node.comparators):
                    consts += part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [part]
            elif isinstance(node, ast.Dict):
                consts += [k for k in node.keys if k is not None]
            elif isinstance(node, ast.Subscript):
                consts.append(node.slice)
            found |= {(rel, c.value) for c in consts if isinstance(c, ast.Constant) and c.value in KIND_MODULES}
    rules = [*sorted((root / "workflow" / "rules").glob("*.smk")), root / "workflow" / "Snakefile"]
    for path in filter(Path.exists, [*rules, root / "dvc.yaml"]):
        text = re.sub(r'"""(.*?)"""', "", path.read_text(), flags=re.S)  # docstrings are prose
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        found |= {(path.relative_to(root).as_posix(), name) for name in KIND_MODULES
                  if re.search(rf"""["'][^"'\n]*\b{name}\b[^"'\n]*["']""", code)}
    return found


def test_no_kind_name_is_compared_outside_the_kinds():
    found = kind_name_constants()
    assert found - set(ALLOWED) == set(), "a kind compared by name: ask noisymlt.data.kinds instead"
    assert set(ALLOWED) - found == set(), "no longer needed: remove from ALLOWED"


def test_the_scan_finds_a_kind_compared_by_name(tmp_path):
    """The check above fails on the code the kinds replaced: paths.raw_dir compared the kind with "voc", pseudo_labels
    kept [CL]'s thresholds in a dict keyed by kind, and the download rule's wildcard listed kinds."""
    (tmp_path / "src/noisymlt/pipeline").mkdir(parents=True)
    (tmp_path / "workflow/rules").mkdir(parents=True)
    (tmp_path / "src/noisymlt/pipeline/paths.py").write_text('def raw(block):\n    return block["kind"] == "voc"\n')
    (tmp_path / "src/noisymlt/pseudo.py").write_text('DEFAULTS = {"coco": 0.9}\n')
    (tmp_path / "workflow/rules/data.smk").write_text('rule download:\n    wildcard_constraints:\n        kind="voc|coco",\n')
    assert kind_name_constants(tmp_path) == {("src/noisymlt/pipeline/paths.py", "voc"),
                                             ("src/noisymlt/pseudo.py", "coco"), ("workflow/rules/data.smk", "voc"),
                                             ("workflow/rules/data.smk", "coco")}
