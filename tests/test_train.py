"""Trainer: schedule, checkpoints, exact resume after an interruption, refusal to overwrite."""

from __future__ import annotations

import io
import json

from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import interrupt_training, tiny_params, toy_trainer
from noisymlt.data.labels import read_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.config import resolve_run
from noisymlt.training.checkpoint import content_sha256
from noisymlt.training.schedule import lr_at
from noisymlt.training.trainer import Trainer


def make_trainer(tiny_toy, out, method="erm", **overrides):
    resolved = resolve_run(tiny_params(method, **overrides), "toy", method, 0.5, 0)
    return toy_trainer(tiny_toy, resolved, out)


def test_lr_schedule_warmup_and_steps():
    cfg = {"lr": 0.3, "lr_gamma": 0.1, "lr_steps": [5, 7], "warmup_iters": 100, "warmup_ratio": 1 / 3}
    assert lr_at(cfg, 0, 0, 35) == pytest.approx(0.1)
    assert lr_at(cfg, 0, 50, 35) == pytest.approx(0.3 * (1 / 3 + (2 / 3) * 50 / 100))
    assert lr_at(cfg, 2, 30, 35) == pytest.approx(0.3)  # iteration 100: warm-up over
    assert lr_at(cfg, 5, 0, 35) == pytest.approx(0.03)
    assert lr_at(cfg, 7, 3, 35) == pytest.approx(0.003)


def test_erm_run_writes_predictions_manifest_and_learns(tiny_toy, tmp_path):
    trainer = make_trainer(tiny_toy, tmp_path / "run", epochs=3, lr_steps=[3])
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.run()
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if after[k].is_floating_point())
    pred = np.load(tmp_path / "run" / "predictions.npz")
    assert list(pred["heads"]) == ["main"]
    scores = pred["scores_main"]
    assert scores.shape == (200, 20) and np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["run_id"] == trainer.run_id
    assert set(manifest["inputs"]) == {"train_labels", "test_labels", "split", "train_cache", "test_cache"}
    assert len(manifest["outputs"]["predictions"]["sha256"]) == 64
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3]
    assert all(np.isfinite(r["loss"]) for r in log)


def test_interrupted_run_resumes_to_the_same_result(tiny_toy, tmp_path, monkeypatch):
    full = make_trainer(tiny_toy, tmp_path / "full", epochs=3, lr_steps=[2])
    full.run()
    reference = np.load(tmp_path / "full" / "predictions.npz")["scores_main"]

    # Kill the second run in the middle of epoch 2 (after epoch 1's checkpoint was written).
    broken = make_trainer(tiny_toy, tmp_path / "resumed", epochs=3, lr_steps=[2])
    interrupt_training(monkeypatch, broken, broken.iters + 3)
    state = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=True)
    assert state["epoch"] == 1
    assert not (tmp_path / "resumed" / "predictions.npz").exists()

    resumed = make_trainer(tiny_toy, tmp_path / "resumed", epochs=3, lr_steps=[2])
    resumed.run()
    again = np.load(tmp_path / "resumed" / "predictions.npz")["scores_main"]
    np.testing.assert_array_equal(again, reference)  # bit-identical on the CPU


def test_checkpoint_of_another_config_is_refused_and_kept(tiny_toy, tmp_path):
    make_trainer(tiny_toy, tmp_path / "run", epochs=1).fit()
    ckpt = tmp_path / "run" / "checkpoint.pt"
    digest = ckpt.read_bytes()
    other = make_trainer(tiny_toy, tmp_path / "run", epochs=1, weight_decay=0.00123)
    with pytest.raises(NoisyMLTError, match="configuration changed"):
        other.fit()
    assert ckpt.read_bytes() == digest


def test_corrupt_image_names_the_file(tiny_toy, tmp_path):
    import shutil

    from noisymlt.data.labels import read_labels

    root = tmp_path / "images"
    shutil.copytree(tiny_toy["root"], root)
    victim = root / read_labels(tiny_toy["noisy"]).paths[0]
    victim.write_bytes(b"not a jpeg at all")
    resolved = resolve_run(tiny_params("erm", epochs=1, loader="pil"), "toy", "erm", 0.5, 0)  # the cache's own: test_imagecache
    trainer = Trainer(resolved, train_labels=tiny_toy["noisy"], test_labels=tiny_toy["test"], split=tiny_toy["split"],
                      train_images=root, test_images=root, out_dir=tmp_path / "run", device="cpu", progress=False)
    with pytest.raises(NoisyMLTError, match=victim.name):
        trainer.fit()


