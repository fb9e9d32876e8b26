"""Stitch-Up building blocks: partner sampling, masks, stitching, union, the [CL] loss, Mix-Up and
the noise-level measurement behind the paper's "noise level after Stitch-Up" figure."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from noisymlt.errors import NoisyMLTError
from noisymlt.methods.stitchup import (
    PartnerIndex,
    apply_mask,
    mixup,
    noise_level,
    stitch_feature_maps_concat,
    stitch_features_average,
    stitch_images_concat,
    stitched_noise_level,
    stitchup_loss,
    union_targets,
)


def bce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, targets, reduction="none")


# ---------------------------------------------------------------- partner sampling


def test_partner_index_lists_images_per_class():
    Y = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]])
    index = PartnerIndex(Y)
    assert index.images_of(0).tolist() == [0, 2]
    assert index.images_of(1).tolist() == [1, 2]
    assert index.images_of(2).tolist() == [0, 3]


@pytest.mark.parametrize("k", [2, 4])
def test_partners_always_share_a_noisy_class_with_the_anchor(k):
    gen = np.random.default_rng(7)
    Y = (gen.random((60, 8)) < 0.2).astype(np.uint8)
    Y[np.arange(60), gen.integers(0, 8, 60)] = 1  # every image has a positive, as noisy labels do
    index = PartnerIndex(Y)
    rng = np.random.default_rng(0)
    anchors = rng.integers(0, 60, 3000)
    partners = index.sample(anchors, rng, k=k)
    assert partners.shape == (3000, k - 1) and partners.dtype == np.int64
    # all K images of a stitched sample hold one common noisy class (the paper's S_i^k)
    common = Y[anchors].astype(bool)
    for j in range(k - 1):
        common &= Y[partners[:, j]].astype(bool)
    assert common.any(axis=1).all()
    # the anchor itself is a legal partner, and it does get drawn
    assert (partners[:, 0] == anchors).any()


def test_class_choice_is_uniform_over_the_anchor_positives():
    # anchor 0 holds classes 0 and 1; class 0 lives in images {0, 1}, class 1 in {0, 2, ..., 9}.
    # Class uniform, then image uniform: P(1) = 1/2 * 1/2, P(j>=2) = 1/2 * 1/9, P(0) = 1/4 + 1/18.
    # (Drawing uniformly over the union of images would give P(1) = 1/10 instead.)
    Y = np.zeros((12, 3), dtype=np.uint8)
    Y[[0, 1], 0] = 1
    Y[[0, 2, 3, 4, 5, 6, 7, 8, 9], 1] = 1
    Y[[10, 11], 2] = 1
    n = 40000
    partners = PartnerIndex(Y).sample(np.zeros(n, dtype=np.int64), np.random.default_rng(3))[:, 0]
    freq = np.bincount(partners, minlength=12) / n
    expected = np.array([1 / 4 + 1 / 18, 1 / 4] + [1 / 18] * 8 + [0, 0])
    tolerance = 5 * np.sqrt(expected * (1 - expected) / n)  # 5 sigma, fixed seed
    assert np.all(np.abs(freq - expected) <= tolerance + 1e-12), (freq, expected)


def test_k_partners_share_one_class_drawn_with_replacement():
    # anchor 0 holds classes 0 and 1 with disjoint partner pools: all K-1 partners come from one pool
    Y = np.zeros((5, 2), dtype=np.uint8)
    Y[[0, 1, 2], 0] = 1
    Y[[0, 3, 4], 1] = 1
    partners = PartnerIndex(Y).sample(np.zeros(2000, dtype=np.int64), np.random.default_rng(1), k=5)
    pool0 = np.isin(partners, [0, 1, 2]).all(axis=1)
    pool1 = np.isin(partners, [0, 3, 4]).all(axis=1)
    assert (pool0 | pool1).all()
    assert 0.45 < pool0.mean() < 0.55
    # with replacement: 4 partners from a pool of 3 images must repeat
    assert all(len(set(row)) <= 3 for row in partners.tolist())


def test_anchor_without_positives_gets_a_uniform_partner():
    Y = np.array([[0, 0], [1, 0], [0, 1], [1, 1]])
    partners = PartnerIndex(Y).sample(np.zeros(8000, dtype=np.int64), np.random.default_rng(5))[:, 0]
    freq = np.bincount(partners, minlength=4) / 8000
    assert np.allclose(freq, 0.25, atol=0.03)


def test_partner_sampling_is_reproducible_and_validates():
    Y = np.array([[1, 0], [1, 1], [0, 1]])
    index = PartnerIndex(Y)
    a = index.sample([0, 1, 2], np.random.default_rng(11), k=3)
    b = index.sample([0, 1, 2], np.random.default_rng(11), k=3)
    assert np.array_equal(a, b)
    assert index.sample([], np.random.default_rng(0)).shape == (0, 1)
    with pytest.raises(NoisyMLTError, match="k"):
        index.sample([0], np.random.default_rng(0), k=1)
    with pytest.raises(IndexError):
        index.sample([3], np.random.default_rng(0))
    with pytest.raises(NoisyMLTError, match="0 or 1"):
        PartnerIndex(np.array([[2, 0]]))


# ---------------------------------------------------------------- mask, stitching, union


def test_apply_mask_probability():
    rng = np.random.default_rng(0)
    assert apply_mask(1.0, 500, rng).all()
    assert not apply_mask(0.0, 500, rng).any()
    mask = apply_mask(0.3, 20000, rng)
    assert mask.dtype == bool and mask.shape == (20000,)
    assert abs(mask.mean() - 0.3) < 0.015
    for bad in (-0.1, 1.5, float("nan"), "often"):
        with pytest.raises(NoisyMLTError, match="stitch-up p"):
            apply_mask(bad, 4, rng)


def test_feature_average():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = torch.tensor([[3.0, 0.0], [-3.0, 8.0]])
    c = torch.tensor([[2.0, 1.0], [0.0, 0.0]])
    assert torch.equal(stitch_features_average([a, b]), torch.tensor([[2.0, 1.0], [0.0, 6.0]]))
    assert torch.allclose(stitch_features_average([a, b, c]), torch.tensor([[2.0, 1.0], [0.0, 4.0]]))
    with pytest.raises(ValueError, match="same shape"):
        stitch_features_average([a, a[:1]])
    with pytest.raises(ValueError, match="at least 2"):
        stitch_features_average([a])


def test_feature_map_and_image_concat_along_width():
    m1 = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    m2 = -m1
    out = stitch_feature_maps_concat([m1, m2])
    assert out.shape == (2, 3, 4, 10)
    assert torch.equal(out[..., :5], m1) and torch.equal(out[..., 5:], m2)
    # global average pooling of the stitched map = mean of the per-image pooled features
    assert torch.allclose(out.mean(dim=(2, 3)), (m1.mean(dim=(2, 3)) + m2.mean(dim=(2, 3))) / 2)
    imgs = [torch.full((2, 3, 8, 6), float(i)) for i in range(3)]
    stitched = stitch_images_concat(imgs)
    assert stitched.shape == (2, 3, 8, 18)
    assert torch.equal(stitched[0, 0, 0], torch.tensor([0.0] * 6 + [1.0] * 6 + [2.0] * 6))


def test_union_targets():
    t1 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    t2 = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    t3 = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    assert torch.equal(union_targets([t1, t2]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))
    assert torch.equal(union_targets([t1, t2, t3]), torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]]))


# ---------------------------------------------------------------- Stitch-Up loss

# Targets: anchor t1, partner t2 (row 0 shares class 0, row 1 shares class 1); U = [[1,1,0],[0,1,1]].
T1 = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
T2 = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
# Entries that must not be used hold large logits (5, 7, 9) so that using them would show.
Z_STITCHED = torch.tensor([[0.0, 1.0, 5.0], [7.0, -1.0, 2.0]])
Z1 = torch.tensor([[9.0, 9.0, 1.0], [0.0, 9.0, 9.0]])
Z2 = torch.tensor([[9.0, 9.0, -1.0], [2.0, 9.0, 9.0]])


def test_stitchup_loss_bce_hand_computed():
    # BCE(z, 1) = log(1 + e^-z), BCE(z, 0) = log(1 + e^z).
    # U = 1 on the stitched logits: (0,0) z=0 -> 0.693147, (0,1) z=1 -> 0.313262,
    #                                (1,1) z=-1 -> 1.313262, (1,2) z=2 -> 0.126928.
    # U = 0, mean of the two single images: (0,2) (BCE(1,0) + BCE(-1,0))/2 = (1.313262 + 0.313262)/2 = 0.813262
    #                                       (1,0) (BCE(0,0) + BCE(2,0))/2 = (0.693147 + 2.126928)/2 = 1.410038
    # mean over 2 x 3 entries: (0.693147 + 0.313262 + 0.813262 + 1.410038 + 1.313262 + 0.126928) / 6 = 0.778316
    loss = stitchup_loss(bce, Z_STITCHED, [Z1, Z2], [T1, T2])
    assert loss.item() == pytest.approx(0.7783163, abs=1e-6)


def test_stitchup_loss_unstitched_rows_take_the_plain_loss():
    # row 1 not stitched: plain BCE of the anchor, z1 = [0, 9, 9] vs t1 = [0, 1, 0]:
    # 0.693147 + log(1 + e^-9) + log(1 + e^9) = 0.693147 + 0.000123 + 9.000123 = 9.693394
    # row 0 as before: 0.693147 + 0.313262 + 0.813262 = 1.819671; mean: (1.819671 + 9.693394) / 6
    loss = stitchup_loss(bce, Z_STITCHED, [Z1, Z2], [T1, T2], mask=np.array([True, False]))
    assert loss.item() == pytest.approx((1.819671 + 9.693394) / 6, abs=1e-5)
    all_rows = stitchup_loss(bce, Z_STITCHED, [Z1, Z2], [T1, T2], mask=torch.tensor([True, True]))
    assert all_rows.item() == pytest.approx(0.7783163, abs=1e-6)


def test_stitchup_loss_gradients_reach_the_right_entries():
    zs, z1, z2 = (z.clone().requires_grad_(True) for z in (Z_STITCHED, Z1, Z2))
    stitchup_loss(bce, zs, [z1, z2], [T1, T2]).backward()
    union = union_targets([T1, T2])
    assert torch.all(zs.grad[union == 0] == 0) and torch.all(zs.grad[union == 1] != 0)
    for z in (z1, z2):
        assert torch.all(z.grad[union == 1] == 0) and torch.all(z.grad[union == 0] != 0)
    # d/dz of BCE(z, 0)/2/6 at z1[0,2] = 1: sigmoid(1) / 12
    assert z1.grad[0, 2].item() == pytest.approx(1 / (1 + math.exp(-1)) / 12, rel=1e-6)


def test_stitchup_loss_negative_targets_own_versus_union():
    # A row-weighted loss (like DB's re-balancing weight): loss = z * (1 + positives in the row).
    def row_weighted(z, t):
        return z * (1.0 + t.sum(dim=1, keepdim=True))

    # negatives only at (0,2) and (1,0); positives: stitched z * (1 + 2) on (0,0),(0,1),(1,1),(1,2)
    positives = 3 * (0.0 + 1.0) + 3 * (-1.0 + 2.0)  # = 6
    # own rows: t1 has 1 positive per row, t2 has 2: (0,2): (1*2 + (-1)*3)/2 = -0.5; (1,0): (0*2 + 2*3)/2 = 3
    own = stitchup_loss(row_weighted, Z_STITCHED, [Z1, Z2], [T1, T2])
    assert own.item() == pytest.approx((positives - 0.5 + 3.0) / 6)
    # union rows have 2 positives each: (0,2): (1 - 1)*3/2 = 0; (1,0): (0 + 2)*3/2 = 3
    union = stitchup_loss(row_weighted, Z_STITCHED, [Z1, Z2], [T1, T2], negatives="union")
    assert union.item() == pytest.approx((positives + 0.0 + 3.0) / 6)
    # for BCE the two choices coincide (the selected entries are 0 in both target rows)
    assert stitchup_loss(bce, Z_STITCHED, [Z1, Z2], [T1, T2], negatives="union").item() == pytest.approx(
        0.7783163, abs=1e-6
    )
    with pytest.raises(NoisyMLTError, match="negatives"):
        stitchup_loss(bce, Z_STITCHED, [Z1, Z2], [T1, T2], negatives="partner")


def test_stitchup_loss_checks_shapes():
    with pytest.raises(ValueError, match="2 single-image logits but 3 targets"):
        stitchup_loss(bce, Z_STITCHED, [Z1, Z2], [T1, T2, T2])
    with pytest.raises(ValueError, match="mask has 3 rows"):
        stitchup_loss(bce, Z_STITCHED, [Z1, Z2], [T1, T2], mask=np.ones(3, dtype=bool))


# ---------------------------------------------------------------- Mix-Up


def test_mixup_interpolates_images_and_targets():
    gen = torch.Generator().manual_seed(0)
    images = torch.rand(6, 3, 4, 4, generator=gen)
    targets = torch.tensor([[1, 0], [0, 1], [1, 1], [0, 0], [1, 0], [0, 1]], dtype=torch.float32)
    lams = []
    for seed in range(40):
        mixed, mixed_t, lam, perm = mixup(images, targets, 0.4, np.random.default_rng(seed))
        lams.append(lam)
        assert 0.0 <= lam <= 1.0
        assert sorted(perm.tolist()) == list(range(6))
        assert torch.allclose(mixed, lam * images + (1 - lam) * images[perm])
        assert torch.allclose(mixed_t, lam * targets + (1 - lam) * targets[perm])
        # convex combination: between the two source labels, inside [0, 1]
        lo = torch.minimum(targets, targets[perm])
        hi = torch.maximum(targets, targets[perm])
        assert torch.all(mixed_t >= lo - 1e-6) and torch.all(mixed_t <= hi + 1e-6)
    # Beta(0.4, 0.4) is U-shaped around mean 1/2: most draws lie near 0 or 1
    lams = np.array(lams)
    assert abs(lams.mean() - 0.5) < 0.15
    assert np.mean((lams < 0.2) | (lams > 0.8)) > 0.4
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(NoisyMLTError, match="mixup alpha"):
            mixup(images, targets, bad, np.random.default_rng(0))


# ---------------------------------------------------------------- noise level


def test_noise_level_counts_wrong_positives_and_entries():
    noisy = np.array([[1, 1, 0], [0, 1, 1]])
    clean = np.array([[1, 0, 0], [1, 1, 0]])
    level = noise_level(noisy, clean)
    assert level.wrong_positives.tolist() == [0, 1, 1]
    assert level.positives.tolist() == [1, 2, 1]
    assert level.positive_rate == pytest.approx(2 / 4)
    assert level.entry_rate == pytest.approx(3 / 6)  # + the missed positive (1, 0)
    assert math.isnan(noise_level(np.zeros((1, 2)), np.ones((1, 2))).positive_rate)


def test_stitched_noise_level_hand_example():
    # img: noisy / clean
    # 0: [1,1,0] / [1,0,0]  wrong positive: class 1
    # 1: [0,1,0] / [0,1,0]
    # 2: [1,0,1] / [0,0,1]  wrong positive: class 0
    # 3: [0,0,1] / [1,0,1]  missed positive: class 0
    noisy = np.array([[1, 1, 0], [0, 1, 0], [1, 0, 1], [0, 0, 1]])
    clean = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 1]])
    anchors = np.array([0, 2, 3])
    partners = np.array([[1], [0], [2]])
    # (0,1): noisy union [1,1,0], clean union [1,1,0] -> class 1 is now right
    # (2,0): noisy union [1,1,1], clean union [1,0,1] -> class 1 wrong
    # (3,2): noisy union [1,0,1], clean union [1,0,1] -> all right
    stitched = stitched_noise_level(noisy, clean, anchors, partners)
    assert stitched.positives.tolist() == [3, 2, 2]
    assert stitched.wrong_positives.tolist() == [0, 1, 0]
    assert stitched.positive_rate == pytest.approx(1 / 7)
    assert stitched.entry_rate == pytest.approx(1 / 9)
    assert stitched.group_positive_rates({"head": [0], "tail": [1, 2]}) == pytest.approx(
        {"head": 0.0, "tail": 1 / 4}
    )
    plain = noise_level(noisy[anchors], clean[anchors])
    assert plain.positive_rate == pytest.approx(2 / 5)
    assert plain.entry_rate == pytest.approx(3 / 9)
    # 1-D partners (K = 2) are accepted too
    assert stitched_noise_level(noisy, clean, anchors, partners[:, 0]).positive_rate == pytest.approx(1 / 7)
