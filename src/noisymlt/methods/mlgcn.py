"""ML-GCN (Chen et al., CVPR 2019) as a baseline: GCN classifiers over the noisy label graph.

The adjacency is counted on the noisy training labels (training never reads clean ones), binarised at
``t`` and scaled as ML-GCN's code does (``adjacency: code``) or re-weighted with ``p`` as its paper
says (``adjacency: paper``); features are max-pooled as in its code (``pool: max``). Class embeddings: ML-GCN's published GloVe vectors (voc, coco) or
name-seeded pseudo-embeddings (``embeddings: random``; always for the toy dataset), see
noisymlt.data.glove. One stream (random sampler by default) and BCE by default. The GCN learns at
``gcn_lr_mult`` x the schedule's lr, the backbone at the lr itself (ML-GCN's code: GCN at lr, backbone at
lr * lrp = 0.1 lr).
"""

from __future__ import annotations

from torch import nn

from noisymlt.data.glove import class_embeddings, has_glove
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.base import Method, register_family
from noisymlt.methods.single import loss_for
from noisymlt.models.backbones import build_backbone
from noisymlt.models.mlgcn import LabelGCN, MLGCNNet, build_adjacency
from noisymlt.data.sampling import StreamSpec, build_sampler

GCN_LR_MULT = 10.0  # 1 / ML-GCN's lrp


@register_family("mlgcn")
class MLGCN(Method):
    heads = ("main",)
    def __init__(self, ctx):
        super().__init__(ctx)
        self.loss = loss_for(ctx, self.opts.get("loss", "bce"), self.opts.get("loss_params"))

    def class_names(self) -> list[str]:
        names = self.ctx.extra.get("classes")
        if names is not None:
            return list(names)
        if self.opts.get("embeddings", "glove") == "glove" and has_glove(self.ctx.cfg["kind"]):
            raise NoisyMLTError("mlgcn: GloVe embeddings need the class names, which the trainer did not provide")
        # Pseudo-embeddings carry no meaning, so index-based names serve as well as real ones.
        return [f"class_{i}" for i in range(self.ctx.num_classes)]

    def build_model(self) -> nn.Module:
        cfg = self.ctx.train
        emb = class_embeddings(self.ctx.cfg["kind"], self.class_names(), self.opts.get("embeddings", "glove"),
                               self.opts.get("embeddings_file"))
        adj = build_adjacency(self.ctx.noisy.cpu().numpy(), self.opts.get("adjacency", "code"),
                              self.opts.get("t", 0.4), self.opts.get("p", 0.2))
        backbone = build_backbone(cfg["backbone"], pretrained=cfg["pretrained"], weights_path=cfg.get("weights_path"))
        gcn = LabelGCN(emb, adj, out_dim=backbone.out_dim)
        return MLGCNNet(backbone, gcn, trainable=cfg["trainable"], frozen_bn=cfg["frozen_bn"],
                        pool=self.opts.get("pool", "max"))

    def lr_multipliers(self) -> dict[str, float]:
        # ML-GCN's get_config_optim: backbone at lr * lrp (0.1), GCN at lr, i.e. the GCN 10x faster
        return {"gcn.": float(self.opts.get("gcn_lr_mult", GCN_LR_MULT))}

    def streams(self) -> list[StreamSpec]:
        sampler = build_sampler(self.opts.get("sampler", "random"), self.ctx.noisy.cpu().numpy(), self.ctx.seed)
        return [StreamSpec("main", sampler, self.ctx.train["batch_size"])]

    def training_loss(self, model, batches, epoch, step):
        b = batches["main"]
        logits = model(b["images"][:, 0]).float()
        loss = self.loss(logits, self.targets(b["index"][:, 0]))
        return loss, {"loss": loss.detach()}

    def predict(self, model, images):
        return {"main": model(images)}