def _train_argv(tiny_toy, config: Path, out: Path) -> list[str]:
    return ["train", "--run-config", str(config), "--train-labels", str(tiny_toy["noisy"]), "--test-labels",
            str(tiny_toy["test"]), "--split", str(tiny_toy["split"]), "--train-images", "x", "--test-images", "x",
            "--out", str(out)]


def test_train_cli_rejects_unknown_method(tiny_toy, tmp_path, capsys):
    """A method the params do not define has no run config; a run config of an unknown family stops the command."""
    from noisymlt.cli import main
    from noisymlt.config import config_text, final_run

    params = tiny_params("erm", epochs=1)
    with pytest.raises(NoisyMLTError, match="unknown method 'no_such_method'"):
        final_run(params, "toy", "no_such_method", 0.5, 0, None)
    resolved = final_run(params, "toy", "erm", 0.5, 0, None)
    resolved["method_cfg"]["family"] = "no_such_family"
    config = tmp_path / "requested_config.json"
    config.write_text(config_text(resolved) + "\n")
    assert main(_train_argv(tiny_toy, config, tmp_path / "run")) == 2
    assert "unknown family 'no_such_family'" in capsys.readouterr().err


def test_train_cli_checks_the_run_config_against_its_selection(tiny_toy, tmp_path, capsys):
    """--selection: the run config must hold the values the choice file chose (the workflow's final runs)."""
    from noisymlt.cli import main
    from noisymlt.config import config_text, final_run
    from noisymlt.pipeline.train import _check_selection

    params = tiny_params("erm", epochs=1)
    choice = tmp_path / "stage1.choice.json"
    choice.write_text(json.dumps({"chosen": {"lr": 0.08}}))
    resolved = final_run(params, "toy", "erm", 0.5, 0, str(choice))
    assert resolved["train"]["lr"] == 0.08 and resolved["selected"]["values"] == {"lr": 0.08}
    _check_selection(resolved, str(choice))  # what the rule wrote holds the choice
    other = tmp_path / "other.choice.json"
    other.write_text(json.dumps({"chosen": {"lr": 0.2}}))
    for config_of, why in ((resolved, "chose {'lr': 0.2}, the run config holds {'lr': 0.08}"),
                           (final_run(params, "toy", "erm", 0.5, 0, None), "the run config holds no selection")):
        config = tmp_path / "requested_config.json"
        config.write_text(config_text(config_of) + "\n")
        assert main([*_train_argv(tiny_toy, config, tmp_path / "run"), "--selection", str(other)]) == 2
        assert why in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # stopped before anything was trained


def test_config_change_keeps_the_previous_run_and_switching_back_reuses_it(tiny_toy, tmp_path, monkeypatch):
    run = tmp_path / "run"
    first = make_trainer(tiny_toy, run, epochs=1)
    first.run()
    old = {name: (run / name).read_bytes() for name in ("checkpoint.pt", "predictions.npz", "manifest.json",
                                                         "run_config.json")}
    for name in ("predictions.npz", "manifest.json", "run_config.json", "noise_level.jsonl"):
        (run / name).unlink(missing_ok=True)  # Snakemake (and DVC) delete a job's outputs before rerunning it
    resolved = resolve_run(tiny_params("erm", epochs=1, weight_decay=0.00123), "toy", "erm", 0.5, 0)
    second = toy_trainer(tiny_toy, resolved, run, keep_stale=True)
    second.run()
    # the first run's checkpoint, predictions, manifest and config are kept under its run id, nothing is lost
    kept = run / "previous" / first.identity  # run id, inputs and code
    assert kept.name == f"{first.run_id}-{first.inputs_digest[:8]}-{first.code_digest[:8]}"
    assert {name: (kept / name).read_bytes() for name in old} == old
    assert torch.load(run / "checkpoint.pt", weights_only=True)["run_id"] == second.run_id
    # switching back: the finished checkpoint of the first configuration returns, nothing is retrained
    again = make_trainer(tiny_toy, run, epochs=1)
    again.keep_stale = True
    monkeypatch.setattr(again.method, "training_loss", lambda *a, **k: pytest.fail("retrained a finished run"))
    again.run()
    assert (run / "checkpoint.pt").read_bytes() == old["checkpoint.pt"]
    np.testing.assert_array_equal(np.load(run / "predictions.npz")["scores_main"],  # the first run's results
                                  np.load(io.BytesIO(old["predictions.npz"]))["scores_main"])
    assert (run / "previous" / second.identity / "checkpoint.pt").exists()


