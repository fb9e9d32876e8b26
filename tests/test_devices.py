"""GPU choice: per-GPU lock files spread concurrent jobs over cards, the cards of a SLURM allocation included; a
CUDA smoke test when there is one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from helpers import CUDA_STAND_IN
from noisymlt.training.devices import acquire_gpu, select_device

PROBE = "import sys; from noisymlt.training.devices import acquire_gpu; print(acquire_gpu(int(sys.argv[1]), __import__('pathlib').Path(sys.argv[2])))"


def other_process_gets(num_gpus: int, lock_dir) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, str(num_gpus), str(lock_dir)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_concurrent_jobs_lock_different_gpus(tmp_path):
    assert acquire_gpu(2, tmp_path) == 0  # this process holds card 0 for its lifetime
    assert other_process_gets(2, tmp_path) == "1"  # a concurrent job gets the other card
    assert other_process_gets(1, tmp_path) == "None"  # no free card left
    # a job that ended released its lock: the next one gets card 1 again
    assert other_process_gets(2, tmp_path) == "1"


# A job that takes a slot and holds it until its stdin closes (a training run's lifetime).
HOLDER = ("import sys, pathlib; from noisymlt.training.devices import acquire_gpu; "
          "print(acquire_gpu(int(sys.argv[1]), pathlib.Path(sys.argv[2]), slots=int(sys.argv[3])), flush=True); "
          "sys.stdin.read()")


def start_holder(num_gpus: int, lock_dir, slots: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(num_gpus), str(lock_dir), str(slots)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=60)


def test_slots_fill_the_least_loaded_card_first_and_cap_each_card(tmp_path):
    """Two fake cards with 3 slots each: jobs alternate cards, a 7th finds none, and a freed slot goes to
    the card that has fewest runs, whichever slot index it was."""
    holders = []
    try:
        got = []
        for _ in range(6):
            holders.append(start_holder(2, tmp_path, 3))
            got.append(holders[-1].stdout.readline().strip())
        assert got == ["0", "1", "0", "1", "0", "1"]
        probe = subprocess.run([sys.executable, "-c", HOLDER, "2", str(tmp_path), "3"], input="", text=True,
                               capture_output=True, timeout=120)
        assert probe.stdout.strip() == "None"
        assert sorted(p.name for p in tmp_path.glob("*.lock")) == [f"gpu{i}.slot{j}.lock" for i in (0, 1)
                                                                   for j in range(3)]
        stop(holders.pop(1))  # card 1 drops to 2 runs (its slot 0 frees), card 0 keeps 3
        stop(holders.pop(2))  # card 1 drops to 1 run (slot 1)
        stop(holders.pop(0))  # card 0 drops to 2 runs (slot 0)
        holders.append(start_holder(2, tmp_path, 3))
        assert holders[-1].stdout.readline().strip() == "1"  # 1 run on card 1 < 2 on card 0
        holders.append(start_holder(2, tmp_path, 3))
        assert holders[-1].stdout.readline().strip() in ("0", "1")  # 2 and 2: lowest index first
    finally:
        for proc in holders:
            stop(proc)


def test_concurrent_jobs_never_exceed_the_slots_of_a_card(tmp_path):
    """Ten jobs started at once on 2 fake cards x 3 slots: six get a slot, three per card, four get none."""
    procs = [start_holder(2, tmp_path, 3) for _ in range(10)]
    try:
        got = [p.stdout.readline().strip() for p in procs]
    finally:
        for proc in procs:
            stop(proc)
    assert sorted(got) == ["0"] * 3 + ["1"] * 3 + ["None"] * 4


def test_one_slot_per_card_is_todays_exclusive_lock(tmp_path):
    assert acquire_gpu(3, tmp_path, slots=1) == 0
    assert other_process_gets(3, tmp_path) == "1"
    with pytest.raises(ValueError, match="at least 1"):
        acquire_gpu(2, tmp_path, slots=0)


def test_runs_per_gpu_comes_from_the_argument_else_the_environment(monkeypatch):
    from noisymlt.training.devices import runs_per_gpu

    monkeypatch.delenv("NOISYMLT_RUNS_PER_GPU", raising=False)
    assert runs_per_gpu() == 1  # safe default: one run per card
    monkeypatch.setenv("NOISYMLT_RUNS_PER_GPU", "4")
    assert runs_per_gpu() == 4 and runs_per_gpu(2) == 2
    monkeypatch.setenv("NOISYMLT_RUNS_PER_GPU", "four")
    with pytest.raises(ValueError, match="NOISYMLT_RUNS_PER_GPU"):
        runs_per_gpu()


def test_select_device_takes_slots_on_fake_cards_and_honours_cuda_visible_devices(tmp_path, monkeypatch):
    import noisymlt.training.devices as devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("NOISYMLT_GPU_LOCK_DIR", str(tmp_path))
    monkeypatch.setattr(devices, "_held_locks", [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # SLURM assigned a card: no lock taken
    assert select_device("auto", 2) == torch.device("cuda:0") and not list(tmp_path.glob("*.lock"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    got = [select_device("auto", 2) for _ in range(5)]  # this process plays five jobs
    assert got == [torch.device(f"cuda:{i}") for i in (0, 1, 0, 1, 0)]  # the fifth finds no slot: cuda:0
    assert len(devices._held_locks) == 4
    for handle in devices._held_locks:
        handle.close()


def test_slot_folder_is_private_to_a_slurm_allocation_and_on_the_node(monkeypatch):
    from noisymlt.training import cards
    from noisymlt.training.devices import lock_dir

    for var in ("NOISYMLT_GPU_LOCK_DIR", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    workstation = cards.slot_folder()
    assert workstation == lock_dir()  # a workstation's slots are where they always were
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # indices 0, 1 are this set's: slots of their own
    assert cards.slot_folder() == lock_dir() / "visible-2,3"
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    first = cards.slot_folder()
    monkeypatch.setenv("SLURM_JOB_ID", "778")
    second = cards.slot_folder()
    assert first != second != workstation and first.parent == second.parent
    assert first.name.startswith("slurm-job777-") and first.name.endswith(socket.gethostname().split(".")[0])
    if cards.NODE_LOCAL.is_dir():  # tmpfs: the node's own memory, never a shared file system
        assert cards.NODE_LOCAL in first.parents
    monkeypatch.setenv("NOISYMLT_GPU_LOCK_DIR", "/somewhere/else")
    assert cards.slot_folder() == Path("/somewhere/else")


def test_choose_device_leaves_a_forced_device_alone_and_falls_back_to_the_cpu(monkeypatch):
    from noisymlt.training.cards import choose_device

    assert choose_device("cpu") == "cpu" and choose_device("cuda:3") == "cuda:3"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_device("auto", 2) == "cpu"


# A train job inside a SLURM allocation that holds four cards (a packed group job: `--gpus=4`, four runs in one
# job step, each seeing all four cards), as the train command's choose_device sees it: CUDA available with the allocation's cards.
# It prints its card and holds it until its stdin closes (a training run's lifetime).
SLURM_RUN = (CUDA_STAND_IN + "from noisymlt.training.cards import choose_device; "
             "print(choose_device('auto', int(sys.argv[1])).split(':')[1], flush=True); sys.stdin.read()")


def slurm_group_env(job_id: str, cards: str = "0,1,2,3") -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "NOISYMLT_GPU_LOCK_DIR"}
    # what srun gives each step of a 4-card allocation (the jobstep executor keeps SLURM_JOB_ID for the runs)
    return {**env, "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0", "CUDA_VISIBLE_DEVICES": cards,
            "SLURM_STEP_GPUS": cards, "SLURM_GPUS_ON_NODE": str(len(cards.split(",")))}


def start_runs(n: int, slots: int, env: dict) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", SLURM_RUN, str(slots)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env) for _ in range(n)]


@pytest.fixture
def slurm_job_ids():
    """Fresh allocation ids, and their lock folders removed afterwards (they live in the node's /dev/shm)."""
    from noisymlt.training import cards

    ids = [f"{os.getpid()}{i}{time.monotonic_ns() % 10**6}" for i in range(2)]
    yield ids
    for job in ids:
        for base in (cards.NODE_LOCAL, Path(tempfile.gettempdir())):
            for path in (base / "noisymlt-gpu-locks").glob(f"slurm-job{job}-*"):
                shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("runs, slots", [(4, 1), (8, 2)])
def test_runs_packed_in_one_slurm_allocation_use_every_card_it_holds(slurm_job_ids, runs, slots):
    """4 runs of a 4-card job: 4 different cards; 8 runs with 2 slots a card: 2 each. A second allocation on the
    same node whose cards SLURM also numbers 0-3 (cgroup-renumbered) gets its own slots: its first run takes
    its card 0 although the first job holds every slot of its own."""
    first = start_runs(runs, slots, slurm_group_env(slurm_job_ids[0]))
    second = []
    try:
        cards = sorted(int(p.stdout.readline()) for p in first)
        assert cards == sorted(list(range(4)) * (runs // 4))
        second = start_runs(1, slots, slurm_group_env(slurm_job_ids[1]))
        assert second[0].stdout.readline().strip() == "0"
    finally:
        for proc in first + second:
            stop(proc)


def test_cpu_fallback_and_forced_device():
    assert select_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert select_device("auto") == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_channels_last_training_step():
    from noisymlt.losses import BCELoss
    from noisymlt.models.backbones import build_backbone
    from noisymlt.models.branch import Branch

    device = select_device("auto")
    model = Branch(build_backbone("resnet50"), 20, trainable="layer4", frozen_bn=True).to(device)
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(8, 3, 224, 224, device=device).contiguous(memory_format=torch.channels_last)
    y = (torch.rand(8, 20, device=device) < 0.2).float()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = BCELoss()(model(x), y)
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
