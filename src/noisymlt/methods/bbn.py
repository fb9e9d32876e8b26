"""BBN (Zhou et al., CVPR 2020) adapted to multi-label: bilateral branches with cumulative learning.

Two streams of the same batch size run in lockstep: ``conventional`` (uniform sampler) and
``rebalancing`` (reversed sampler, class c with probability ~ n_max / n_c on the noisy labels).
Training logits z = classifier(2 * [alpha f_c, (1 - alpha) f_r]) (BBN's bbn_mix) with alpha = 1 - (T / T_max)^2 per epoch;
loss = alpha * L(z, y_c) + (1 - alpha) * L(z, y_r) (L = BCE by default). Test: alpha = 0.5.
"""

from __future__ import annotations

from torch import nn

from noisymlt.methods.base import Method, register_family
from noisymlt.methods.single import loss_for
from noisymlt.models.backbones import build_backbone
from noisymlt.models.bbn import BBNNet, bbn_alpha
from noisymlt.data.sampling import StreamSpec, build_sampler


@register_family("bbn")
class BBN(Method):
    heads = ("main",)
    def __init__(self, ctx):
        super().__init__(ctx)
        self.loss = loss_for(ctx, self.opts.get("loss", "bce"), self.opts.get("loss_params"))

    def build_model(self) -> nn.Module:
        cfg = self.ctx.train
        backbone = build_backbone(cfg["backbone"], pretrained=cfg["pretrained"], weights_path=cfg.get("weights_path"))
        return BBNNet(backbone, self.ctx.num_classes, split_at=self.opts.get("split_at", "stage"),
                      trainable=cfg["trainable"], frozen_bn=cfg["frozen_bn"])

    def streams(self) -> list[StreamSpec]:
        labels = self.ctx.noisy.cpu().numpy()
        batch = self.ctx.train["batch_size"]
        return [StreamSpec("conventional", build_sampler("random", labels, self.ctx.seed), batch),
                StreamSpec("rebalancing", build_sampler("reversed", labels, self.ctx.seed), batch)]

    def training_loss(self, model, batches, epoch, step):
        conv, rebal = batches["conventional"], batches["rebalancing"]
        alpha = bbn_alpha(epoch, self.ctx.train["epochs"])
        logits = model(conv["images"][:, 0], rebal["images"][:, 0], alpha=alpha).float()
        loss = (alpha * self.loss(logits, self.targets(conv["index"][:, 0]))
                + (1.0 - alpha) * self.loss(logits, self.targets(rebal["index"][:, 0])))
        return loss, {"loss": loss.detach(), "alpha": alpha}

    def predict(self, model, images):
        return {"main": model(images, alpha=0.5)}