def flip_a_weight_byte(path) -> None:
    """One flipped bit in the middle of the checkpoint's largest tensor (torch stores tensors uncompressed)."""
    import struct
    import zipfile

    with zipfile.ZipFile(path) as archive:
        member = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[member.header_offset + 26:member.header_offset + 30])
    data[member.header_offset + 30 + name_len + extra_len + member.file_size // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_refused_or_the_workflow_starts_over(tiny_toy, tmp_path, caplog):
    run = tmp_path / "run"
    first = make_trainer(tiny_toy, run, epochs=1)
    first.run()
    manifest = json.loads((run / "manifest.json").read_text())
    recorded = manifest["checkpoint_content_sha256"]  # the trainer records its checkpoint's content hash
    assert recorded == torch.load(run / "checkpoint.pt", weights_only=True)["content_sha256"]
    assert str(np.load(run / "predictions.npz")["checkpoint_sha256"]) == recorded  # and the predictions too
    flip_a_weight_byte(run / "checkpoint.pt")
    damaged = (run / "checkpoint.pt").read_bytes()
    with pytest.raises(NoisyMLTError, match=r"checkpoint.pt: damaged checkpoint: its content does not match the "
                                            r"content hash it was saved with; refusing to resume"):
        make_trainer(tiny_toy, run, epochs=1).run()
    assert (run / "checkpoint.pt").read_bytes() == damaged  # refused, untouched
    # the workflow's trainer (keep_stale) keeps the damaged run aside, starts over and says so
    again = make_trainer(tiny_toy, run, epochs=1)
    again.keep_stale = True
    again.run()
    (kept,) = (run / "previous").glob("damaged-*")
    assert (kept / "checkpoint.pt").read_bytes() == damaged and (kept / "predictions.npz").exists()
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "restart" and "damaged checkpoint" in log[0]["reason"]
    assert log[0]["previous_run"] == str(kept) and [r["epoch"] for r in log[1:]] == [1]
    assert "training starts over" in caplog.text
    # retrained from scratch on the CPU: the first run's result again
    assert json.loads((run / "manifest.json").read_text())["checkpoint_content_sha256"] == recorded
    # a truncated checkpoint is damaged too
    (run / "checkpoint.pt").write_bytes(damaged[:1000])
    with pytest.raises(NoisyMLTError, match="damaged checkpoint: unreadable"):
        make_trainer(tiny_toy, run, epochs=1).fit()


def test_a_second_trainer_on_the_same_run_folder_stops(tiny_toy, tmp_path):
    first = make_trainer(tiny_toy, tmp_path / "run", epochs=1)
    second = make_trainer(tiny_toy, tmp_path / "run", epochs=1)
    with first.exclusive():
        with pytest.raises(NoisyMLTError, match=r"another trainer \(pid \d+\) is training this run folder"):
            second.fit()
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    second.fit()  # free again once the first lets go


def test_restart_keeps_the_old_run_and_starts_a_marked_log(tiny_toy, tmp_path):
    from noisymlt.cli import main

    run = tmp_path / "run"
    config = tmp_path / "run_config.json"
    config.write_text(json.dumps(resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)))
    args = ["train", "--run-config", str(config), "--train-labels", str(tiny_toy["noisy"]), "--test-labels",
            str(tiny_toy["test"]), "--split", str(tiny_toy["split"]), "--train-images", str(tiny_toy["root"]),
            "--test-images", str(tiny_toy["root"]), "--train-cache", str(tiny_toy["train_cache"]),
            "--test-cache", str(tiny_toy["test_cache"]), "--out", str(run), "--device", "cpu", "--no-progress"]
    assert main(args) == 0
    old = (run / "checkpoint.pt").read_bytes()
    assert main(args + ["--restart"]) == 0
    (kept,) = (run / "previous").glob("replaced-*")
    assert (kept / "checkpoint.pt").read_bytes() == old and (kept / "manifest.json").exists()
    lines = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert lines[0] == {"event": "restart", "previous_run": str(kept)} and [r["epoch"] for r in lines[1:]] == [1]


