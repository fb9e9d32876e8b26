"""DivideMix (Li et al., ICLR 2020) adapted to noisy long-tailed multi-label data (SPEC 4).

Two networks ``a`` and ``b`` (one ``nn.ModuleDict``, one optimiser) see the same class-aware batches,
each slot holding two independently augmented views of one image (``k=2`` with the anchor as its own
partner).

* Warm-up (``warmup_epochs``): plain BCE on the first view, for both nets. ``auto`` (default):
  through the linear learning-rate warm-up plus one epoch at the full rate, never past the first lr
  decay: min(ceil(warmup_iters / iterations per epoch) + 1, lr_steps[0]). DivideMix's premise is the
  memorisation effect (networks fit clean, easy labels before noisy ones), and its paper warms up at the
  full initial learning rate, well before the first decay, for "a few epochs" (10 on CIFAR-10, 30 on
  CIFAR-100; 1 on Clothing1M / WebVision, whose epochs are 1,000+ iterations). One epoch of a few dozen
  iterations inside the lr warm-up leaves the nets near chance, and the first co-divide then splits on
  noise. VOC-MLT ([DB] schedule, 121 iterations an epoch): 5 epochs; COCO-MLT (705): 2.
* Co-divide (every later epoch start): each net scores every training image with the test transform;
  per-sample loss = mean BCE over classes against the noisy labels, min-max normalised; a 2-component
  1-D Gaussian mixture gives the posterior of the low-mean component as the clean probability ``w``.
  Net ``a`` trains with the probabilities from net ``b``'s losses and vice versa; a sample is
  labelled for a net when its ``w`` > ``p_threshold``.
* Each step trains *both* nets on the same batch, each with its own split (the trainer owns a single
  optimiser, so the two per-net losses are summed; their gradients touch disjoint parameters and
  only gradient clipping sees them together). Per net: labelled targets are refined,
  ``w * y + (1 - w) * mean_views sigmoid(own net)``, unlabelled targets co-guessed as the mean of both
  nets' sigmoids over both views; both are sharpened per class,
  ``p^(1/T) / (p^(1/T) + (1 - p)^(1/T))``. As in DivideMix the trained net predicts in train mode, the
  peer in eval mode. MixMatch mixes all inputs (labelled and unlabelled, both views) with a random
  permutation and ``lambda' = max(lambda, 1 - lambda)``, ``lambda ~ Beta(alpha, alpha)``; loss =
  BCE on the mixed labelled part + ramped ``lambda_u`` * MSE(sigmoid, target) on the mixed unlabelled
  part, over whatever part the batch has.
* DivideMix's prior penalty (KL of a uniform class prior to the mean softmax prediction) is left out:
  it keeps a softmax from collapsing onto one class, while independent sigmoids cannot collapse that
  way, and a uniform prior per class would contradict the sparse, long-tailed label frequencies.
* ``lambda_u`` default 2.5: DivideMix's Lx sums cross-entropy over classes while its Lu averages the
  squared error over classes; here both terms average over classes, so the equivalent weight is
  DivideMix's lambda_u divided by its class count (25 / 10 on CIFAR-10, 150 / 100 on CIFAR-100 at
  50% noise).
* Test logits: the mean of both nets' logits (DivideMix tests with both networks).
* Both nets start from the same pretrained file with the same frozen stages (stem and layer1 in the [DB]
  recipe), so their frozen prefixes are one function (``frozen_trunks_identical``): it runs once on the
  images that both nets see (warm-up, the own and peer predictions of a step, co-divide, test), and each
  net goes on from its output. The mixed images are each net's own and take the whole forward.

All randomness of a step comes from ``numpy.random.default_rng([seed, epoch, step, net])`` and the GMM
from ``random_state=seed``, so runs are reproducible and a resumed run replays its epochs exactly.
"""

from __future__ import annotations

import logging
import math
import warnings

import numpy as np
import torch
from torch import nn

from noisymlt.errors import NoisyMLTError
from noisymlt.evaluation.label_scores import LabelScores
from noisymlt.losses import build_loss
from noisymlt.methods.base import Method, eval_mode, register_family
from noisymlt.methods.options import DIVIDEMIX_DEFAULTS as DEFAULTS
from noisymlt.models.branch import Branch, build_branch
from noisymlt.models.twobranch import frozen_trunks_identical
from noisymlt.data.sampling import StreamSpec, build_sampler

log = logging.getLogger(__name__)

NETS = ("a", "b")


