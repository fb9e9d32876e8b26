"""What brings a training step near the card's speed without changing the CPU default path's results.

A ResNet-50 step at batch 32 on an H200 is bound by kernel launches and Python, not arithmetic
(docs/benchmarks/device_check_h200.md): ``train.compile`` compiles the backbone stages and heads in
place (CUDA graphs on a GPU, where a run's batch shapes are fixed; plain inductor code on the CPU); SGD
is fused on CUDA (``noisymlt.training.schedule.build_optimizer``); and the loop reads nothing back from the device per
step: the epoch's loss sums and the finiteness check stay on the device until a log point (``StepLog``).
"""

from __future__ import annotations

import logging

from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)


def compile_mode(device) -> str:
    """CUDA graphs on a GPU (a run's batch shapes are static, so each stage records its graphs once);
    inductor's default on the CPU, where there are no graphs to replay."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def compile_model(model, device, mode: str | None = None) -> list[str]:
    """Compile, in place (``nn.Module.compile``), every stage of every trunk and every head of ``model``;
    returns the compiled modules' names. In place, so the state dict (and every checkpoint) keeps the eager
    module's keys, and methods that call a trunk's stages one by one (frozen prefix, trained stages) run
    compiled code too. Necks stay eager: their dropout draws its masks from torch's generator as the eager
    run does (compiled dropout is another draw: measured, 0.03 apart in the weights after 4 ERM steps)."""
    from noisymlt.models.heads import HEADS

    import torch._dynamo.config as dynamo

    # every stage of every trunk (ResNet-50's stem and layer1-4, in each branch) shares one code object,
    # nn.Sequential.forward, and each instance is a cache entry of its own: dynamo's default of 8 would leave
    # Ours' second branch in eager mode
    dynamo.recompile_limit = max(dynamo.recompile_limit, 64)
    mode = mode or compile_mode(device)
    heads = tuple(HEADS.values())
    names = []
    for name, module in model.named_modules():
        if hasattr(module, "trainable_parts"):  # a trunk: its stages, not itself (its parent calls them apart)
            for child_name, child in module.named_children():
                if any(True for _ in child.parameters()):
                    child.compile(mode=mode, dynamic=False)
                    names.append(f"{name}.{child_name}" if name else child_name)
        elif isinstance(module, heads):
            module.compile(mode=mode, dynamic=False)
            names.append(name)
    log.info("torch.compile (mode %s): %d modules", mode, len(names))
    return names


class StepLog:
    """An epoch's log sums and the first non-finite loss, kept on the device between log points.

    Sums are float64, as the Python floats of a per-step ``float(v)`` were: the same additions in the same
    order give the same epoch means to the bit, without a host sync per step."""

    def __init__(self, device):
        import torch

        self.device = device
        self.sums: dict = {}
        self.first_bad = torch.full((), -1, dtype=torch.int64, device=device)

    def add(self, it: int, loss, logs: dict) -> None:
        import torch

        bad = ~torch.isfinite(loss.detach())
        self.first_bad = torch.where(bad & (self.first_bad < 0), torch.full_like(self.first_bad, it), self.first_bad)
        for k, v in logs.items():
            v = v.detach().to(torch.float64) if isinstance(v, torch.Tensor) else float(v)
            self.sums[k] = self.sums[k] + v if k in self.sums else (v if isinstance(v, float) else v.clone())

    def check_finite(self, method: str, epoch: int) -> None:
        """Stop at a non-finite loss of this epoch, naming its first iteration (one host sync)."""
        it = int(self.first_bad)
        if it >= 0:
            raise NoisyMLTError(f"{method}: non-finite loss at epoch {epoch + 1} iteration {it}")

    def means(self, iters: int) -> dict[str, float]:
        return {k: float(v) / iters for k, v in self.sums.items()}


def mark_step(device, compiled: bool) -> None:
    """A new training step for CUDA graphs: outputs of the previous step's replays may be overwritten from here
    (torch.compiler.cudagraph_mark_step_begin); nothing to do eagerly or on the CPU."""
    if compiled and device.type == "cuda":
        import torch

        torch.compiler.cudagraph_mark_step_begin()