def test_checkpoint_trained_on_other_inputs_is_not_resumed(tiny_toy, tmp_path):
    import shutil

    from noisymlt.data.noise import make_noisy_table

    make_trainer(tiny_toy, tmp_path / "run", epochs=1).fit()
    other = tmp_path / "other_noisy.parquet"
    make_noisy_table(tiny_toy["train"], 0.5, 1, other)  # same config, another noisy copy
    resolved = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    with pytest.raises(NoisyMLTError, match="other inputs"):
        toy_trainer(tiny_toy, resolved, tmp_path / "run", train_labels=other).fit()
    history = toy_trainer(tiny_toy, resolved, tmp_path / "run", train_labels=other, keep_stale=True).fit()
    assert len(history) == 1  # trained afresh rather than resumed at epoch 1
    shutil.rmtree(tmp_path / "run")


@pytest.mark.parametrize("changed", ["decoded training images", "backbone weights"])
def test_a_checkpoint_of_other_images_or_backbone_weights_is_not_resumed(tiny_toy, tmp_path, changed):
    """The same configuration over re-decoded training images (a new image cache) or a re-pretrained backbone
    (another weights file at the same path) trains again instead of resuming the finished model."""
    import shutil

    import torchvision

    cache = tmp_path / "train_cache.npy"
    shutil.copy(tiny_toy["train_cache"], cache)
    shutil.copy(Path(tiny_toy["train_cache"]).with_suffix(".json"), cache.with_suffix(".json"))
    weights = tmp_path / "backbone.pt"
    torch.save(torchvision.models.resnet18(num_classes=10).state_dict(), weights)
    overrides = dict(epochs=1, backbone="resnet18", weights_path=str(weights), trainable="layer4", image_size=32)
    resolved = resolve_run(tiny_params("erm", **overrides), "toy", "erm", 0.5, 0)
    first = toy_trainer(tiny_toy, resolved, tmp_path / "run", train_cache=cache)
    first.run()
    if changed == "backbone weights":
        state = torch.load(weights, weights_only=True)
        state["layer1.0.conv1.weight"][0, 0, 0, 0] += 0.5
        torch.save(state, weights)
    else:
        array = np.load(cache, mmap_mode="r+")
        array[0, 0, 0, 0] = 255 - array[0, 0, 0, 0]  # one pixel of one training image
        array.flush()
        del array
    with pytest.raises(NoisyMLTError, match="other inputs"):
        toy_trainer(tiny_toy, resolved, tmp_path / "run", train_cache=cache).fit()
    again = toy_trainer(tiny_toy, resolved, tmp_path / "run", train_cache=cache, keep_stale=True)
    assert again.inputs_digest != first.inputs_digest
    assert len(again.fit()) == 1  # trained afresh rather than resumed at its last epoch
    log = json.loads((tmp_path / "run" / "train_log.jsonl").read_text().splitlines()[0])
    assert log["event"] == "restart" and "other inputs" in log["reason"]


def test_epoch_length_follows_the_schedule(tiny_toy, tmp_path):
    """[CL]: floor(N / batch) iterations whatever the sampler; [DB]: one pass over the sampler."""
    n = len(read_labels(tiny_toy["noisy"]))
    cl = make_trainer(tiny_toy, tmp_path / "cl", method="db_focal", epoch_length="batches")
    assert cl.iters == n // 16
    db = make_trainer(tiny_toy, tmp_path / "db", method="db_focal", epoch_length="sampler")
    counts = read_labels(tiny_toy["noisy"]).labels.sum(0)
    assert db.iters == int(counts.max() * len(counts) / 4) // 16 != cl.iters
    assert db.ctx.iterations_per_epoch == db.iters
    erm = make_trainer(tiny_toy, tmp_path / "erm", method="erm", epoch_length="sampler")
    assert erm.iters == n // 16  # the random sampler's length is N


