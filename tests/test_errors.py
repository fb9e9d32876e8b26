"""Faults that must neither block a run for good nor hide: a full disk (a real, small tmpfs), a folder the
user may not write, params that cannot work. Each gives one line naming the file or key and the cause, and
nothing half-written is trusted later."""

from __future__ import annotations

import errno
import json
import logging
import subprocess

import numpy as np
import pytest

from helpers import tiny_params, toy_trainer
from noisymlt.config import resolve_run


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of a given size under tmp_path (root only: skipped where mounting is not allowed)."""
    mounted = []

    def mount(size: int):
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode})")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


def _train_cli(tiny_toy, resolved: dict, out, tmp_path) -> list[str]:
    config = tmp_path / f"config_{out.name}.json"
    config.write_text(json.dumps(resolved))
    return ["train", "--run-config", str(config), "--train-labels", str(tiny_toy["noisy"]),
            "--test-labels", str(tiny_toy["test"]), "--split", str(tiny_toy["split"]),
            "--train-images", str(tiny_toy["root"]), "--test-images", str(tiny_toy["root"]),
            "--train-cache", str(tiny_toy["train_cache"]), "--test-cache", str(tiny_toy["test_cache"]),
            "--out", str(out), "--device", "cpu", "--no-progress", "--keep-stale"]


def test_a_full_disk_stops_with_one_line_and_the_rerun_resumes_to_the_same_result(tiny_toy, tmp_path, small_disk,
                                                                                   capsys, caplog):
    from noisymlt.cli import main

    resolved = resolve_run(tiny_params("erm", epochs=3, lr_steps=[2]), "toy", "erm", 0.5, 0)
    reference = tmp_path / "reference"
    toy_trainer(tiny_toy, resolved, reference).run()
    size = (reference / "checkpoint.pt").stat().st_size
    # room for one checkpoint and the logs, not for the next checkpoint beside it
    disk = small_disk(size + size // 2)
    run = disk / "run"
    assert main(_train_cli(tiny_toy, resolved, run, tmp_path)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("noisymlt train:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{run}/checkpoint.pt.tmp: No space left on device" in lines[0] and "the disk is full" in lines[0]
    assert not (run / "checkpoint.pt.tmp").exists() and not (run / "predictions.npz").exists()
    import torch

    # epoch 1's checkpoint, whole: the next one did not fit beside it
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    # space again: the run resumes from epoch 1 and ends where an uninterrupted run ends
    subprocess.run(["mount", "-o", f"remount,size={20 * size}", str(disk)], check=True)
    caplog.set_level(logging.INFO)
    assert main(_train_cli(tiny_toy, resolved, run, tmp_path)) == 0
    assert f"resumed {run}/checkpoint.pt from epoch 1" in caplog.text
    np.testing.assert_array_equal(np.load(run / "predictions.npz")["scores_main"],
                                  np.load(reference / "predictions.npz")["scores_main"])
    assert (run / "checkpoint.pt").read_bytes() == (reference / "checkpoint.pt").read_bytes()


def test_a_folder_it_may_not_write_gives_one_line(tiny_toy, tmp_path, capsys, monkeypatch):
    """(The tests run as root, whom permissions do not stop: the denial is the operating system's error,
    raised where the trainer opens its lock file.)"""
    from noisymlt.cli import main
    import noisymlt.core.locks

    def denied(path):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(noisymlt.core.locks, "try_lock", denied)
    resolved = resolve_run(tiny_params("erm", epochs=1), "toy", "erm", 0.5, 0)
    run = tmp_path / "run"
    assert main(_train_cli(tiny_toy, resolved, run, tmp_path)) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == (
        f"noisymlt train: error: {run}/.train.lock: Permission denied (this user may not write there: check the "
        "folder's owner and permissions)")
    assert "Traceback" not in err
