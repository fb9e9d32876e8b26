"""One branch, one sampler, one loss: ERM, Focal, RS, RS-Focal, LDAM, DB, DB-Focal."""

from __future__ import annotations

import torch
from torch import nn

from noisymlt.losses import build_loss
from noisymlt.methods.base import Method, register_family
from noisymlt.models.branch import build_branch
from noisymlt.data.sampling import StreamSpec, build_sampler


def loss_for(ctx, name: str, params: dict | None) -> nn.Module:
    """Losses that need class statistics get them from the noisy train labels; DB gets the
    dataset's lambda / mu (SPEC 3) unless the method block overrides them."""
    params = dict(params or {})
    if name in ("db", "db_focal"):
        params = {**ctx.cfg["db_loss"], **params}
    return build_loss(name, ctx.class_counts, int(ctx.noisy.shape[0]), **params)


@register_family("single")
class SingleBranch(Method):
    heads = ("main",)
    leaves_out_labels = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.loss = loss_for(ctx, self.opts.get("loss", "bce"), self.opts.get("loss_params"))

    def build_model(self) -> nn.Module:
        return build_branch(self.ctx.train, self.ctx.num_classes, head=self.opts.get("head", "linear"))

    def streams(self) -> list[StreamSpec]:
        sampler = build_sampler(self.opts.get("sampler", "random"), self.ctx.noisy.cpu().numpy(), self.ctx.seed)
        return [StreamSpec("main", sampler, self.ctx.train["batch_size"])]

    def training_loss(self, model, batches, epoch, step):
        b = batches["main"]
        logits = model(b["images"][:, 0])
        index = b["index"][:, 0]
        if self.ctx.known is None:
            loss = self.loss(logits.float(), self.targets(index))
        else:  # a cleaned table's dropped labels: out of the loss, and no positive to a loss balanced by its row's
            keep = self.ctx.known[index]
            loss = self.loss(logits.float(), self.targets(index) * keep, keep)
        return loss, {"loss": loss.detach()}

    def predict(self, model, images) -> dict[str, torch.Tensor]:
        return {"main": model(images)}
