"""Losses against independent numpy implementations of the formulas in SPEC 3 and 4."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from noisymlt.errors import NoisyMLTError
from noisymlt.losses import (
    LOSSES,
    BCELoss,
    DistributionBalancedLoss,
    FocalLoss,
    LDAMLoss,
    build_loss,
)

# ---------------------------------------------------------------- numpy references (loops, float64)


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_bce(z, y):
    """-(y log s(z) + (1-y) log(1 - s(z))), written the stable way."""
    return np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))


def np_db(z, y, counts, n_images, lam, mu, focal, kappa=0.05, beta=10.0, theta=0.1, gamma=2.0, alpha=2.0):
    b, c = z.shape
    n = np.maximum(np.asarray(counts, float), 1.0)
    out = np.zeros((b, c))
    for i in range(b):
        denom = sum(1.0 / n[j] for j in range(c) if y[i, j] == 1)
        for k in range(c):
            r = (1.0 / n[k]) / denom if denom > 0 else math.inf
            w = 1.0 / (1.0 + math.exp(-beta * (r - mu))) + theta if denom > 0 else 1.0 + theta
            zz = z[i, k] - kappa * math.log(max(n_images - n[k], 1.0) / n[k]) / lam
            if y[i, k] == 0:
                zz *= lam
                w /= lam
            bce = float(np_bce(np.array(zz), np.array(y[i, k])))
            loss = w * bce
            if focal:
                loss *= alpha * (1.0 - math.exp(-bce)) ** gamma
            out[i, k] = loss
    return out


def t(x):
    return torch.tensor(np.asarray(x), dtype=torch.float32)


@pytest.fixture
def batch():
    rng = np.random.default_rng(7)
    z = rng.normal(0.0, 2.0, size=(5, 6))
    y = (rng.random((5, 6)) < 0.35).astype(float)
    y[0] = 0.0  # a row without positives
    y[1, :] = [1, 0, 0, 0, 0, 1]
    counts = np.array([30, 12, 5, 1, 0, 40])  # class 4 has no positives in the training labels
    return z, y, counts, 40  # class 5 is in every one of the 40 images


# ---------------------------------------------------------------- BCE / focal


def test_bce_matches_formula(batch):
    z, y, _, _ = batch
    loss = BCELoss()
    got = loss.elementwise(t(z), t(y)).double().numpy()
    expected = -(y * np.log(np_sigmoid(z)) + (1 - y) * np.log(1 - np_sigmoid(z)))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert loss(t(z), t(y)).item() == pytest.approx(expected.mean(), rel=1e-5)


def test_bce_gradient_is_sigmoid_minus_target():
    z = t([[0.0, 0.0, 3.0, -25.0, 40.0]]).requires_grad_(True)
    y = t([[1.0, 0.0, 0.0, 1.0, 0.3]])
    BCELoss().elementwise(z, y).sum().backward()
    torch.testing.assert_close(z.grad, torch.sigmoid(z.detach()) - y)


def test_focal_matches_formula(batch):
    z, y, _, _ = batch
    got = FocalLoss(gamma=2.0, alpha=2.0).elementwise(t(z), t(y)).double().numpy()
    bce = np_bce(z, y)
    np.testing.assert_allclose(got, 2.0 * (1 - np.exp(-bce)) ** 2 * bce, rtol=1e-5)
    # modulating factor alpha * (1 - pt)^2: pt = sigmoid(4) for the easy entry, sigmoid(-4) for the hard one
    z2, y2 = t([[4.0, -4.0]]), t([[1.0, 1.0]])
    ratio = (FocalLoss().elementwise(z2, y2) / BCELoss().elementwise(z2, y2))[0]
    assert ratio[0].item() == pytest.approx(2 * (1 - np_sigmoid(4.0)) ** 2, rel=1e-5)  # 6.47e-4
    assert ratio[1].item() == pytest.approx(2 * (1 - np_sigmoid(-4.0)) ** 2, rel=1e-5)  # 1.93


def test_focal_with_gamma_zero_is_scaled_bce(batch):
    z, y, _, _ = batch
    got = FocalLoss(gamma=0.0, alpha=3.0).elementwise(t(z), t(y))
    torch.testing.assert_close(got, 3.0 * BCELoss().elementwise(t(z), t(y)))


# ---------------------------------------------------------------- DB


def test_db_hand_computed_entries():
    """3 images x 4 classes, counts [4, 2, 1, 0] of N = 6 images, VOC lambda 5, mu 0.3.

    Row 0 has positives {0, 1}: sum 1/n_j = 1/4 + 1/2 = 0.75.
    Entry (0, 1), positive, z = 0.5:
      r = (1/2) / 0.75 = 0.666667; w = sigmoid(10 * (0.666667 - 0.3)) + 0.1 = 0.975076 + 0.1 = 1.075076
      nu = 0.05 * log((6 - 2) / 2) / 5 = 0.0069315; z' = 0.5 - 0.0069315 = 0.4930685
      BCE = log(1 + exp(-0.4930685)) = 0.4766995; loss = 1.075076 * 0.4766995 = 0.5124880
      focal: pt = exp(-0.4766995) = 0.620842; 2 * (1 - 0.620842)^2 * 0.5124880 = 0.1473614
    Entry (0, 2), negative, z = -1.0:
      r = 1 / 0.75 = 1.333333; w = sigmoid(10.333333) + 0.1 = 1.0999675, / lambda = 0.2199935
      nu = 0.05 * log((6 - 1) / 1) / 5 = 0.0160944; z' = 5 * (-1.0 - 0.0160944) = -5.0804719
      BCE = log(1 + exp(-5.0804719)) = 0.0061977; loss = 0.2199935 * 0.0061977 = 0.0013635
    Row 2 has no positives: w = 1 + 0.1 on every entry, so 1.1 / 5 = 0.22 before the BCE.
    """
    counts, n_images = [4, 2, 1, 0], 6
    y = t([[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
    z = t([[0.3, 0.5, -1.0, 0.2], [0.1, -0.4, 1.5, -2.0], [0.0, 0.7, -0.3, 1.0]])
    db = DistributionBalancedLoss(counts, n_images, focal=False, neg_scale=5.0, map_mu=0.3)
    dbf = DistributionBalancedLoss(counts, n_images, focal=True, neg_scale=5.0, map_mu=0.3)
    plain, focal = db.elementwise(z, y), dbf.elementwise(z, y)
    assert plain[0, 1].item() == pytest.approx(0.5124880, abs=2e-6)
    assert focal[0, 1].item() == pytest.approx(0.1473614, abs=2e-6)
    assert plain[0, 2].item() == pytest.approx(0.0013635, abs=2e-7)
    w = db.weights(y)
    assert w[0, 1].item() == pytest.approx(1.075076, abs=1e-6)
    torch.testing.assert_close(w[2], torch.full((4,), 1.1))
    # class 3 (zero count) is treated as count 1: same bias as class 2
    assert db.logit_bias[3].item() == pytest.approx(db.logit_bias[2].item())
    assert db.logit_bias[2].item() == pytest.approx(0.0160944, abs=1e-7)
    np.testing.assert_allclose(
        plain.double().numpy(), np_db(z.double().numpy(), y.numpy(), counts, n_images, 5.0, 0.3, False), rtol=1e-5
    )


@pytest.mark.parametrize("focal", [False, True])
@pytest.mark.parametrize("lam,mu", [(5.0, 0.3), (2.0, 0.2)])
def test_db_matches_reference(batch, focal, lam, mu):
    z, y, counts, n_images = batch
    loss = DistributionBalancedLoss(counts, n_images, focal=focal, neg_scale=lam, map_mu=mu)
    got = loss.elementwise(t(z), t(y)).double().numpy()
    np.testing.assert_allclose(got, np_db(z, y, counts, n_images, lam, mu, focal), rtol=1e-5)
    assert loss(t(z), t(y)).item() == pytest.approx(got.mean(), rel=1e-5)


def test_db_non_default_parameters(batch):
    z, y, counts, n_images = batch
    kw = dict(kappa=0.2, beta=4.0, theta=0.3, gamma=1.5, alpha=0.5)
    loss = DistributionBalancedLoss(
        counts, n_images, focal=True, neg_scale=3.0, map_mu=0.25,
        kappa=0.2, map_beta=4.0, map_alpha=0.3, focal_gamma=1.5, focal_alpha=0.5,
    )
    expected = np_db(z, y, counts, n_images, 3.0, 0.25, True, **kw)
    np.testing.assert_allclose(loss.elementwise(t(z), t(y)).double().numpy(), expected, rtol=1e-5)


def test_db_class_in_every_image_and_empty_class_are_finite():
    # class 0 in all 10 images (N/n - 1 = 0), class 2 with no positives
    loss = DistributionBalancedLoss([10, 3, 0], 10, focal=True, neg_scale=2.0, map_mu=0.2)
    assert torch.isfinite(loss.logit_bias).all()
    # (N - n) clamped to 1: nu_0 = 0.05 * log(1 / 10) / 2
    assert loss.logit_bias[0].item() == pytest.approx(0.05 * math.log(0.1) / 2, rel=1e-6)


def test_db_rejects_inconsistent_counts():
    with pytest.raises(NoisyMLTError, match="num_images"):
        DistributionBalancedLoss([5, 12], 10, focal=False, neg_scale=5.0, map_mu=0.3)
    with pytest.raises(NoisyMLTError, match="class_counts"):
        DistributionBalancedLoss([5, -1], 10, focal=False, neg_scale=5.0, map_mu=0.3)
    with pytest.raises(NoisyMLTError, match="class_counts"):
        DistributionBalancedLoss([[1, 2]], 10, focal=False, neg_scale=5.0, map_mu=0.3)


# ---------------------------------------------------------------- LDAM


def test_ldam_margins_and_loss():
    # n^(-1/4) = [1/2, 1, 1/3, 1 (count 0 -> 1)]; largest -> 0.5
    loss = LDAMLoss([16, 1, 81, 0], max_margin=0.5, scale=30.0)
    np.testing.assert_allclose(loss.margins.numpy(), [0.25, 0.5, 0.5 / 3, 0.5], rtol=1e-6)
    z = np.array([[0.2, -0.1, 0.05, 0.3], [0.0, 0.4, -0.2, 0.1]])
    y = np.array([[1, 0, 1, 0], [0, 1, 0, 1]], float)
    margins = np.array([0.25, 0.5, 0.5 / 3, 0.5])
    expected = np_bce(30.0 * (z - margins * y), y)
    np.testing.assert_allclose(loss.elementwise(t(z), t(y)).double().numpy(), expected, rtol=1e-5)
    # negatives carry no margin: a negative entry equals plain BCE of 30 * z
    assert loss.elementwise(t(z), t(y))[0, 1].item() == pytest.approx(float(np_bce(-3.0, 0.0)), rel=1e-5)


# ---------------------------------------------------------------- shared properties


def all_losses(counts, n_images):
    return {
        "bce": BCELoss(),
        "focal": FocalLoss(),
        "focal_half": FocalLoss(gamma=0.5),
        "db": DistributionBalancedLoss(counts, n_images, focal=False, neg_scale=5.0, map_mu=0.3),
        "db_focal": DistributionBalancedLoss(counts, n_images, focal=True, neg_scale=2.0, map_mu=0.2),
        "db_focal_half": DistributionBalancedLoss(
            counts, n_images, focal=True, neg_scale=2.0, map_mu=0.2, focal_gamma=0.5
        ),
        "ldam": LDAMLoss(counts),
    }


@pytest.mark.parametrize("name", ["bce", "focal", "focal_half", "db", "db_focal", "db_focal_half", "ldam"])
def test_finite_loss_and_gradients_with_extreme_inputs(batch, name):
    z, y, counts, n_images = batch
    z = z.copy()
    z[2] = [300.0, -300.0, 150.0, -150.0, 0.0, 90.0]  # saturated logits: pt == 1 exactly
    y[2] = [1, 0, 0, 1, 0, 1]
    logits = t(z).requires_grad_(True)
    loss = all_losses(counts, n_images)[name](logits, t(y))
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all()
    assert logits.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["bce", "focal", "db", "db_focal", "ldam"])
def test_bf16_autocast_computes_in_float32(batch, name):
    z, y, counts, n_images = batch
    loss = all_losses(counts, n_images)[name]
    logits = t(z).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = loss.elementwise(logits, t(y).to(torch.bfloat16))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, loss.elementwise(logits.float(), t(y)))


def test_forward_is_mean_of_elementwise_and_shapes_are_checked(batch):
    z, y, counts, n_images = batch
    for loss in all_losses(counts, n_images).values():
        assert loss(t(z), t(y)).item() == pytest.approx(loss.elementwise(t(z), t(y)).mean().item(), rel=1e-6)
        with pytest.raises(NoisyMLTError, match="batch, classes"):
            loss(t(z), t(y[:, :3]))
    with pytest.raises(NoisyMLTError, match="built for 6 classes"):
        LDAMLoss(counts)(t(z[:, :4]), t(y[:, :4]))


# ---------------------------------------------------------------- factory


def test_build_loss_names_and_params():
    counts, n = [10, 5, 0], 12
    # the registry, read from the source, names exactly what each loss module's FACTORIES builds
    import importlib

    for name, module in LOSSES.items():
        assert name in importlib.import_module(module).FACTORIES, (name, module)
    assert {"bce", "focal", "db", "db_focal", "ldam"} <= set(LOSSES)  # the paper's
    assert isinstance(build_loss("bce"), BCELoss)
    focal = build_loss("focal", counts, n, gamma=1.0, alpha=0.25)
    assert (focal.gamma, focal.alpha) == (1.0, 0.25)
    db = build_loss("db", counts, n, neg_scale=5.0, map_mu=0.3)
    dbf = build_loss("db_focal", counts, n, neg_scale=2.0, map_mu=0.2)
    assert (db.focal, dbf.focal, dbf.neg_scale, dbf.map_mu) == (False, True, 2.0, 0.2)
    ldam = build_loss("ldam", counts, n, scale=10.0)
    assert ldam.scale == 10.0 and ldam.margins.max().item() == pytest.approx(0.5)


@pytest.mark.parametrize(
    "name,kwargs,match",
    [
        ("cross_entropy", {}, "known losses: bce, db, db_focal, focal, ldam"),
        ("focal", {"gamma": -1.0}, "'gamma' must be >= 0"),
        ("focal", {"alpha": 0.0}, "'alpha' must be > 0"),
        ("focal", {"beta": 1.0}, "unknown parameter"),
        ("db", {"neg_scale": 0.0, "map_mu": 0.3}, "'neg_scale' must be > 0"),
        ("db", {"neg_scale": 5.0}, r"missing required parameter\(s\) \['map_mu'\]"),
        ("db", {"neg_scale": 5.0, "map_mu": 0.3, "focal": True}, "unknown parameter"),
        ("db_focal", {"neg_scale": 5.0, "map_mu": 0.3, "kappa": -0.1}, "'kappa' must be >= 0"),
        ("db_focal", {"neg_scale": 5.0, "map_mu": float("nan")}, "'map_mu' must be finite"),
        ("db_focal", {"neg_scale": "5", "map_mu": 0.3}, "'neg_scale' must be a number"),
        ("ldam", {"max_margin": 0.0}, "'max_margin' must be > 0"),
        ("ldam", {"scale": -30.0}, "'scale' must be > 0"),
    ],
)
def test_build_loss_refuses_bad_input(name, kwargs, match):
    with pytest.raises(NoisyMLTError, match=match):
        build_loss(name, [10, 5, 0], 12, **kwargs)


def test_build_loss_needs_counts_where_used():
    with pytest.raises(NoisyMLTError, match="class counts"):
        build_loss("ldam")
    with pytest.raises(NoisyMLTError, match="number of training images"):
        build_loss("db", [3, 4], None, neg_scale=5.0, map_mu=0.3)
