"""The contract between the trainer and a method.

The trainer owns the loop (data streams, optimiser, schedule, precision, checkpoints, prediction);
a method says which streams it reads, builds its model, turns one step's batches into a loss and
maps test images to logits per reported head. Adding a method = one subclass registered with
``@register_family`` + one params.yaml block naming it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.evaluation.label_scores import LabelScores
from noisymlt.methods import options as family_options
from noisymlt.methods.options import method_options
from noisymlt.data.sampling import StreamSpec

@contextlib.contextmanager
def eval_mode(*modules: nn.Module):
    """Switch modules to eval mode (BatchNorm running statistics, no dropout) and back: for the
    no-gradient predictions some methods make on training batches (peer pseudo labels, co-guessing)."""
    modes = [m.training for m in modules]
    for m in modules:
        m.eval()
    try:
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)


@dataclass(frozen=True)
class PublishedTargets:
    """The targets a method trained one branch on in one step, published after they were computed
    (detached) for the trainer's label-noise log (noisymlt.training.noise_monitor); nothing comes back.

    ``noisy`` and ``corrected`` are (B*K, C), view-major like ``index.flatten()``; ``corrected`` is None
    when the method corrects nothing.
    """

    branch: str
    index: torch.Tensor  # (B, K) training-set row of every view; column 0 = the anchor
    stitched: torch.Tensor  # (B,) bool: rows whose partners were stitched to the anchor
    noisy: torch.Tensor
    corrected: torch.Tensor | None


FAMILIES: dict[str, type["Method"]] = {}


def register_family(name: str):
    def deco(cls: type["Method"]) -> type["Method"]:
        if name in FAMILIES:
            raise RuntimeError(f"method family {name!r} registered twice")
        cls.family = name
        FAMILIES[name] = cls
        return cls

    return deco


@dataclass
class TrainContext:
    cfg: dict  # the resolved run config (noisymlt.config.resolve_run)
    noisy: torch.Tensor  # (N, C) float noisy train labels: the only labels training may read
    split: dict[str, list[int]]
    device: torch.device
    iterations_per_epoch: int
    extra: dict = field(default_factory=dict)
    # (N, C) float 1 / 0: the labels the loss reads, where a cleaned table leaves some out (None: every label). The
    # sampler still draws from ``noisy``, so that a cleaned run has its recipe's epochs on the same noisy set; the
    # loss and the class counts it is balanced by (class_counts) see a dropped label as no positive.
    known: torch.Tensor | None = None

    @property
    def num_classes(self) -> int:
        return int(self.noisy.shape[1])

    @property
    def class_counts(self) -> np.ndarray:
        kept = self.noisy if self.known is None else self.noisy * self.known
        return kept.sum(0).cpu().numpy().astype(np.int64)

    @property
    def train(self) -> dict:
        return self.cfg["train"]

    @property
    def seed(self) -> int:
        return int(self.cfg["seed"])


class Method:
    family = "?"  # set by @register_family; its options are described in noisymlt.methods.options
    # Prediction heads written for evaluation; the first is the method's reported result.
    heads: tuple[str, ...] = ("main",)
    # Set by the trainer when it logs label noise; a method that supports it then keeps the targets it
    # trained on for ``take_published`` (methods that do not, publish nothing).
    publish_targets: bool = False
    # Whether its loss can leave out the labels a cleaned table drops (TrainContext.known)
    leaves_out_labels: bool = False

    @property
    def needs_pixels(self) -> bool:
        """Whether training transforms the images themselves (mixing, stitching pixels), so that the frozen
        trunk's output of each view cannot stand in for the view (``noisymlt.training.trunkcache``)."""
        return False

    def __init__(self, ctx: TrainContext):
        self.ctx = ctx
        self.opts = ctx.cfg["method_cfg"]
        # A resolved run config (`train --run-config`) bypasses params validation: check here too.
        self.check_options(method_options(self.opts), f"methods.{ctx.cfg.get('method', '?')}")
        if ctx.known is not None and not self.leaves_out_labels:
            raise NoisyMLTError(f"method {ctx.cfg.get('method', '?')!r}: family {self.family!r} cannot leave labels "
                                "out of its loss, which its training table's ignored_* columns ask; clean its labels "
                                "with action flip instead")

    @classmethod
    def check_options(cls, options: dict, where: str) -> None:
        """Validate the family's options (params validation does the same without importing torch)."""
        family_options.check_options(cls.family, options, where)

    def build_model(self) -> nn.Module:
        raise NotImplementedError

    def streams(self) -> list[StreamSpec]:
        raise NotImplementedError

    def training_loss(self, model: nn.Module, batches: dict[str, dict], epoch: int, step: int) -> tuple[torch.Tensor, dict]:
        """``batches[stream]``: images (B, K, 3, H, W), index (B, K), stitched (B,), on the device."""
        raise NotImplementedError

    def predict(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def predict_for_scoring(self, model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """``predict``'s heads and, under keys of their own, the logits the method's label scorers read
        (``score_labels``), from one forward pass over the training images."""
        return self.predict(model, images)

    def score_labels(self, model: nn.Module, noisy: np.ndarray, outputs: dict[str, np.ndarray]
                     ) -> dict[str, LabelScores]:
        """The method's own rankings of its training labels by how likely each is wrong, beside its prediction's
        (``noisymlt suspects``), as it owns its loss: ``outputs`` holds the sigmoid of every output of
        ``predict_for_scoring`` over the training images (test transform, final weights), ``noisy`` the given
        labels (N, C). None by default."""
        return {}

    def lr_multipliers(self) -> dict[str, float]:
        """Learning-rate factors by parameter-name prefix of the model (ML-GCN's code trains its GCN at 10x
        its backbone's rate); parameters that match no prefix train at the schedule's rate."""
        return {}

    def on_epoch_start(self, model: nn.Module, epoch: int) -> None:
        """Hook for per-epoch work (BBN's mixing weight, DivideMix's co-divide)."""

    def state_dict(self) -> dict:
        """Extra method state that must survive a resume (plain tensors/numbers only)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def publish(self, record: PublishedTargets) -> None:
        if self.publish_targets:
            self.__dict__.setdefault("_published", []).append(record)

    def take_published(self) -> list[PublishedTargets]:
        """The targets published since the last call (the trainer calls this after every step)."""
        return self.__dict__.pop("_published", [])

    def targets(self, index: torch.Tensor) -> torch.Tensor:
        """Noisy targets of the images at ``index`` (any shape) -> index.shape + (C,)."""
        return self.ctx.noisy[index]
