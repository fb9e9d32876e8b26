"""The CUDA path: a bf16 step of every method family, the shared frozen trunk at bf16, GPU placement of
concurrent train jobs, and a GPU-trained checkpoint predicted on the CPU. Every test here needs a CUDA
device (marker `gpu`) and skips without one; scripts/device_check.sh runs them first thing on a GPU."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import tiny_params, toy_trainer
from noisymlt.config import load_params, resolve_run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

REPO = Path(__file__).resolve().parents[1]
# one method per family (noisymlt.methods.FAMILY_MODULES)
FAMILY_METHODS = {"single": "db_focal", "bbn": "bbn", "mlgcn": "mlgcn", "dividemix": "dividemix", "colearning": "ours"}


def bf16_config(method: str, **train) -> dict:
    params = tiny_params(method, precision="bf16", channels_last=True, **train)
    if method == "dividemix":  # one warm-up epoch, so that the second one takes a MixMatch step
        params["methods"]["dividemix"]["warmup_epochs"] = 1
    return resolve_run(params, "toy", method, 0.5, 0)


@pytest.mark.parametrize("family", sorted(FAMILY_METHODS))
def test_one_bf16_training_step_of_every_family_on_cuda(tiny_toy, tmp_path, family):
    cfg = bf16_config(FAMILY_METHODS[family], epochs=2 if family == "dividemix" else 1)
    trainer = toy_trainer(tiny_toy, cfg, tmp_path / "run", limit_iters=1, device="cuda")
    conv_dtypes = set()
    for m in trainer.model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(lambda _m, _i, out: conv_dtypes.add(out.dtype))
    history = trainer.fit()
    assert torch.bfloat16 in conv_dtypes  # autocast ran the convolutions in bf16
    losses = {k: v for k, v in history[-1].items() if k.startswith("loss")}
    assert losses and all(np.isfinite(v) for v in losses.values()), history
    grads = [p.grad for p in trainer.model.parameters() if p.requires_grad]
    assert grads and all(g is not None and g.is_cuda for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0


def test_shared_frozen_trunk_equals_the_unshared_path_at_bf16_on_cuda(tmp_path):
    """Both branches' frozen stages run once per stream (shared) or per branch (unshared): the same
    function, so the same loss and gradients up to bf16 rounding."""
    from noisymlt.methods import FAMILIES, TrainContext
    from noisymlt.models.backbones import TinyResNet
    from noisymlt.data.sampling import EpochPlan

    torch.manual_seed(3)
    weights = tmp_path / "trunk.pt"  # one file for both branches: identical frozen trunks
    torch.save(TinyResNet().state_dict(), weights)
    params = load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")
    cfg = resolve_run(params, "toy", "ours", 0.5, 0)
    cfg["train"].update({"backbone": "resnet_tiny", "weights_path": str(weights), "trainable": "layer4",
                         "frozen_bn": True, "batch_size": 8, "balanced_batch_size": 16, "image_size": 32})
    g = torch.Generator().manual_seed(1)
    noisy = (torch.rand(64, 20, generator=g) < 0.2).float()
    noisy[torch.arange(64), torch.arange(64) % 20] = 1
    split = {"head": list(range(6)), "medium": list(range(6, 12)), "tail": list(range(12, 20))}
    images = {}
    results = {}
    for shared in (True, False):
        torch.manual_seed(0)
        method = FAMILIES["colearning"](TrainContext(cfg, noisy.cuda(), split, torch.device("cuda"), 2))
        model = method.build_model().cuda().to(memory_format=torch.channels_last)
        assert model.shares_frozen_trunk
        model.shares_frozen_trunk = shared  # the unshared path: each branch runs its own copy
        model.train()
        batches = {}
        for spec in method.streams():
            items = EpochPlan(spec, 0, 1).batches(0)[0]
            index = torch.tensor([ids for ids, _, _ in items])
            pixels = images.setdefault(spec.name, torch.randn(*index.shape, 3, 32, 32, generator=g))
            batches[spec.name] = {"images": pixels.cuda(), "index": index.cuda(),
                                  "stitched": torch.tensor([s for _, _, s in items]).cuda()}
        torch.manual_seed(0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = method.training_loss(model, batches, 0, 0)
        loss.backward()
        results[shared] = (loss.detach().float(),
                           {k: p.grad.float() for k, p in model.named_parameters() if p.grad is not None})
    (l_on, g_on), (l_off, g_off) = results[True], results[False]
    torch.testing.assert_close(l_on, l_off, rtol=2e-2, atol=1e-3)
    assert g_on.keys() == g_off.keys() and g_on
    for k in g_on:  # bf16: each gradient as a whole, not element by element
        assert float((g_on[k] - g_off[k]).norm()) <= 0.05 * float(g_off[k].norm()) + 1e-5, k


def test_checkpoint_trained_on_cuda_predicts_the_same_on_cpu(tiny_toy, tmp_path):
    """A run trained on the GPU (bf16) reopened from its folder on the CPU (fp32) scores the test set as
    the GPU did, up to bf16 rounding."""
    from noisymlt.training.trainer import Trainer

    cfg = bf16_config("erm", epochs=1)
    out = tmp_path / "run"
    toy_trainer(tiny_toy, cfg, out, limit_iters=3, device="cuda").run()
    assert json.loads((out / "manifest.json").read_text())["environment"]["device"].startswith("cuda")
    on_gpu = np.load(out / "predictions.npz")["scores_main"]
    cpu = Trainer.from_run_dir(out, test_labels=tiny_toy["test"], train_images=tiny_toy["root"],
                               test_images=tiny_toy["root"], device="cpu", resolved=cfg)
    assert next(cpu.model.parameters()).device.type == "cpu"
    on_cpu = cpu.predict()["main"]
    assert on_cpu.shape == on_gpu.shape
    np.testing.assert_allclose(on_cpu, on_gpu, atol=2e-2)
    assert np.corrcoef(on_cpu.ravel(), on_gpu.ravel())[0, 1] > 0.99


def test_two_train_jobs_under_resources_gpu_2_on_one_gpu(tmp_path, monkeypatch):
    """`--resources gpu=2` lets two train jobs run at once; with one card the second finds every GPU lock
    taken and shares cuda:0 (noisymlt.training.devices), saying so in its log."""
    pytest.importorskip("snakemake", reason="needs Snakemake (not installed here)")
    if torch.cuda.device_count() != 1:
        pytest.skip("needs exactly one CUDA device")
    from helpers import SNAKEMAKE, TINY, project_copy, snakemake, write_layer

    if not Path(SNAKEMAKE).exists():
        pytest.skip(f"needs the snakemake command beside this interpreter ({SNAKEMAKE})")
    monkeypatch.setenv("NOISYMLT_GPU_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    wf = project_copy(tmp_path)
    args = write_layer(wf, TINY)
    runs = ["runs/toy/g0.5/s0/erm", "runs/toy/g0.5/s0/ours"]
    # targets first: a trailing target would be swallowed by --resources
    snakemake(wf, *[f"{r}/predictions.npz" for r in runs], *args, "--cores", "2", "--resources", "gpu=2", timeout=900)
    devices = [json.loads((wf / r / "manifest.json").read_text())["environment"]["device"] for r in runs]
    assert devices == ["cuda:0", "cuda:0"]
    spans = []
    for r in runs:
        timing = json.loads((wf / r / "manifest.timing.json").read_text())
        spans.append((dt.datetime.fromisoformat(timing["started"]), dt.datetime.fromisoformat(timing["finished"])))
    overlapped = spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]
    logs = "".join((wf / "logs" / "train" / f"toy_g0.5_s0_{m}.log").read_text() for m in ("erm", "ours"))
    # jobs that ran at the same time: the second found the card locked, shares it and says so
    assert "sharing cuda:0" in logs or not overlapped, logs[-2000:]