def sharpen(p: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-class sharpening of sigmoid probabilities: p^(1/T) / (p^(1/T) + (1 - p)^(1/T)).
    One of p, 1 - p is >= 0.5, so the denominator never vanishes, also at p in {0, 1}."""
    a = p.pow(1.0 / temperature)
    return a / (a + (1 - p).pow(1.0 / temperature))


def refine_labels(noisy: torch.Tensor, w: torch.Tensor, own_probs: torch.Tensor) -> torch.Tensor:
    """DivideMix's label refinement: w * y_noisy + (1 - w) * the net's own mean prediction;
    ``w`` holds one clean probability per sample (B,), the others are (B, C)."""
    w = w.unsqueeze(1).to(own_probs.dtype)
    return w * noisy.to(own_probs.dtype) + (1 - w) * own_probs


def refinement_scores(noisy: np.ndarray, nets: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """How far ``refine_labels`` moves each given label (numpy): ``nets`` holds (clean probability w per image, the
    net's own probabilities p) of each net; |w y + (1 - w) p - y| = (1 - w) |y - p|, the mean over the nets;
    flagged where the refined label crosses 0.5."""
    score = np.mean([(1 - w[:, None]) * np.abs(noisy - p) for w, p in nets], axis=0)
    return score, score > 0.5


def net_logits(net: nn.Module, x: torch.Tensor, frozen: torch.Tensor | None = None,
               rows: torch.Tensor | None = None) -> torch.Tensor:
    """``net(x[rows])``, or with ``frozen`` (the output of the net's frozen prefix on ``x``) the rest of the net
    from ``frozen[rows]``: the same logits, without running the prefix again; ``rows``: all when None."""
    source = x if frozen is None else frozen
    if rows is not None:
        source = source[rows]
    if frozen is None:
        return net(source)
    return net.head(net.embed(net.trained_stages(source)))


def mixmatch_lambda(rng: np.random.Generator, alpha: float) -> float:
    """lambda ~ Beta(alpha, alpha), folded to lambda' = max(lambda, 1 - lambda) >= 0.5 so that the
    mixed input stays closer to its own (first) member and the labelled/unlabelled roles hold."""
    lam = float(rng.beta(alpha, alpha))
    return max(lam, 1.0 - lam)


def clean_probability(losses: np.ndarray, *, max_iter: int = 10, reg_covar: float = 5e-4, tol: float = 1e-2,
                      random_state: int = 0) -> np.ndarray:
    """Posterior of the low-mean component of a 2-component GMM fitted to min-max normalised losses.

    Losses that are all equal carry no split: every sample is then treated as clean (probability 1).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    losses = np.asarray(losses, dtype=np.float64).reshape(-1)
    if losses.size == 0 or not np.isfinite(losses).all():
        raise NoisyMLTError("DivideMix: per-sample losses must be a non-empty vector of finite numbers")
    span = losses.max() - losses.min()
    if losses.size < 2 or span <= 1e-12:
        return np.ones_like(losses)
    x = ((losses - losses.min()) / span).reshape(-1, 1)
    gmm = GaussianMixture(n_components=2, max_iter=max_iter, tol=tol, reg_covar=reg_covar,
                          random_state=random_state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter=10 is DivideMix's choice
        gmm.fit(x)
    return gmm.predict_proba(x)[:, int(np.argmin(gmm.means_.reshape(-1)))]


def ramp(epoch: int, step: int, iters: int, warmup: int, rampup_epochs: float) -> float:
    """DivideMix's linear ramp of lambda_u: 0 at the end of warm-up, 1 after ``rampup_epochs``."""
    current = epoch + step / max(iters, 1)
    return float(np.clip((current - warmup) / rampup_epochs, 0.0, 1.0))


def resolve_options(opts: dict) -> dict:
    """Defaults filled in and ranges checked (a resolved run config may bypass params validation)."""
    from noisymlt.methods.options import check_options
    from noisymlt.methods.options import method_options

    given = method_options(opts)
    check_options("dividemix", given, "methods.dividemix")
    return {**DEFAULTS, **given, "gmm": {**DEFAULTS["gmm"], **given.get("gmm", {})}}


def auto_warmup_epochs(train: dict, iterations_per_epoch: int) -> int:
    """Epochs of the lr warm-up plus one at the full rate, at most up to the first lr decay (>= 1)."""
    epochs = math.ceil(train["warmup_iters"] / max(iterations_per_epoch, 1)) + 1
    first_decay = min(train["lr_steps"], default=train["epochs"])
    return max(1, min(epochs, first_decay))


@register_family("dividemix")
class DivideMix(Method):
    heads = ("main",)
    needs_pixels = True  # MixMatch mixes the images

    def __init__(self, ctx):
        super().__init__(ctx)
        self.o = resolve_options(self.opts)
        self.bce = build_loss("bce")
        # prob[i]: clean probability of every training image for training net NETS[i] (from the peer)
        self.prob: torch.Tensor | None = None
        self.divided_epoch = -1
        self._shares_prefix: bool | None = None  # decided on first use: the weights are loaded by then

    def shared_prefix(self, model: nn.ModuleDict, x: torch.Tensor) -> torch.Tensor | None:
        """The frozen prefix of both nets on ``x``, when they share it (else None: each net runs whole)."""
        if self._shares_prefix is None:
            nets = [model[n] for n in NETS]
            self._shares_prefix = all(isinstance(m, Branch) for m in nets) and frozen_trunks_identical(nets)
        return model[NETS[0]].frozen_prefix(x) if self._shares_prefix else None

    @property
    def warmup(self) -> int:
        """Warm-up epochs; ``auto`` needs the epoch length, which the trainer sets after ``streams()``."""
        if self.o["warmup_epochs"] != "auto":
            return int(self.o["warmup_epochs"])
        return auto_warmup_epochs(self.ctx.train, self.ctx.iterations_per_epoch)

    def build_model(self) -> nn.Module:
        return nn.ModuleDict({n: build_branch(self.ctx.train, self.ctx.num_classes) for n in NETS})

    def streams(self) -> list[StreamSpec]:
        sampler = build_sampler(self.o["sampler"], self.ctx.noisy.cpu().numpy(), self.ctx.seed)
        # the anchor as its own partner: two independently augmented views of every image
        return [StreamSpec("main", sampler, self.ctx.train["batch_size"], k=2, p=1.0,
                           partner_fn=lambda anchors, rng: anchors[:, None])]

    # ------------------------------------------------------------------ co-divide
    @torch.no_grad()
    def sample_losses(self, model: nn.ModuleDict) -> dict[str, np.ndarray]:
        """Per-image mean BCE over classes against the noisy labels, for each net (eval mode)."""
        iterate = self.ctx.extra.get("iterate_train")
        if iterate is None:
            raise RuntimeError("dividemix needs ctx.extra['iterate_train'] to score the training images")
        n = self.ctx.noisy.shape[0]
        out = {name: torch.full((n,), float("nan"), device=self.ctx.device) for name in NETS}
        with eval_mode(model):
            for idx, images in iterate():
                y = self.ctx.noisy[idx]
                frozen = self.shared_prefix(model, images)
                for name in NETS:
                    out[name][idx] = self.bce.elementwise(net_logits(model[name], images, frozen).float(), y).mean(1)
        losses = {name: v.cpu().numpy() for name, v in out.items()}
        if any(np.isnan(v).any() for v in losses.values()):
            raise RuntimeError("dividemix: iterate_train did not cover every training image")
        return losses

    def co_divide(self, losses: dict[str, np.ndarray]) -> torch.Tensor:
        """(2, N) clean probabilities: row i trains NETS[i] and comes from the other net's losses."""
        g = self.o["gmm"]
        prob = {name: clean_probability(losses[name], max_iter=g["max_iter"], reg_covar=g["reg_covar"], tol=g["tol"],
                                        random_state=self.ctx.seed) for name in NETS}
        rows = [prob[NETS[1 - i]] for i in range(len(NETS))]
        return torch.as_tensor(np.stack(rows), dtype=torch.float32, device=self.ctx.device)

    def on_epoch_start(self, model, epoch: int) -> None:
        if epoch == 0:
            log.info("dividemix: %d warm-up epoch(s) of %d before the first co-divide", self.warmup,
                     self.ctx.train["epochs"])
            if self.warmup >= self.ctx.train["epochs"]:
                log.warning("dividemix: warm-up covers every epoch, so the co-divide never runs")
        if epoch < self.warmup:
            return
        self.prob = self.co_divide(self.sample_losses(model))
        self.divided_epoch = epoch
        labelled = (self.prob > self.o["p_threshold"]).float().mean(1).tolist()
        log.info("dividemix epoch %d: labelled fraction net a %.3f, net b %.3f", epoch + 1, *labelled)

    # ------------------------------------------------------------------ training
    def training_loss(self, model, batches, epoch, step):
        b = batches["main"]
        idx = b["index"][:, 0]
        x1, x2 = b["images"][:, 0], b["images"][:, 1]
        y = self.targets(idx)
        if epoch < self.warmup:
            frozen = self.shared_prefix(model, x1)
            parts = {n: self.bce(net_logits(model[n], x1, frozen).float(), y) for n in NETS}
            loss = sum(parts.values())
            return loss, {"loss": loss.detach(), **{f"loss_{n}": v.detach() for n, v in parts.items()}}
        if self.prob is None:
            raise RuntimeError("dividemix: training after warm-up before any co-divide")
        weight = self.o["lambda_u"] * ramp(epoch, step, self.ctx.iterations_per_epoch, self.warmup,
                                           self.o["rampup_epochs"])
        logs: dict[str, torch.Tensor | float] = {"lambda_u": weight}
        total = 0.0
        frozen = self.shared_prefix(model, torch.cat([x1, x2]))
        for i, name in enumerate(NETS):
            rng = np.random.default_rng([self.ctx.seed, epoch, step, i])
            lx, lu, frac = self.net_loss(model[name], model[NETS[1 - i]], x1, x2, y, self.prob[i][idx], rng,
                                         frozen=frozen)
            loss = lx + weight * lu
            total = total + loss
            logs.update({f"loss_{name}": loss.detach(), f"lx_{name}": lx.detach(), f"lu_{name}": lu.detach(),
                         f"labelled_{name}": frac})
        logs["loss"] = total.detach()
        return total, logs

    def net_loss(self, net: nn.Module, peer: nn.Module, x1: torch.Tensor, x2: torch.Tensor, y: torch.Tensor,
                 w: torch.Tensor, rng: np.random.Generator, *, frozen: torch.Tensor | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """(labelled BCE, unlabelled MSE, labelled fraction) of one net's MixMatch step; ``frozen``: the
        shared frozen prefix of both nets on ``cat([x1, x2])``, if they share one."""
        T = self.o["temperature"]
        lab = w > self.o["p_threshold"]
        unl = ~lab
        bsz = x1.shape[0]
        views = torch.cat([x1, x2])
        with torch.no_grad():
            own = torch.sigmoid(net_logits(net, views, frozen).float())
            own = (own[:bsz] + own[bsz:]) / 2
            t_lab = sharpen(refine_labels(y[lab], w[lab], own[lab]), T)
            t_unl = own[unl][:0]
            if unl.any():
                with eval_mode(peer):  # per image, so the unlabelled rows of both views: x1[unl], then x2[unl]
                    other = torch.sigmoid(net_logits(peer, views, frozen, rows=torch.cat([unl, unl])).float())
                n_u = int(unl.sum())
                t_unl = sharpen((own[unl] + (other[:n_u] + other[n_u:]) / 2) / 2, T)
        inputs = torch.cat([x1[lab], x2[lab], x1[unl], x2[unl]])
        targets = torch.cat([t_lab, t_lab, t_unl, t_unl])
        lam = mixmatch_lambda(rng, self.o["beta_alpha"])
        perm = torch.as_tensor(rng.permutation(inputs.shape[0]), device=inputs.device)
        mixed = lam * inputs + (1 - lam) * inputs[perm]
        mixed_t = lam * targets + (1 - lam) * targets[perm]
        logits = net(mixed).float()
        n_l = 2 * int(lab.sum())
        zero = logits.sum() * 0  # keeps the graph when a part is empty
        lx = self.bce(logits[:n_l], mixed_t[:n_l]) if n_l else zero
        lu = (torch.sigmoid(logits[n_l:]) - mixed_t[n_l:]).pow(2).mean() if n_l < logits.shape[0] else zero
        return lx, lu, float(lab.float().mean())

    def predict(self, model, images) -> dict[str, torch.Tensor]:
        return self.predict_with_nets(model, images)[0]

    def predict_with_nets(self, model, images) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``predict``'s head (the mean of the two nets' logits) and each net's own logits, from one pass."""
        frozen = self.shared_prefix(model, images)
        logits = {name: net_logits(model[name], images, frozen).float() for name in NETS}
        return {"main": (logits["a"] + logits["b"]) / 2}, logits

    def predict_for_scoring(self, model, images) -> dict[str, torch.Tensor]:
        """``predict``'s head and, as ``net:NAME``, each net's logits, from one pass."""
        heads, nets = self.predict_with_nets(model, images)
        return {**heads, **{f"net:{name}": logits for name, logits in nets.items()}}

    def score_labels(self, model, noisy, outputs) -> dict[str, LabelScores]:
        """Its label refinement on the final weights: each net's clean probability w from the co-divide (the GMM on
        the other net's per-image losses), the net's own probabilities p (``refinement_scores``)."""
        prob = self.co_divide(self.sample_losses(model)).cpu().numpy()  # rows: the nets in NETS order
        score, flagged = refinement_scores(noisy, [(w.astype(np.float64), outputs[f"net:{name}"].astype(np.float64))
                                                   for name, w in zip(NETS, prob)])
        return {"dividemix": LabelScores(
            "label refinement", "(1 - w) |given - p|, w the co-divide's clean probability of the image and p the "
            "net's own, mean over the two nets; flagged where the refined label crosses 0.5", score, flagged)}

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict:
        prob = torch.empty(0) if self.prob is None else self.prob.detach().cpu().clone()
        return {"prob": prob, "divided_epoch": int(self.divided_epoch)}

    def load_state_dict(self, state: dict) -> None:
        prob = state.get("prob")
        self.prob = None if prob is None or prob.numel() == 0 else prob.to(self.ctx.device, torch.float32)
        self.divided_epoch = int(state.get("divided_epoch", -1))
