"""noisymlt.pipeline.paths: the arguments each step gets from params files."""

from __future__ import annotations


import pytest

from noisymlt.errors import NoisyMLTError
from noisymlt.pipeline.paths import (grid_runs, image_root, longtail_options, parse_argv, raw_argv, raw_marker,
                                     run_dir, train_images_argv)

PARAMS = {
    "grid": {"datasets": ["voc", "coco"], "gammas": [0.3, 0.5], "seeds": [0], "methods": ["erm", "ours"]},
    "datasets": {
        "voc": {"kind": "voc", "longtail": {"source": "pareto", "b": 6, "max": 800, "min": 1, "seed": 0}},
        "coco": {"kind": "coco", "longtail": {"source": "official"}},
        "toy": {"kind": "toy", "toy": {"seed": 3, "n_trainval": 40, "n_test": 10, "size": 32},
                "longtail": {"source": "pareto", "max": 20, "cap_to_available": True}},
    },
    "download": {"mirror": "file:///mirror", "retries": 2},
}


def test_raw_step_dispatches_on_the_kind():
    assert raw_argv(PARAMS, "toy") == ["make-toy", "--out", "data/raw/toy", "--seed", "3", "--n-trainval", "40",
                                       "--n-test", "10", "--size", "32"]
    assert raw_argv(PARAMS, "coco") == ["download", "--dataset", "coco", "--root", "data/raw/coco",
                                        "--mirror", "file:///mirror", "--retries", "2"]
    assert raw_argv({**PARAMS, "download": {}}, "voc")[-2:] == ["--retries", "5"]  # no mirror flag
    assert raw_marker(PARAMS, "voc") == "data/raw/voc/manifest.json"
    with pytest.raises(NoisyMLTError, match="datasets.imagenet"):
        raw_argv(PARAMS, "imagenet")


@pytest.mark.parametrize("name, part, source", [
    ("voc", "train_source",
     ["--format", "voc", "--source", "data/raw/voc/VOCdevkit/VOC2012", "--image-set", "trainval"]),
    ("voc", "test", ["--format", "voc", "--source", "data/raw/voc/VOCdevkit/VOC2007", "--image-set", "test"]),
    ("coco", "train_source", ["--format", "coco", "--source", "data/raw/coco/annotations/instances_train2017.json",
                              "--image-dir", "train2017"]),
    ("coco", "test", ["--format", "coco", "--source", "data/raw/coco/annotations/instances_val2017.json",
                      "--image-dir", "val2017"]),
    ("toy", "test", ["--format", "voc", "--source", "data/raw/toy/VOCdevkit/TOY", "--image-set", "test"]),
])
def test_parse_arguments_per_kind_and_part(name, part, source):
    assert parse_argv(PARAMS, name, part, "x.parquet") == ["parse", *source, "--out", "x.parquet"]


def test_longtail_arguments_fill_defaults_and_name_the_official_list():
    assert longtail_options(PARAMS, "toy") == {"draw": ["--b", "6", "--max", "20", "--min", "1", "--seed", "0"],
                                               "cap": ["--cap-to-available"], "groups": [], "official": []}
    assert longtail_options(PARAMS, "coco")["official"] == ["--dataset", "coco"]


def test_image_folders_and_coco_train_images():
    assert image_root(PARAMS, "voc", "train") == "data/raw/voc/VOCdevkit/VOC2012"
    assert image_root(PARAMS, "coco", "train") == "data/coco/train_images"
    assert image_root(PARAMS, "coco", "test") == "data/raw/coco"
    assert train_images_argv(PARAMS, "voc", "ids", "out") is None
    argv = train_images_argv(PARAMS, "coco", "ids.parquet", "data/coco/train_images")
    assert argv[:7] == ["fetch-coco-images", "--annotations", "data/raw/coco/annotations/instances_train2017.json",
                        "--ids", "ids.parquet", "--out", "data/coco/train_images/train2017"]


def test_grid_runs_follow_snakemakes_order_and_paths():
    runs = grid_runs(PARAMS)
    assert len(runs) == 2 * 2 * 1 * 2
    assert runs[0] == ("voc", 0.3, 0, "erm", "cooccurrence") and runs[-1] == ("coco", 0.5, 0, "ours", "cooccurrence")
    two = grid_runs({**PARAMS, "grid": {**PARAMS["grid"], "noise_models": ["cooccurrence", "uniform"]}})
    assert two[:2] == runs[:2] and two[4] == ("voc", 0.3, 0, "erm", "uniform")  # dataset, model, rate, seed, method
    assert run_dir(*two[4]) == "runs/voc/g0.3-uniform/s0/erm"
    assert run_dir(*runs[1]) == "runs/voc/g0.3/s0/ours"
    assert run_dir("voc", 0.50, 0, "erm") == "runs/voc/g0.5/s0/erm"
