"""Fast steps (noisymlt.training.speed): compiled against eager, sync-free epoch sums, fused SGD on CUDA only."""

from __future__ import annotations

import shutil

import pytest
import torch

from helpers import tiny_params, toy_trainer
from noisymlt.config import resolve_run
from noisymlt.errors import NoisyMLTError
from noisymlt.training.schedule import build_optimizer
from noisymlt.training.speed import StepLog, compile_mode

# compiled and eager kernels sum in other orders: after 4 SGD steps of ERM on resnet_tiny (neck dropout 0.5) the
# weights agreed to 6e-8 on an AMD EPYC (AVX-512); 1e-5 leaves room for other kernels and is 100x below what the
# steps move them (asserted), so a wrong graph or another dropout draw (measured: 0.027) fails
COMPILE_ATOL = 1e-5


def _erm(tiny_toy, out, **overrides):
    over = {"backbone": "resnet_tiny", "trainable": "layer3", "frozen_bn": True, "trunk_cache_views": 0,
            "epochs": 1, "lr_steps": [1], **overrides}
    resolved = resolve_run(tiny_params("erm", **over), "toy", "erm", 0.5, 0)
    return toy_trainer(tiny_toy, resolved, out, limit_iters=4)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile on the CPU builds C++ kernels: no C++ compiler here")
def test_compiled_erm_steps_equal_eager_within_tolerance(tiny_toy, tmp_path):
    # one after the other, as two jobs would: each trainer seeds torch's generator (dropout) when it is built
    eager = _erm(tiny_toy, tmp_path / "eager")
    assert not eager.compiled
    start = {k: v.clone() for k, v in eager.model.state_dict().items()}
    h_eager = eager.fit()
    compiled = _erm(tiny_toy, tmp_path / "compiled", compile=True)
    assert any(n.endswith("backbone.layer3") for n in compiled.compiled) and \
        any(n.endswith("head") for n in compiled.compiled), compiled.compiled
    assert all(torch.equal(start[k], v) for k, v in compiled.model.state_dict().items())  # same keys, same init
    h_compiled = compiled.fit()
    moved = max((eager.model.state_dict()[k] - start[k]).abs().max().item() for k in start
                if start[k].is_floating_point())
    assert moved > 100 * COMPILE_ATOL  # the steps changed the weights far more than the tolerance
    diff = max((eager.model.state_dict()[k] - v).abs().max().item() for k, v in compiled.model.state_dict().items()
               if v.is_floating_point())
    assert diff <= COMPILE_ATOL, f"compiled vs eager weights differ by {diff:.3g}"
    assert h_compiled[0]["loss"] == pytest.approx(h_eager[0]["loss"], abs=1e-5)
    x = torch.randn(4, 3, 32, 32)
    eager.model.eval(), compiled.model.eval()
    with torch.no_grad():
        assert torch.allclose(eager.model(x), compiled.model(x), atol=1e-4)
    assert compiled.model.backbone.layer3._compiled_call_impl is not None  # compiled in place


def test_compile_mode_uses_cuda_graphs_only_on_a_gpu():
    assert compile_mode(torch.device("cuda", 0)) == "reduce-overhead"
    assert compile_mode(torch.device("cpu")) == "default"


def test_sgd_is_fused_on_cuda_only():
    cfg = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}
    cpu, _ = build_optimizer(torch.nn.Linear(3, 1), cfg, {}, 1, torch.device("cpu"))
    assert not cpu.defaults.get("fused")  # the CPU's own bits
    if torch.cuda.is_available():
        gpu, _ = build_optimizer(torch.nn.Linear(3, 1).cuda(), cfg, {}, 1, torch.device("cuda"))
        assert gpu.defaults["fused"] is True


def test_step_log_sums_equal_per_step_python_floats_to_the_bit():
    g = torch.Generator().manual_seed(0)
    values = [torch.rand((), generator=g, dtype=torch.float32) * 7 for _ in range(500)]
    log = StepLog(torch.device("cpu"))
    expected = 0.0
    for it, v in enumerate(values):
        log.add(it, v, {"loss": v, "count": 2})
        expected += float(v)
    means = log.means(500)
    assert means["loss"] == expected / 500  # exact: float64 sums in the same order
    assert means["loss"] != float(torch.stack(values).sum()) / 500  # a float32 sum would not be
    assert means["count"] == 2.0
    log.check_finite("erm", 0)  # all finite: no error


def test_step_log_names_the_first_non_finite_iteration():
    log = StepLog(torch.device("cpu"))
    for it, v in enumerate([1.0, 2.0, float("nan"), float("inf"), 3.0]):
        log.add(it, torch.tensor(v), {"loss": torch.tensor(v)})
    with pytest.raises(NoisyMLTError, match="non-finite loss at epoch 3 iteration 2"):
        log.check_finite("erm", 2)