def test_db_schedule_gives_db_iterations_on_voc_mlt(reference_dir):
    """[DB]'s class-aware epoch on the published VOC-MLT subset: int(775 * 20 / 4) images, 121 batches of 32."""
    import pandas as pd

    from noisymlt.data.sampling import StreamSpec
    from noisymlt.data.sampling import build_sampler
    from noisymlt.training.schedule import epoch_iterations

    labels = pd.read_csv(reference_dir / "voc_mlt_train_labels.csv", dtype={"image_id": str}).drop(
        columns="image_id").to_numpy()
    assert labels.shape == (1142, 20)
    stream = StreamSpec("main", build_sampler("class_aware", labels, 0), 32)
    assert epoch_iterations("sampler", [stream], 1142, 32) == 121
    assert epoch_iterations("batches", [stream], 1142, 32) == 35
    with pytest.raises(NoisyMLTError, match="epoch_length"):
        epoch_iterations("images", [stream], 1142, 32)


def test_cpu_threads_come_from_the_run_config(tiny_toy, tmp_path):
    before = torch.get_num_threads()
    try:
        trainer = make_trainer(tiny_toy, tmp_path / "run", epochs=1, cpu_threads=1)
        assert torch.get_num_threads() == 1 and trainer.cfg["train"]["cpu_threads"] == 1
        trainer.run()
        assert json.loads((tmp_path / "run" / "manifest.json").read_text())["cpu_threads"] == 1
    finally:
        torch.set_num_threads(before)


def test_inference_time_table_times_the_finished_run(tiny_toy, tmp_path):
    """The running-time table rebuilds a finished run from its folder, predicts what the run predicted,
    and writes the paper's layout with the device named."""
    import torch

    from noisymlt.report.inference_time import load_trained, time_predictions, write_table

    trainer = toy_trainer(tiny_toy, resolve_run(tiny_params("erm"), "toy", "erm", 0.5, 0), tmp_path / "run")
    trainer.run()
    rebuilt = load_trained(tmp_path / "run", tiny_toy["test"], tiny_toy["root"], tiny_toy["root"], "cpu")
    saved = np.load(tmp_path / "run" / "predictions.npz")
    np.testing.assert_array_equal(rebuilt.predict()["main"], saved["scores_main"])  # the run's own model
    np.testing.assert_allclose(rebuilt.predict(batch_size=1)["main"], saved["scores_main"], rtol=1e-5, atol=1e-6)
    rec = time_predictions(rebuilt, batch_size=4, trials=2)
    assert rec["images"] == len(rebuilt.test_table) and rec["trials"] == 2
    assert 0 < rec["model_s"] < rec["total_s"]
    write_table([{"method": "erm", **rec}], {"erm": "ERM"}, {"erm": 77.06}, "CPU test", tmp_path / "t.tex")
    md = (tmp_path / "t.md").read_text()
    assert "on CPU test" in md and "| Running time, batch 4 (s) | " in md and "| Paper, batch 1, RTX 2080Ti (s) | 77.06 |" in md
    # an unfinished run is refused, naming the checkpoint
    state = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    del state["content_sha256"]
    state["epoch"] = 1
    state["content_sha256"] = content_sha256(state)  # a checkpoint of epoch 1, not a damaged one
    torch.save(state, tmp_path / "run" / "checkpoint.pt")
    with pytest.raises(NoisyMLTError, match="checkpoint.pt: training stopped at epoch 1"):
        load_trained(tmp_path / "run", tiny_toy["test"], tiny_toy["root"], tiny_toy["root"], "cpu")


