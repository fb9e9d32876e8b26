"""One branch, one sampler, one loss: ERM, Focal, RS, RS-Focal, LDAM, DB, DB-Focal."""

from __future__ import annotations

import torch
from torch import nn

from noisymlt.dataset import StreamSpec
from noisymlt.errors import NoisyMLTError
from noisymlt.losses import build_loss
from noisymlt.methods.base import Method, register_family
from noisymlt.models.branch import build_branch
from noisymlt.sampling import build_sampler


def loss_for(ctx, name: str, params: dict | None) -> nn.Module:
    """Losses that need class statistics get them from the noisy train labels; DB gets the
    dataset's lambda / mu (SPEC 3) unless the method block overrides them."""
    params = dict(params or {})
    if name in ("db", "db_focal"):
        params = {**ctx.cfg["db_loss"], **params}
    return build_loss(name, ctx.class_counts, int(ctx.noisy.shape[0]), **params)


SAMPLER_NAMES = ["random", "class_aware", "reversed"]
LOSS_NAMES = ["bce", "focal", "db", "db_focal", "ldam"]
# Option-schema fragments shared by the families that take a sampler and/or a loss.
SAMPLER_OPTION = {"sampler": {"enum": SAMPLER_NAMES}}
LOSS_OPTIONS = {"loss": {"enum": LOSS_NAMES}, "loss_params": {"type": "object"}}


@register_family("single")
class SingleBranch(Method):
    heads = ("main",)
    options_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {**SAMPLER_OPTION, **LOSS_OPTIONS, "head": {"enum": ["linear", "cosine"]}},
    }

    def __init__(self, ctx):
        super().__init__(ctx)
        self.loss = loss_for(ctx, self.opts.get("loss", "bce"), self.opts.get("loss_params"))

    @classmethod
    def check_options(cls, options: dict, where: str) -> None:
        super().check_options(options, where)
        scale = (options.get("loss_params") or {}).get("scale", 30.0)
        if options.get("loss") == "ldam" and options.get("head", "linear") != "cosine" and scale != 1:
            # LDAM-DRW scales cosine logits in [-1, 1]; scaled linear logits saturate the loss.
            raise NoisyMLTError(f"{where}: loss ldam multiplies the logits by {scale}; use head: cosine (LDAM-DRW's "
                                "NormedLinear) or loss_params: {scale: 1} with a linear head")

    def build_model(self) -> nn.Module:
        return build_branch(self.ctx.train, self.ctx.num_classes, head=self.opts.get("head", "linear"))

    def streams(self) -> list[StreamSpec]:
        sampler = build_sampler(self.opts.get("sampler", "random"), self.ctx.noisy.cpu().numpy(), self.ctx.seed)
        return [StreamSpec("main", sampler, self.ctx.train["batch_size"])]

    def training_loss(self, model, batches, epoch, step):
        b = batches["main"]
        logits = model(b["images"][:, 0])
        loss = self.loss(logits.float(), self.targets(b["index"][:, 0]))
        return loss, {"loss": loss.detach()}

    def predict(self, model, images) -> dict[str, torch.Tensor]:
        return {"main": model(images)}
