"""params.yaml validation and run-config resolution."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from noisymlt.errors import NoisyMLTError
from noisymlt.config import deep_merge, load_params, resolve_run, validate_params
from noisymlt.core.manifest import run_id

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def paper():
    return load_params(REPO / "params.yaml")


def test_paper_and_demo_params_are_valid(paper):
    demo = load_params(REPO / "params.yaml", REPO / "workflow/profiles/demo/params.yaml")
    assert paper["grid"]["datasets"] == ["voc", "coco"] and len(paper["grid"]["seeds"]) == 5
    assert demo["grid"]["datasets"] == ["toy"]
    assert demo["datasets"]["voc"] == paper["datasets"]["voc"]  # the layer adds, it does not drop


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p["train"].update(learning_rate=0.1), "params.yaml: train.learning_rate: unknown key"),
        (lambda p: p["train"].update(lr=-1), "lr"),
        (lambda p: p["grid"].update(gammas=[0.5, 1.5]), "grid.gammas.1"),
        (lambda p: p["grid"].update(methods=["erm", "nonsense"]), "grid.methods: unknown method 'nonsense'"),
        (lambda p: p["methods"]["erm"].update(family="nope"), "unknown family 'nope'"),
        (lambda p: p["methods"]["erm"].update(sampler="sometimes"), "methods.erm.sampler"),
        (lambda p: p["methods"]["erm"].update(colour="red"), "methods.erm"),
        (lambda p: p["grid"].update(datasets=["voc", "imagenet"]), "'imagenet'"),
        (lambda p: p["datasets"]["voc"]["longtail"].update(source="magic"), "datasets.voc.longtail.source"),
        (lambda p: p.update(extra_section={}), "extra_section"),
        (lambda p: p["grid"].update(gammas=[0.5, 1]), "write the noise rate 1 as 1.0"),
        (lambda p: p["timing"].update(methods=["db", "fastest"]), "timing.methods: unknown method 'fastest'"),
        (lambda p: p["timing"].update(trials=0), "timing.trials"),
        # a batch no training set can fill: refused before any job starts, naming the block that sets it
        (lambda p: p["train"].update(batch_size=100000),
         "train.batch_size: 100000 exceeds the training images of dataset 'voc' (at most 11540)"),
        (lambda p: p["methods"]["erm"].update(train={"batch_size": 100000}),
         "methods.erm.train.batch_size: 100000 exceeds"),
        (lambda p: p["datasets"]["coco"].update(train={"lr": 0.2, "batch_size": 97000}),
         "datasets.coco.train.batch_size: 97000 exceeds the training images of dataset 'coco' (at most 96000)"),
        # a value of one of several forms: the key inside it and what it is not
        (lambda p: p["selection"]["methods"].update(ours=[["lr", "bogus"]]),
         "selection.methods.ours.0.1: 'bogus' is not one of ['lr', 'alpha', 'beta'] (accepted: null (nothing) or "
         "a list of lists of ['lr', 'alpha', 'beta'] or {same_as: ...})"),
    ],
)
def test_bad_params_are_rejected_with_the_key(paper, mutate, message):
    bad = copy.deepcopy(paper)
    mutate(bad)
    with pytest.raises(NoisyMLTError, match=re.escape(message)):
        validate_params(bad, source="params.yaml")


def test_load_params_names_the_file(tmp_path):
    broken = tmp_path / "p.yaml"
    broken.write_text("grid: [unclosed\n")
    with pytest.raises(NoisyMLTError, match="p.yaml"):
        load_params(broken)


def test_a_bad_layer_is_named_with_the_key_in_one_short_line(tmp_path, capsys):
    """The file that set the bad key, then the key: never the key glued onto the file name, never the schema."""
    demo = REPO / "workflow" / "profiles" / "demo" / "params.yaml"
    cases = {
        "train: {lr: fast}\n": "train.lr: 'fast' is not of type 'number'",
        "methods: {erm: {colour: red}}\n": "methods.erm.colour: unknown key",
        "grid: {gammas: [0.5, 1.5]}\n": "grid.gammas.1: 1.5 is greater than the maximum of 1",
        "methods: {ours: {stitchup: {k: many}}}\n": "methods.ours.stitchup.k: 'many' is not of type 'integer'",
        # issue 40: a NaN passed every bound and the run died with a non-finite loss naming neither file nor key;
        # YAML 1.1 reads 1e-3 as text, and the message said only that it is not a number
        "train: {lr: .nan}\n": "train.lr: not a finite number (NaN or infinity)",
        "methods: {erm: {train: {weight_decay: -.inf}}}\n": "methods.erm.train.weight_decay: not a finite number (NaN or infinity)",
        "train: {lr: 1e-3}\n": "train.lr: '1e-3' is not of type 'number' (YAML 1.1 reads '1e-3' as text: write the "
                                "number with a dot, e.g. 1.0e-3)",
    }
    for text, message in cases.items():
        layer = tmp_path / "layer.yaml"
        layer.write_text(text)
        with pytest.raises(NoisyMLTError) as info:
            load_params(REPO / "params.yaml", demo, layer)
        assert str(info.value) == f"{layer}: {message}"
    from noisymlt.cli import main

    assert main(["code-deps", "--params", str(REPO / "params.yaml"), str(demo), str(layer), "--digests"]) == 2
    assert capsys.readouterr().err == f"noisymlt code-deps: error: {layer}: {message}\n"  # the last case, one line
    # a key set by the base file and left alone by the layers is the base file's
    broken = tmp_path / "params.yaml"
    broken.write_text((REPO / "params.yaml").read_text().replace("  momentum: 0.9", "  momentum: -0.9", 1))
    with pytest.raises(NoisyMLTError, match=rf"^{broken}: train.momentum: -0.9 is less than the minimum of 0$"):
        load_params(broken, demo)


def test_snakemake_names_the_bad_params_file_and_key_in_one_line(tmp_path):
    from helpers import SNAKEMAKE, project_copy

    wf = project_copy(tmp_path)
    (wf / "bad.yaml").write_text("methods: {erm: {colour: red}}\n")
    proc = subprocess.run([SNAKEMAKE, "-n", "--configfile", "workflow/profiles/demo/params.yaml", "bad.yaml"], cwd=wf,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    # Snakemake's own notes (the configfile, the default profile it read) may come first
    lines = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if not line.startswith("Using ")]
    assert lines[-1] == "noisymlt: bad.yaml: methods.erm.colour: unknown key"
    assert len(lines) <= 2 and "schema" not in proc.stderr  # no traceback, no schema dump


def test_resolve_run_layers_dataset_schedule_and_method_overrides(paper):
    params = copy.deepcopy(paper)
    params["methods"]["rs"]["train"] = {"epochs": 3}
    r = resolve_run(params, "coco", "rs", 0.5, 2)
    assert r["schedule"] == "db"
    assert r["train"]["lr"] == 0.02  # [DB]'s schedule wins over the dataset's [CL] lr
    assert r["train"]["warmup_iters"] == 500 and r["train"]["epoch_length"] == "sampler"
    assert r["train"]["trainable"] == "layer2" and r["train"]["neck_dropout"] == 0.5
    assert r["train"]["epochs"] == 3  # method override
    ours = resolve_run(params, "coco", "ours", 0.5, 2)
    assert ours["schedule"] == "cl" and ours["train"]["lr"] == 0.2  # dataset override on [CL]'s schedule
    assert ours["train"]["trainable"] == "layer4" and ours["train"]["epoch_length"] == "batches"
    params["methods"]["rs"]["schedule"] = "cl"  # the one-line switch to the uniform regime
    assert resolve_run(params, "coco", "rs", 0.5, 2)["train"]["lr"] == 0.2
    assert r["train"]["batch_size"] == 32  # global
    assert r["db_loss"] == {"neg_scale": 2.0, "map_mu": 0.2}
    assert "train" not in r["method_cfg"] and "schedule" not in r["method_cfg"]
    assert run_id(r) == run_id(copy.deepcopy(r))
    assert run_id(r) != run_id(resolve_run(params, "coco", "erm", 0.5, 3))
    params["methods"]["erm"]["schedule"] = "fast"
    with pytest.raises(NoisyMLTError, match="methods.erm.schedule.*fast"):
        validate_params(params)
    with pytest.raises(NoisyMLTError, match="methods.erm.schedule.*fast"):
        resolve_run(params, "coco", "erm", 0.5, 2)


def test_deep_merge_replaces_lists_and_merges_dicts():
    assert deep_merge({"a": {"x": 1, "y": [1, 2]}, "b": 1}, {"a": {"y": [3]}}) == {"a": {"x": 1, "y": [3]}, "b": 1}


def test_schema_file_is_valid_yaml_and_strict():
    schema = yaml.safe_load((REPO / "workflow/schemas/params.schema.yaml").read_text())
    assert schema["additionalProperties"] is False


def test_baselines_run_their_reference_recipes(paper):
    db_family = ["erm", "focal", "rs", "rs_focal", "ldam", "db", "db_focal"]
    for dataset in ("voc", "coco"):
        for method in db_family + ["bbn", "mlgcn", "dividemix"]:
            r = resolve_run(paper, dataset, method, 0.5, 0)
            t = r["train"]
            uniform = method in ("erm", "focal", "ldam", "bbn", "mlgcn")  # an epoch = a pass over N images
            assert r["schedule"] == ("db_random" if uniform else "db"), method
            assert (t["lr"], t["warmup_iters"], t["warmup_ratio"], t["lr_steps"], t["epochs"]) == (
                0.02, 100 if uniform else 500, pytest.approx(1 / 3), [5, 7], 8), method
            assert (t["trainable"], t["frozen_bn"], t["epoch_length"], t["batch_size"], t["grad_clip"]) == (
                "layer2", True, "sampler", 32, 35.0), method
            assert t["neck_dropout"] == (0.0 if method == "ldam" else 0.5), method
        for method in [m for m in paper["methods"] if m.startswith("ours")]:
            r = resolve_run(paper, dataset, method, 0.5, 0)
            assert r["schedule"] == "cl" and r["train"]["trainable"] == "layer4", method
            assert r["train"]["lr"] == (0.02 if dataset == "voc" else 0.2)
    ldam = paper["methods"]["ldam"]
    assert ldam["loss"] == "ldam" and ldam["head"] == "cosine"
    assert paper["methods"]["mlgcn"]["adjacency"] == "code" and paper["methods"]["mlgcn"]["pool"] == "max"
    assert paper["methods"]["dividemix"]["warmup_epochs"] == "auto"


def test_ldam_scale_on_a_linear_head_is_refused(tiny_toy, tmp_path):
    from helpers import tiny_params, toy_trainer

    params = tiny_params("ldam")
    params["methods"]["ldam"]["head"] = "linear"
    with pytest.raises(NoisyMLTError, match="methods.ldam.*head: cosine"):
        validate_params(params)  # at params load, before any data step runs
    with pytest.raises(NoisyMLTError, match="methods.ldam.*head: cosine"):  # and for a resolved run config
        toy_trainer(tiny_toy, resolve_run(params, "toy", "ldam", 0.5, 0), tmp_path)
    params["methods"]["ldam"]["loss_params"] = {"scale": 1.0}  # no scale: a linear head is fine
    toy_trainer(tiny_toy, resolve_run(params, "toy", "ldam", 0.5, 0), tmp_path)