def test_new_layers_train_at_their_factor_and_a_methods_own_factor_comes_first():
    """train.new_layers_lr_mult: the layers that start from scratch (neck, head, partner BatchNorms, BBN's
    classifier) take the factor, the pretrained backbone keeps the recipe's rate, and a method's own factor from
    its reference (ML-GCN's GCN) takes precedence; at 1 every parameter is in one group."""
    from torch import nn

    from noisymlt.training.schedule import lr_groups

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
            self.branches = nn.ModuleDict({"random": nn.ModuleDict({"neck": nn.Linear(4, 4), "head": nn.Linear(4, 2)})})
            self.partner_bns = nn.ModuleDict({"random": nn.BatchNorm1d(4)})
            self.classifier = nn.Linear(4, 2)
            self.gcn = nn.Linear(2, 2)
            self.stage_c = nn.Linear(4, 4)  # BBN's copied last stage: pretrained, not new
            self.headless = nn.Linear(2, 2)  # a name that only contains 'head' is not a head

    net = Net()
    factor = {id(p): mult for mult, params in lr_groups(net, {"gcn.": 7.0}, 10.0) for p in params}
    by_name = {name: factor[id(p)] for name, p in net.named_parameters()}
    assert {n for n, f in by_name.items() if f == 10.0} == {
        "branches.random.neck.weight", "branches.random.neck.bias", "branches.random.head.weight",
        "branches.random.head.bias", "partner_bns.random.weight", "partner_bns.random.bias",
        "classifier.weight", "classifier.bias"}
    assert {n for n, f in by_name.items() if f == 7.0} == {"gcn.weight", "gcn.bias"}
    assert all(f == 1.0 for n, f in by_name.items() if n.split(".")[0] in ("backbone", "stage_c", "headless"))
    assert [mult for mult, _ in lr_groups(net, {}, 1.0)] == [1.0]


def test_build_optimizer_sets_each_group_at_its_factor_of_the_schedules_rate():
    """One SGD group per lr factor, in lr_groups' order; each step's rate is lr_at's times the group's factor, and the
    run's rates (the fit record's) are lr_at's at every step."""
    from torch import nn

    from noisymlt.training.schedule import build_optimizer, lr_groups

    net = nn.ModuleDict({"backbone": nn.Linear(3, 4), "head": nn.Linear(4, 2), "gcn": nn.Linear(2, 2)})
    cfg = {"lr": 0.3, "lr_gamma": 0.1, "lr_steps": [1], "warmup_iters": 3, "warmup_ratio": 0.25, "epochs": 2,
           "momentum": 0.9, "weight_decay": 1e-4, "new_layers_lr_mult": 10}
    optimizer, schedule = build_optimizer(net, cfg, {"gcn.": 7.0}, 4, torch.device("cpu"))
    groups = lr_groups(net, {"gcn.": 7.0}, 10)
    assert [g["params"] for g in optimizer.param_groups] == [params for _, params in groups]
    assert [(g["lr"], g["momentum"], g["weight_decay"]) for g in optimizer.param_groups] == [(0.3, 0.9, 1e-4)] * 3
    for epoch, it in ((0, 0), (0, 2), (1, 1)):
        lr = schedule.apply(optimizer, epoch, it)
        assert lr == lr_at(cfg, epoch, it, 4)
        assert [g["lr"] for g in optimizer.param_groups] == [lr * 1.0, lr * 10.0, lr * 7.0]
    assert schedule.rates() == [lr_at(cfg, e, i, 4) for e in range(2) for i in range(4)]


def test_new_layers_lr_mult_is_validated():
    from noisymlt.errors import NoisyMLTError
    from noisymlt.config import load_params, validate_params

    params = load_params(Path(__file__).resolve().parents[1] / "params.yaml")
    for bad in (0, -1, "fast"):
        params["train"]["new_layers_lr_mult"] = bad
        with pytest.raises(NoisyMLTError, match="new_layers_lr_mult"):
            validate_params(params)



