"""noisymlt.core.heap: every `noisymlt` command keeps the memory a step frees, which changes no result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# 20 steps, each holding twelve blocks of 1-4 MiB and one of 48 MiB (as a network's activations on a small and a
# large batch) and freeing them; prints the minor page faults the steps cost
STEPS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from noisymlt.core.heap import keep_freed_memory
    print(sorted(keep_freed_memory()))
start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(20):
    held = [np.ones((1 << 20) * (1 + k % 4), dtype=np.uint8) for k in range(12)] + [np.ones(48 << 20, np.uint8)]
    del held
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
"""

# two SGD steps of a ResNet-18 at 64 px on one thread (activations of 0.1-1 MiB: above glibc's first mmap
# threshold), then a prediction; prints the digests of the weights and of the scores
TRAIN = """
import hashlib, sys
import torch, torchvision
if sys.argv[1] == "keep":
    from noisymlt.core.heap import keep_freed_memory
    keep_freed_memory()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=20)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    x, y = torch.randn(4, 3, 64, 64), (torch.rand(4, 20) > 0.8).float()
    torch.nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
    opt.step()
    opt.zero_grad()
model.eval()
with torch.no_grad():  # then predictions on one batch of 128 (the stem's output alone 32 MiB: above any mmap threshold)
    scores = model(torch.randn(128, 3, 64, 64))
print(hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
print(hashlib.sha256(scores.numpy().tobytes()).hexdigest())
"""


def _start(code: str, mode: str, **env: str) -> subprocess.Popen:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.update(PYTHONPATH=str(ROOT / "src"), **env)
    return subprocess.Popen([sys.executable, "-c", code, mode], stdout=subprocess.PIPE, text=True, env=clean)


def _lines(proc: subprocess.Popen) -> list[str]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    return out.split("\n")[:-1]


def _run(code: str, mode: str, **env: str) -> list[str]:
    return _lines(_start(code, mode, **env))


def _glibc() -> bool:
    import platform

    return platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _glibc(), reason="glibc's heap only")
def test_freed_blocks_stay_in_the_heap_instead_of_faulting_back_in():
    plain = int(_run(STEPS, "plain")[-1])
    settings, kept = _run(STEPS, "keep")
    assert settings == "['MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_']"
    # the steps allocate 1.5 GiB in all, about 400,000 pages: by default the 48 MiB block faults in anew every step
    # (beyond glibc's largest mmap threshold); kept, each page faults in once
    assert plain > 50_000 and int(kept) < plain / 5, (plain, kept)


@pytest.mark.skipif(not _glibc(), reason="glibc's heap only")
def test_glibcs_own_switches_in_the_environment_win():
    assert _run(STEPS, "keep", MALLOC_TRIM_THRESHOLD_="131072")[0] == "['MALLOC_MMAP_MAX_']"


def test_training_and_prediction_give_the_same_bytes():
    keep, plain = _start(TRAIN, "keep"), _start(TRAIN, "plain")  # side by side: each pays torch's import
    assert _lines(keep) == _lines(plain)


def test_every_command_sets_it_before_its_step(monkeypatch):
    from noisymlt import cli

    called = []
    monkeypatch.setattr(cli, "keep_freed_memory", lambda: called.append(True))
    assert cli.main(["code-deps", "--command", "parse"]) == 0
    assert called == [True]
