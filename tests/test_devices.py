"""GPU choice: per-GPU lock files spread concurrent jobs over cards; a CUDA smoke test when there is one."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

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