@pytest.mark.default_checkpoint_interval
def test_checkpoints_wait_their_interval_and_a_resume_drops_the_epochs_after_the_checkpoint(tiny_toy, tmp_path,
                                                                                            monkeypatch):
    saved = []
    original = Trainer.save_checkpoint
    monkeypatch.setattr(Trainer, "save_checkpoint",
                        lambda self, epoch, history: (saved.append(epoch), original(self, epoch, history)))
    assert Trainer.checkpoint_seconds == 30.0
    make_trainer(tiny_toy, tmp_path / "full", epochs=3, lr_steps=[2]).run()
    assert saved == [3]  # seconds-long epochs: only the last one is saved
    reference = np.load(tmp_path / "full" / "predictions.npz")["scores_main"]

    saved.clear()
    broken = make_trainer(tiny_toy, tmp_path / "resumed", epochs=3, lr_steps=[2])
    interrupt_training(monkeypatch, broken, 2 * broken.iters + 1)  # in epoch 3, no checkpoint written yet
    log_path = tmp_path / "resumed" / "train_log.jsonl"
    assert saved == [] and [json.loads(line)["epoch"] for line in log_path.read_text().splitlines()] == [1, 2]
    make_trainer(tiny_toy, tmp_path / "resumed", epochs=3, lr_steps=[2]).run()  # starts over: epochs 1-3 again
    np.testing.assert_array_equal(np.load(tmp_path / "resumed" / "predictions.npz")["scores_main"], reference)
    assert [json.loads(line)["epoch"] for line in log_path.read_text().splitlines()] == [1, 2, 3]


def _rewrite_checkpoint(path, **changes) -> None:
    """The checkpoint at ``path`` as another job would have written it: ``changes`` applied (None removes a
    key), its content hash made anew so that only the changed fields tell it apart."""
    state = torch.load(path, weights_only=True)
    state.pop("content_sha256")
    for key, value in changes.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    state["content_sha256"] = content_sha256(state)
    torch.save(state, path)


@pytest.mark.parametrize("recorded", ["0123456789abcdef", None], ids=["other code", "no code recorded"])
def test_a_checkpoint_of_other_code_is_never_resumed(tiny_toy, tmp_path, recorded, caplog):
    """Run id and inputs match, the code does not: a direct call refuses it, the workflow keeps it in
    previous/ and trains from epoch 0, saying so; the new result records the code that trained it."""
    run = tmp_path / "run"
    first = make_trainer(tiny_toy, run, epochs=2)
    first.run()
    reference = np.load(run / "predictions.npz")["scores_main"]
    _rewrite_checkpoint(run / "checkpoint.pt", code=recorded)
    foreign = (run / "checkpoint.pt").read_bytes()
    with pytest.raises(NoisyMLTError, match=r"checkpoint.pt: checkpoint was trained by other code \("
                                            rf"{recorded or 'not recorded: an older version'}, this job runs "
                                            rf"{first.code_digest}\); refusing to resume"):
        make_trainer(tiny_toy, run, epochs=2).run()
    assert (run / "checkpoint.pt").read_bytes() == foreign  # refused, untouched

    again = make_trainer(tiny_toy, run, epochs=2)
    again.keep_stale = True
    steps = {"n": 0}
    original = again.method.training_loss

    def counted(*args, **kwargs):
        steps["n"] += 1
        return original(*args, **kwargs)

    again.method.training_loss = counted
    again.run()
    assert steps["n"] == 2 * again.iters  # every epoch trained again, none resumed
    kept = run / "previous" / f"{first.run_id}-{first.inputs_digest[:8]}-{(recorded or 'unknown')[:8]}"
    assert (kept / "checkpoint.pt").read_bytes() == foreign and (kept / "predictions.npz").exists()
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "restart" and "trained by other code" in log[0]["reason"]
    assert log[0]["previous_run"] == str(kept) and [r["epoch"] for r in log[1:]] == [1, 2]
    assert "training starts from epoch 0" in caplog.text
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    assert state["code"] == again.code_digest == json.loads((run / "manifest.json").read_text())["code_digest"]
    predictions = np.load(run / "predictions.npz")
    assert str(predictions["code_digest"]) == again.code_digest
    np.testing.assert_array_equal(predictions["scores_main"], reference)  # the same code retrains the same model


