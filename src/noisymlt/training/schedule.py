"""A run's optimizer and learning-rate schedule, and the length of an epoch.

``build_optimizer`` turns the run's train block and the method's own lr factors into the SGD, one parameter group per
factor, and the ``LrSchedule`` that sets each group's rate at every step; ``check_warmup`` refuses a warm-up that
outlasts the first lr step.
"""

from __future__ import annotations

from noisymlt.errors import NoisyMLTError


def lr_at(cfg: dict, epoch: int, it: int, iters_per_epoch: int) -> float:
    """Linear warm-up from lr * warmup_ratio over warmup_iters, then x lr_gamma at each step epoch."""
    lr = cfg["lr"] * cfg["lr_gamma"] ** sum(epoch >= s for s in cfg["lr_steps"])
    global_it = epoch * iters_per_epoch + it
    if global_it < cfg["warmup_iters"]:
        k = cfg["warmup_ratio"] + (1 - cfg["warmup_ratio"]) * global_it / cfg["warmup_iters"]
        lr *= k
    return lr


# Name components of the layers that start from scratch on top of a pretrained backbone: the neck and head of
# every branch, the partner BatchNorms of feature-level Stitch-Up, BBN's classifier and ML-GCN's GCN.
NEW_LAYERS = frozenset({"neck", "head", "partner_bns", "classifier", "gcn"})


def lr_groups(model, multipliers: dict[str, float], new_layers: float = 1.0) -> list[tuple[float, list]]:
    """The model's trainable parameters as (lr factor, parameters) groups: a parameter takes the factor of the
    first name prefix in ``multipliers`` it starts with (the method's own, from its reference), else
    ``new_layers`` when it belongs to a layer that starts from scratch (``NEW_LAYERS``; train.new_layers_lr_mult),
    else 1. With every factor 1 there is one group, as before."""
    groups: dict[float, list] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            mult = next((float(m) for prefix, m in multipliers.items() if name.startswith(prefix)), None)
            if mult is None:
                mult = float(new_layers) if NEW_LAYERS.intersection(name.split(".")) else 1.0
            groups.setdefault(mult, []).append(param)
    return list(groups.items())


class LrSchedule:
    """The rate of every step (``lr_at``), each parameter group at its factor of it."""

    def __init__(self, cfg: dict, iters_per_epoch: int, factors: list[float]):
        self.cfg, self.iters, self.factors = cfg, iters_per_epoch, factors

    def apply(self, optimizer, epoch: int, it: int) -> float:
        """Set each group's rate for step ``it`` of ``epoch``; returns the schedule's rate."""
        lr = lr_at(self.cfg, epoch, it, self.iters)
        for group, factor in zip(optimizer.param_groups, self.factors):
            group["lr"] = lr * factor
        return lr

    def rates(self) -> list[float]:
        """The schedule's rate at every step of the run."""
        return [lr_at(self.cfg, e, i, self.iters) for e in range(self.cfg["epochs"]) for i in range(self.iters)]


def build_optimizer(model, cfg: dict, method_factors: dict[str, float], iters_per_epoch: int, device):
    """The run's SGD over ``model``'s trainable parameters, a group per lr factor (``lr_groups``: the method's own
    ``method_factors``, then train.new_layers_lr_mult), with the run's lr, momentum and weight decay, and its
    ``LrSchedule``. Fused into one kernel on CUDA (the CPU keeps torch's default implementation, and with it the
    CPU path's bits)."""
    import torch

    groups = lr_groups(model, method_factors, cfg.get("new_layers_lr_mult", 1.0))
    extra = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.SGD([{"params": params} for _, params in groups], lr=cfg["lr"],
                                momentum=cfg["momentum"], weight_decay=cfg["weight_decay"], **extra)
    return optimizer, LrSchedule(cfg, iters_per_epoch, [factor for factor, _ in groups])


def check_warmup(cfg: dict, iters_per_epoch: int, where: str) -> None:
    """Refuse a schedule whose linear warm-up ends after the first lr step: its runs would never train at
    their nominal lr (``train.long_warmup: true`` allows it, to reproduce a reference that does so)."""
    if cfg.get("long_warmup", False) or not cfg["warmup_iters"]:
        return
    total = cfg["epochs"] * iters_per_epoch
    step = min([s for s in cfg["lr_steps"] if s < cfg["epochs"]], default=None)
    first_step = total if step is None else step * iters_per_epoch
    if cfg["warmup_iters"] > first_step:
        span = (f"the {total} iterations of the run" if step is None else
                f"the {first_step} iterations before the first lr step (epoch {step} of {cfg['epochs']}, "
                f"{iters_per_epoch} iterations each, {total} in all)")
        raise NoisyMLTError(
            f"{where}: train.warmup_iters={cfg['warmup_iters']} outlasts {span}, so the run would never reach "
            f"train.lr={cfg['lr']:g}. Shorten the warm-up "
            "(e.g. in the method's schedule), train longer, or set train.long_warmup: true to reproduce a "
            "reference that does this")


def epoch_iterations(rule: str, streams: list, num_images: int, batch_size: int) -> int:
    """Iterations per epoch. ``batches`` ([CL]): floor(N / batch_size) whatever the sampler;
    ``sampler`` ([DB]): one pass over the first stream's sampler, floor(len(sampler) / its batch size)
    (class-aware: int(max_class_count * C / 4) images; random: N)."""
    if rule == "batches":
        iters = num_images // batch_size
    elif rule == "sampler":
        iters = len(streams[0].sampler) // streams[0].batch_size
    else:
        raise NoisyMLTError(f"train.epoch_length: unknown rule {rule!r}; choose batches or sampler")
    if iters < 1:
        raise NoisyMLTError(f"train.epoch_length={rule}: an epoch would have no full batch of {batch_size} images")
    return iters


def capped(cfg: dict, iters_per_epoch: int) -> int:
    """Iterations per epoch under ``train.max_iters_per_epoch`` (smoke runs of a recipe): every epoch is
    shortened alike, so what a recipe counts in epochs (lr steps, DivideMix's warm-up epochs, BBN's mixing
    curve) stays where it was. The lr warm-up counts iterations: a profile that caps states its own, scaled
    (workflow/profiles/smoke)."""
    cap = cfg.get("max_iters_per_epoch")
    return min(iters_per_epoch, cap) if cap else iters_per_epoch
