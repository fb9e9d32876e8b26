"""Ours: Stitch-Up + Heterogeneous Co-Learning (paper Sec. 3, SPEC 3), every ablation an option.

Two branches read their own data streams in lockstep: the random branch f (uniform sampling, BCE,
batch 32, neck dropout 0) and the balanced branch g (class-aware sampling, DB-Focal, batch 256,
dropout 0.5). Each training slot holds an anchor and K-1 Stitch-Up partners sharing one of its
noisy classes. Per branch and step:

1. logits of every view, and of the stitched sample (average of the neck outputs by default;
   concatenation of backbone maps before pooling or of the input images as ablations);
2. pseudo labels (Eq. 3) of every view from the peer branch's sigmoid outputs on the same views
   (no gradient, the peer's neck and head in eval mode); ``self`` uses the branch's own outputs;
3. the [CL] Stitch-Up loss with the union of the corrected labels of anchor and partners.

The total loss is the sum over branches; the test logits are tau * f + (1 - tau) * g.
Ablations: no Stitch-Up, no pseudo labels, other Stitch-Up modes, K, p, Mix-Up instead of
Stitch-Up, self-training, other sampler pairs, and a single branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from noisymlt.data.labels import GROUPS
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.base import Method, PublishedTargets, eval_mode, register_family
from noisymlt.evaluation.label_scores import LabelScores
from noisymlt.methods.pseudo_labels import (group_thresholds, pseudo_label_reach, pseudo_label_scores, pseudo_labels,
                                         reference_thresholds)
from noisymlt.methods.options import method_options
from noisymlt.data.sampling import StreamSpec
from noisymlt.methods.options import (
    BATCH_SIZE_KEYS,
    BRANCH_DEFAULTS,
    BRANCH_NAMES,
    MIXUP_DEFAULTS,
    STITCHUP_DEFAULTS,
    stitched_views,
)
from noisymlt.methods.single import loss_for
from noisymlt.models.twobranch import TwoBranch, build_two_branch, ensemble_logits
from noisymlt.data.sampling import build_sampler
from noisymlt.methods.stitchup import (
    PartnerIndex,
    mixup,
    stitch_feature_maps_concat,
    stitch_features_average,
    stitch_images_concat,
    stitchup_loss,
)

@dataclass(frozen=True)
class BranchSpec:
    name: str
    sampler: str
    loss: str
    loss_params: dict
    batch_size: int
    dropout: float


@register_family("colearning")
class CoLearning(Method):
    heads = ("ensemble", "random", "balanced")
    def __init__(self, ctx):
        super().__init__(ctx)
        opts = method_options(self.opts)
        given = opts.get("branches") or {name: {} for name in BRANCH_NAMES}
        self.specs = {}
        for name in BRANCH_NAMES:  # fixed order: f first
            if name in given:
                b = {**BRANCH_DEFAULTS[name], **given[name]}
                self.specs[name] = BranchSpec(name, b["sampler"], b["loss"], dict(b["loss_params"]),
                                              int(ctx.train[BATCH_SIZE_KEYS[b["batch_size"]]]), float(b["dropout"]))
        self.heads = ("ensemble", *self.specs) if len(self.specs) == 2 else ("main",)
        self.losses = {name: loss_for(ctx, s.loss, s.loss_params) for name, s in self.specs.items()}
        self.shared_backbone = bool(opts.get("shared_backbone", False))
        self.stitch = {**STITCHUP_DEFAULTS, **opts.get("stitchup", {})}
        self.mix = {**MIXUP_DEFAULTS, **opts.get("mixup", {})}
        self.source = opts.get("pseudo", {}).get("source", "cross")
        self.tau = float(ctx.train["tau"])
        self.thresholds = self._thresholds(opts.get("pseudo", {}).get("thresholds"))

    # ------------------------------------------------------------------ configuration
    def _thresholds(self, given: dict | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """(alpha, beta) per-class vectors per source branch: the method block's thresholds, else the
        dataset's ``colearning.thresholds``, else [CL]'s published values (the toy set uses VOC's)."""
        if given is None:
            given = reference_thresholds(self.ctx.cfg)
        return {
            name: group_thresholds(self.ctx.split, self.ctx.num_classes, (given.get(name) or {}).get("alpha"),
                                   (given.get(name) or {}).get("beta"))
            for name in self.specs
        }

    def _sampler_seed(self, i: int) -> int:
        """The run seed, except for a branch whose sampler kind an earlier branch already uses
        (R+R, B+B): a derived seed, so that the two streams differ."""
        kinds = [s.sampler for s in self.specs.values()]
        repeat = kinds[:i].count(kinds[i])
        if repeat == 0:
            return self.ctx.seed
        return int(np.random.SeedSequence([self.ctx.seed, repeat]).generate_state(1)[0])

    @property
    def k(self) -> int:
        return stitched_views(self.stitch)

    @property
    def needs_pixels(self) -> bool:  # Mix-Up and image-level Stitch-Up mix pixels
        return bool(self.mix["enabled"]) or (self.k > 1 and self.stitch["mode"] == "image_concat")

    # ------------------------------------------------------------------ Method API
    def build_model(self) -> TwoBranch:
        partner_bn = bool(self.stitch["partner_bn"]) and self.k > 1 and self.stitch["mode"] == "feature_average"
        return build_two_branch(self.ctx.train, self.ctx.num_classes, {n: s.dropout for n, s in self.specs.items()},
                                shared_backbone=self.shared_backbone, partner_bn=partner_bn)

    def streams(self) -> list[StreamSpec]:
        labels = self.ctx.noisy.cpu().numpy()
        partner_fn = None
        if self.k > 1:
            index = PartnerIndex(labels)
            k = self.k
            partner_fn = lambda anchors, rng: index.sample(anchors, rng, k)  # noqa: E731
        return [
            StreamSpec(name, build_sampler(s.sampler, labels, self._sampler_seed(i)), s.batch_size,
                       k=self.k, p=float(self.stitch["p"]), partner_fn=partner_fn)
            for i, (name, s) in enumerate(self.specs.items())
        ]

    def training_loss(self, model, batches, epoch, step):
        total = None
        logs: dict[str, torch.Tensor] = {}
        # Both branches' frozen stages are one function (same pretrained weights, frozen BatchNorm): run it
        # once per stream and let each branch's trained stages, and the peer's pass, read its output.
        # (Mix-Up trains on mixed images, which no other pass sees: nothing to share there.)
        share = model.shares_frozen_trunk and not self.mix["enabled"]
        frozen = ({name: model.frozen_features(batches[name]["images"].flatten(0, 1)) for name in self.specs}
                  if share else {})
        for i, name in enumerate(self.specs):
            loss, branch_logs = self._branch_loss(model, name, batches[name], epoch, step, i, frozen.get(name))
            total = loss if total is None else total + loss
            logs[f"loss_{name}"] = loss.detach()
            logs.update(branch_logs)
        logs["loss"] = total.detach()
        return total, logs

    def predict(self, model, images) -> dict[str, torch.Tensor]:
        return self.head_logits(model(images))

    def predict_for_scoring(self, model, images) -> dict[str, torch.Tensor]:
        """``predict``'s heads and, as ``branch:NAME``, each branch's logits, from one forward pass: the pseudo-label
        rule's source probabilities (with the model in eval mode, a branch's equal ``_probs`` of that branch alone
        on the same images, bit for bit: tests/test_suspects.py)."""
        logits = model(images)
        return {**self.head_logits(logits), **{f"branch:{name}": logits[name] for name in self.specs}}

    def score_labels(self, model, noisy, outputs) -> dict[str, LabelScores]:
        """The rule Ours trains with (Eq. 3), applied once with each trained branch's source branch on the final
        weights (noisymlt.methods.pseudo_labels.pseudo_label_scores), and the entries its thresholds reach."""
        if self.source == "none":
            return {}
        corrections = []
        for name in self.specs:
            source = self.source_of(name)
            alpha, beta = self.thresholds[source]
            corrections.append((outputs[f"branch:{source}"].astype(np.float64),
                                np.asarray(alpha, dtype=np.float64), np.asarray(beta, dtype=np.float64)))
        score, flagged = pseudo_label_scores(noisy, corrections)
        return {"pseudo_labels": LabelScores(
            "pseudo-label rule", "the pseudo-label rule's larger margin past alpha (a given 0) or beta (a given 1) "
            "over the two branches' corrections; flagged where either changes the label", score, flagged,
            pseudo_label_reach(noisy, corrections))}

    def source_of(self, name: str) -> str:
        """The branch whose predictions correct branch NAME's labels."""
        return name if self.source == "self" else next(n for n in self.specs if n != name)

    def head_logits(self, logits: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The reported heads from every branch's logits (``model(images)``)."""
        if len(logits) == 1:
            return {"main": next(iter(logits.values()))}
        f, g = logits["random"], logits["balanced"]
        return {"ensemble": ensemble_logits(f, g, self.tau), "random": f, "balanced": g}

    # ------------------------------------------------------------------ one branch, one step
    def _branch_loss(self, model: TwoBranch, name: str, batch: dict, epoch: int, step: int,
                     branch_idx: int, frozen: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """``frozen``: the shared frozen trunk's output on this stream's views, when there is one."""
        branch = model.branches[name]
        loss_fn = self.losses[name]
        images, index = batch["images"], batch["index"]
        B, K = index.shape
        views = images.flatten(0, 1)  # (B*K, 3, H, W): anchors and partners
        noisy = self.targets(index.flatten())  # (B*K, C)
        used = torch.ones(B, K, dtype=torch.bool, device=noisy.device)
        used[:, 1:] = batch["stitched"].reshape(B, 1).to(noisy.device)  # partners of unstitched rows are unused

        if self.mix["enabled"]:
            targets, logs = self._corrected(model, name, views, None, noisy, used.flatten(), frozen)
            self._publish(name, batch, noisy, targets)
            rng = np.random.default_rng([self.ctx.seed, epoch, step, branch_idx, 0x6D6978])
            mixed, mixed_targets, _, _ = mixup(images[:, 0], targets, self.mix["alpha"], rng)
            return loss_fn(branch(mixed).float(), mixed_targets), logs

        maps = branch.feature_maps(views) if frozen is None else branch.trained_stages(frozen)
        targets, logs = self._corrected(model, name, views, maps, noisy, used.flatten(), frozen)
        self._publish(name, batch, noisy, targets)
        feats = self._embed(model, name, maps, B, K)  # (B, K, d)
        singles = branch.head(feats)  # (B, K, C)
        if K == 1:
            return loss_fn(singles[:, 0].float(), targets), logs
        targets = targets.unflatten(0, (B, K))
        mode = self.stitch["mode"]
        if mode == "feature_average":
            stitched = branch.head(stitch_features_average([feats[:, j] for j in range(K)]))
        elif mode == "feature_concat":
            per_view = maps.unflatten(0, (B, K))
            stitched = branch.head(branch.embed(stitch_feature_maps_concat([per_view[:, j] for j in range(K)])))
        else:
            stitched = branch(stitch_images_concat([images[:, j] for j in range(K)]))
        loss = stitchup_loss(loss_fn.elementwise, stitched.float(), [singles[:, j].float() for j in range(K)],
                             [targets[:, j] for j in range(K)], mask=batch["stitched"],
                             negatives=self.stitch["negatives"])
        return loss, logs

    def _publish(self, name: str, batch: dict, noisy: torch.Tensor, targets: torch.Tensor) -> None:
        """Hand the step's targets, once computed, to the trainer's noise log (a copy; read-only there)."""
        if self.publish_targets:
            self.publish(PublishedTargets(name, batch["index"].detach(), batch["stitched"].detach(), noisy.detach(),
                                          None if targets is noisy else targets.detach()))

    def _embed(self, model: TwoBranch, name: str, maps: torch.Tensor, B: int, K: int) -> torch.Tensor:
        """Neck outputs (B, K, d) of every view; partners through the partner BatchNorm if present."""
        branch = model.branches[name]
        if K > 1 and name in model.partner_bns:
            per_view = maps.unflatten(0, (B, K))
            anchor = branch.embed(per_view[:, 0])
            partners = model.embed_partner(name, per_view[:, 1:].flatten(0, 1)).unflatten(0, (B, K - 1))
            return torch.cat([anchor[:, None], partners], dim=1)
        return branch.embed(maps).unflatten(0, (B, K))

    def _corrected(self, model: TwoBranch, name: str, views: torch.Tensor, maps: torch.Tensor | None,
                   noisy: torch.Tensor, used: torch.Tensor, frozen: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, dict]:
        """Eq. 3 labels of every view, and how many labels of the used views were added / removed."""
        if self.source == "none":
            return noisy, {}
        source = self.source_of(name)
        # The backbone maps of these views are reusable when the source runs the same backbone.
        reuse = maps if maps is not None and (source == name or model.shared_backbone) else None
        probs = self._probs(model, source, views, reuse, frozen)
        alpha, beta = self.thresholds[source]
        corrected = pseudo_labels(noisy, probs, alpha, beta)
        rows = used.reshape(-1, 1)
        logs = {f"pl_added_{name}": ((noisy < 0.5) & (corrected > 0.5) & rows).sum(),
                f"pl_removed_{name}": ((noisy > 0.5) & (corrected < 0.5) & rows).sum()}
        return corrected, logs

    @staticmethod
    def _probs(model: TwoBranch, source: str, views: torch.Tensor, maps: torch.Tensor | None,
               frozen: torch.Tensor | None = None) -> torch.Tensor:
        """Sigmoid outputs of branch ``source``: no gradient, its neck and head in eval mode; from the
        shared frozen trunk's output on these views when there is one."""
        branch = model.branches[source]
        with torch.no_grad(), eval_mode(branch.neck, branch.head):
            if maps is not None:
                maps = maps.detach()
            elif frozen is not None:
                maps = branch.trained_stages(frozen)
            else:
                maps = branch.feature_maps(views)
            return torch.sigmoid(branch.head(branch.embed(maps)).float())