def test_a_kept_run_of_this_code_comes_back_and_one_of_other_code_does_not(tiny_toy, tmp_path, monkeypatch):
    """previous/ is keyed by run id, inputs and code: a finished run kept there is restored only for the very
    code that trained it."""
    run = tmp_path / "run"
    first = make_trainer(tiny_toy, run, epochs=1)
    first.run()
    finished = (run / "checkpoint.pt").read_bytes()
    other = resolve_run(tiny_params("erm", epochs=1, weight_decay=0.00123), "toy", "erm", 0.5, 0)
    toy_trainer(tiny_toy, other, run, keep_stale=True).run()  # another configuration: the first run goes aside
    assert (run / "previous" / first.identity / "checkpoint.pt").read_bytes() == finished
    # the first configuration again, under other code: its kept run does not come back, it retrains
    again = make_trainer(tiny_toy, run, epochs=1)
    again.keep_stale = True
    import noisymlt.core.codedeps as codedeps

    monkeypatch.setattr(again, "code_digest", "fedcba9876543210")  # as if the source had been edited
    monkeypatch.setattr(codedeps, "fresh_digest", lambda *entries: "fedcba9876543210")
    again.run()
    assert torch.load(run / "checkpoint.pt", weights_only=True)["code"] == "fedcba9876543210"
    assert (run / "previous" / first.identity / "checkpoint.pt").read_bytes() == finished  # still kept


def test_a_job_whose_code_changed_since_it_was_planned_stops_before_training(tiny_toy, tmp_path):
    resolved = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    with pytest.raises(NoisyMLTError, match=r"planned this job for code 0000000000000000, the package source now "
                                            r"gives [0-9a-f]{16}.*nothing was trained"):
        toy_trainer(tiny_toy, resolved, tmp_path / "run", expect_code="0000000000000000")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_a_result_is_not_recorded_under_code_that_changed_while_it_ran(tiny_toy, tmp_path, monkeypatch):
    """The package source moves on during the job: nothing is recorded under either code; the checkpoint
    names the code that trained it, so the rerun retrains under the code on disk."""
    import noisymlt.core.codedeps as codedeps

    trainer = make_trainer(tiny_toy, tmp_path / "run", epochs=1)
    monkeypatch.setattr(codedeps, "fresh_digest", lambda *entries: "5555555555555555")  # the disk, at the end
    with pytest.raises(NoisyMLTError, match=rf"the package source changed while this job ran \(it ran code "
                                            rf"{trainer.code_digest}, the files on disk now give 5555555555555555\)"):
        trainer.run()
    assert not (tmp_path / "run" / "predictions.npz").exists() and not (tmp_path / "run" / "manifest.json").exists()
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["code"] == trainer.code_digest


def test_a_cut_off_last_log_line_is_dropped_on_resume(tiny_toy, tmp_path, monkeypatch, caplog):
    """A full disk or a kill mid-append leaves half a record: the resume drops it with a warning and gives
    the uninterrupted run's result."""
    full = make_trainer(tiny_toy, tmp_path / "full", epochs=3, lr_steps=[2])
    full.run()
    broken = make_trainer(tiny_toy, tmp_path / "resumed", epochs=3, lr_steps=[2])
    interrupt_training(monkeypatch, broken, at_call=broken.iters + 2)  # in epoch 2, after epoch 1's checkpoint
    log_name = "train_log.jsonl"
    with open(tmp_path / "resumed" / log_name, "a") as f:
        f.write('{"epoch": 2, "lr": 0.00881720')
    resumed = make_trainer(tiny_toy, tmp_path / "resumed", epochs=3, lr_steps=[2])
    resumed.run()
    assert f"{log_name}: dropped a cut-off last line" in caplog.text
    log = [json.loads(line) for line in (tmp_path / "resumed" / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3]
    np.testing.assert_array_equal(np.load(tmp_path / "resumed" / "predictions.npz")["scores_main"],
                                  np.load(tmp_path / "full" / "predictions.npz")["scores_main"])


def test_a_damaged_log_line_before_the_last_is_reported_not_dropped(tmp_path):
    from noisymlt.core.jsonlog import read_records

    path = tmp_path / "train_log.jsonl"
    path.write_text('{"epoch": 1}\n{"epoch": 2, "lr"\n{"epoch": 3}\n')
    with pytest.raises(NoisyMLTError, match=r"train_log.jsonl: line 2 is not JSON .*move it away"):
        read_records(path)
    path.write_text('{"epoch": 1}\n{"epoch": 2, "lr"')
    assert read_records(path) == [{"epoch": 1}]
