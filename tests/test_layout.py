"""noisymlt.pipeline.layout: the path patterns filled as the package fills them, and spelled nowhere else in the
package or the scripts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from noisymlt.pipeline import layout as L

REPO = Path(__file__).resolve().parents[1]


def test_fill_writes_a_noise_rate_one_way():
    assert L.fill(L.NOISY, dataset="voc", gamma=0, seed=3) == "data/voc/noisy/g0.0_s3.parquet"
    assert L.fill(L.NOISY, dataset="voc", gamma="0.50", seed="3") == "data/voc/noisy/g0.5_s3.parquet"
    assert L.fill(L.RUN, dataset="toy", gamma=0.5, seed=0, method="erm") == "runs/toy/g0.5/s0/erm"
    assert (L.fill(L.CANDIDATE, dataset="toy", method="ours", stage=2, gamma=0.3, seed=1, tag="lr0.08")
            == "runs/toy/select/ours/stage2/g0.3/s1/lr0.08")
    assert L.fill(L.CHOICE_FILE, dataset="voc", method="ours", stage=1) == "runs/voc/select/ours/stage1.choice.json"
    assert L.fill(L.CLASS_SPLIT, dataset="coco") == "data/coco/class_split.json"
    assert L.gtag(0) == "0.0" and L.gtag("0.5") == "0.5" and L.gtag(1e-05) == "1e-05"
    choice = L.fill(L.CHOICE_FILE, dataset="voc", method="ours", stage=2)
    assert L.stage_file_of(Path(choice)) == L.fill(L.STAGE_FILE, dataset="voc", method="ours", stage=2)
    with pytest.raises(KeyError):
        L.fill(L.NOISY, dataset="voc", gamma=0.5)  # every field must be given
    # the noise model follows the rate, unless it is the paper's (its paths are every finished result's)
    assert L.fill(L.NOISY, dataset="voc", gamma=0.5, seed=3, noise="cooccurrence") == "data/voc/noisy/g0.5_s3.parquet"
    assert L.fill(L.RUN, dataset="toy", gamma=0.5, seed=0, method="erm", noise="uniform") == "runs/toy/g0.5-uniform/s0/erm"
    assert L.noise_level(0.5, "missing") == "0.5-missing" and L.noise_level("0.50") == "0.5"
    assert L.parse_noise_level("0.5-class_conditional") == (0.5, "class_conditional")
    assert L.parse_noise_level("0.3") == (0.3, "cooccurrence")
    assert L.noise_name(L.noise_tag("uniform")) == "uniform" and L.noise_name(L.noise_tag("cooccurrence")) == "cooccurrence"
    assert L.with_noise(L.NOISY, "cooccurrence") == "data/{dataset}/noisy/g{gamma}_s{seed}.parquet"


def test_fields_and_part():
    assert L.fields(L.CANDIDATE) == ["dataset", "method", "stage", "gamma", "seed", "tag"]
    assert L.fields(L.RESULTS) == []
    assert L.part(L.SELECT_PART, "fit") == "data/{dataset}/select/g{gamma}_s{seed}_fit.parquet"
    assert L.fields(L.part(L.CACHE, "test")) == ["dataset"]
    assert L.fill(L.part(L.SELECT_CACHE, "val"), dataset="toy") == "data/toy/cache/select_val.npy"


# ------------------------------------------------------------------------------------------ spelled once

# Text that only a path of the layout holds: a string constant (or an f-string's literal part) holding one
# outside layout.py spells a pattern again. Docstrings and argparse help texts are documentation and may show one.
FRAGMENTS = ("noisy/g", "_labels.parquet", "class_split.json", "/select/", "cache/select_", "/cache/",
             "/train_images", "data/pretrained", ".choice.json")
DOC_KEYWORDS = {"help", "description", "epilog"}
LAYOUT = Path("src/noisymlt/pipeline/layout.py")

# (file, fragment) -> why that file may spell it. The test fails on an entry no longer needed.
ALLOWED = {
    ("src/noisymlt/report/readme.py", "/select/"):
        "a glob shown to the README's reader (runs/*/select/) where a selection record names no file; and the "
        "report layer sits below noisymlt.pipeline, so it may not import the layout (.importlinter)",
}


def _documentation(tree: ast.AST) -> set[int]:
    """ids of the constants that document: docstrings and the text of help=/description=/epilog= arguments."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
        if isinstance(node, ast.keyword) and node.arg in DOC_KEYWORDS:
            out.update(id(n) for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return out


def spellings(files: list[Path], root: Path = REPO) -> list[tuple[str, int, str, str]]:
    """(file relative to root, line, fragment, text) of every string constant outside the documentation that holds
    a fragment."""
    found = []
    for file in files:
        tree = ast.parse(file.read_text(), filename=str(file))
        docs = _documentation(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
                for fragment in FRAGMENTS:
                    if fragment in node.value:
                        found.append((file.relative_to(root).as_posix(), node.lineno, fragment, node.value))
    return sorted(found)


def test_no_path_pattern_is_spelled_outside_the_layout():
    files = sorted(p for folder in ("src/noisymlt", "scripts") for p in (REPO / folder).rglob("*.py")
                   if p.relative_to(REPO) != LAYOUT)
    assert len(files) > 50
    found = spellings(files)
    bad = [f"{file}:{line}: {text!r} spells {fragment!r}" for file, line, fragment, text in found
           if (file, fragment) not in ALLOWED]
    assert not bad, "path patterns spelled outside noisymlt.pipeline.layout (ask it instead):\n" + "\n".join(bad)
    unused = set(ALLOWED) - {(file, fragment) for file, _, fragment, _ in found}
    assert not unused, f"allow-list entries no longer needed: {sorted(unused)}"


def test_the_scan_sees_f_strings_and_skips_documentation(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""A docstring: data/voc/noisy/g0.5_s0.parquet."""\n'
                     'import argparse\n'
                     'argparse.ArgumentParser().add_argument("--x", help="e.g. data/NAME/class_split.json")\n'
                     'name = "voc"\n'
                     'a = f"data/{name}/select/split.json"\n'
                     'b = "data/voc/train_labels.parquet"\n')
    found = spellings([probe], root=tmp_path)
    assert [(file, line, fragment) for file, line, fragment, _ in found] == [
        ("probe.py", 5, "/select/"), ("probe.py", 6, "_labels.parquet")]
