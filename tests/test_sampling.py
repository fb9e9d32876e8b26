"""Samplers: visiting order, class frequencies, purity in (seed, epoch), no global random state."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from noisymlt.errors import NoisyMLTError
from noisymlt.data.sampling import (
    SAMPLERS,
    ClassAwareSampler,
    RandomSampler,
    ReversedSampler,
    build_sampler,
)


def one_hot(classes: list[int], num_classes: int) -> np.ndarray:
    """Single-label rows (class -1 = no label), so each sampled image names the class it came from."""
    y = np.zeros((len(classes), num_classes), dtype=np.uint8)
    for i, c in enumerate(classes):
        if c >= 0:
            y[i, c] = 1
    return y


# images 0-4 class 0, 5-6 class 1, 7 class 2, class 3 empty, 8-9 class 4, 10 unlabelled
SMALL = one_hot([0, 0, 0, 0, 0, 1, 1, 2, 4, 4, -1], 5)
SMALL_CLASS = np.array([0, 0, 0, 0, 0, 1, 1, 2, 4, 4, -1])


def skewed(sizes: list[int]) -> np.ndarray:
    return one_hot([c for c, n in enumerate(sizes) for _ in range(n)], len(sizes))


# ---------------------------------------------------------------- class-aware


def test_class_aware_visits_each_class_once_per_cycle_three_images_each():
    s = ClassAwareSampler(SMALL, seed=3, length=4 * 3 * 10)  # 10 cycles over the 4 non-empty classes
    idx = s.indices(0)
    visits = SMALL_CLASS[idx].reshape(-1, 3)
    assert (visits == visits[:, :1]).all()  # 3 consecutive images of one class per visit
    classes = visits[:, 0].reshape(10, 4)
    for cycle in classes:
        assert sorted(cycle) == [0, 1, 2, 4]  # empty class 3 never visited, the others once per cycle
    assert len({tuple(c) for c in classes}) > 1  # class order reshuffled between cycles


def test_class_aware_each_class_walks_its_own_shuffled_cycle():
    s = ClassAwareSampler(SMALL, seed=5, length=4 * 3 * 20)
    idx = s.indices(2)
    for c, members in [(0, [0, 1, 2, 3, 4]), (1, [5, 6]), (4, [8, 9])]:
        stream = idx[SMALL_CLASS[idx] == c]  # this class's draws, in order
        whole = len(stream) // len(members) * len(members)
        passes = stream[:whole].reshape(-1, len(members))
        for p in passes:  # every full pass is a permutation of the class's images
            assert sorted(p) == members
        if c == 0:
            assert len({tuple(p) for p in passes}) > 1  # reshuffled after each pass
    assert set(idx[SMALL_CLASS[idx] == 2]) == {7}
    assert 10 not in idx  # an image without labels is never drawn


def test_class_aware_default_length_and_truncated_last_visit():
    # max class count 5, C = 5 classes (empty one included): int(5 * 5 / 4) = 6
    s = ClassAwareSampler(SMALL, seed=0)
    assert len(s) == 6 and len(s.indices(0)) == 6
    s = ClassAwareSampler(SMALL, seed=0, length=7)
    visits = SMALL_CLASS[s.indices(0)]
    assert (visits[:3] == visits[0]).all() and (visits[3:6] == visits[3]).all() and len(visits) == 7
    assert len(ClassAwareSampler(SMALL, seed=0, images_per_visit=2, length=8).indices(1)) == 8


def test_class_aware_balances_a_skewed_dataset_random_does_not():
    y = skewed([500, 50, 5])
    cls = y.argmax(1)
    ca = ClassAwareSampler(y, seed=1)
    assert len(ca) == int(500 * 3 / 4)
    freq = np.bincount(cls[ca.indices(0)], minlength=3) / len(ca)
    # whole cycles give exactly equal visits; the cut at 375 = 125 visits leaves at most 1 extra
    np.testing.assert_allclose(freq, [1 / 3] * 3, atol=3 / 375 + 1e-9)
    rnd = np.bincount(cls[RandomSampler(len(y), seed=1).indices(0)], minlength=3) / len(y)
    np.testing.assert_allclose(rnd, np.array([500, 50, 5]) / 555)


def test_class_aware_multilabel_images_counted_for_each_visit():
    y = np.array([[1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 0, 0]], dtype=np.uint8)
    idx = ClassAwareSampler(y, seed=9, length=300).indices(0)
    # each visit's 3 images all carry one common class
    assert all(y[chunk].all(axis=0).any() for chunk in idx.reshape(-1, 3))
    # class 2 lives only in image 2, so its 33 or 34 visits (100 visits, cycles of 3) are [2, 2, 2];
    # a visit of class 1 (images 0 and 2) spans a full pass of its cycle and always holds image 0
    triples = sum(chunk.tolist() == [2, 2, 2] for chunk in idx.reshape(-1, 3))
    assert triples in (33, 34)


# ---------------------------------------------------------------- reversed


def test_reversed_sampler_class_probability_inverse_to_count():
    y = skewed([400, 100, 25, 0])  # class 3 empty: skipped
    cls = y.argmax(1)
    s = ReversedSampler(y, seed=4, length=42_000)
    np.testing.assert_allclose(s.class_prob, [1 / 21, 4 / 21, 16 / 21])
    idx = s.indices(0)
    freq = np.bincount(cls[idx], minlength=4) / len(idx)
    # binomial sd <= 0.0025 at n = 42000; 0.01 is 4 sd
    np.testing.assert_allclose(freq, [1 / 21, 4 / 21, 16 / 21, 0.0], atol=0.01)
    tail = np.bincount(idx[cls[idx] == 2] - 500, minlength=25)  # images 500..524 of class 2
    expected = 42_000 * 16 / 21 / 25  # 1280 draws each
    assert tail.min() > 0.85 * expected and tail.max() < 1.15 * expected


def test_reversed_sampler_default_length_is_n():
    y = skewed([8, 3])
    assert len(ReversedSampler(y, seed=0)) == 11
    assert len(ReversedSampler(y, seed=0).indices(5)) == 11


# ---------------------------------------------------------------- shared properties


def make_all(seed: int = 11):
    y = SMALL
    return [RandomSampler(len(y), seed), ClassAwareSampler(y, seed, length=60), ReversedSampler(y, seed, length=60)]


@pytest.mark.parametrize("k", [0, 1, 2])
def test_pure_function_of_seed_and_epoch(k):
    a, b, other = make_all(11)[k], make_all(11)[k], make_all(12)[k]
    np.testing.assert_array_equal(a.indices(3), b.indices(3))
    np.testing.assert_array_equal(a.indices(3), a.indices(3))
    assert not np.array_equal(a.indices(3), a.indices(4))
    assert not np.array_equal(a.indices(3), other.indices(3))
    a.set_epoch(4)
    assert list(a) == a.indices(4).tolist()
    assert len(list(a)) == len(a)
    assert a.indices(0).dtype == np.int64


def test_resume_mid_epoch_by_skipping_batches():
    s = ClassAwareSampler(SMALL, seed=2, length=60)
    s.set_epoch(1)
    full = [b.tolist() for b in DataLoader(list(range(len(SMALL))), batch_size=8, sampler=s)]
    fresh = ClassAwareSampler(SMALL, seed=2, length=60)  # a restarted process
    fresh.set_epoch(1)
    rest = fresh.indices(1)[3 * 8 :]
    assert [x for b in full[3:] for x in b] == rest.tolist()


def test_global_random_state_untouched():
    random.seed(123)
    np.random.seed(123)
    torch.manual_seed(123)
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    for s in make_all():
        s.indices(0)
        list(s)
    build_sampler("class_aware", SMALL, 0).indices(1)
    assert random.getstate() == before[0]
    np.testing.assert_array_equal(np.random.get_state()[1], before[1])
    assert torch.equal(torch.get_rng_state(), before[2])


def test_random_sampler_is_a_permutation():
    idx = RandomSampler(50, seed=0).indices(7)
    assert sorted(idx.tolist()) == list(range(50))


# ---------------------------------------------------------------- factory and bad input


def test_build_sampler():
    assert set(SAMPLERS) == {"random", "class_aware", "reversed"}
    assert isinstance(build_sampler("random", SMALL, 0), RandomSampler) and len(build_sampler("random", SMALL, 0)) == 11
    ca = build_sampler("class_aware", SMALL, 0, images_per_visit=2, length=10)
    assert isinstance(ca, ClassAwareSampler) and (ca.images_per_visit, len(ca)) == (2, 10)
    assert len(build_sampler("reversed", SMALL, 0, length=30)) == 30


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: build_sampler("weighted", SMALL, 0), "known samplers: class_aware, random, reversed"),
        (lambda: build_sampler("random", SMALL, 0, length=5), "unknown parameter"),
        (lambda: build_sampler("class_aware", SMALL, 0, reduce=4), "unknown parameter"),
        (lambda: ClassAwareSampler(np.zeros((4, 3), np.uint8), 0), "no positive label"),
        (lambda: ReversedSampler(np.zeros((4, 3), np.uint8), 0), "no positive label"),
        (lambda: ClassAwareSampler(SMALL * 2, 0), "only 0 and 1"),
        (lambda: ClassAwareSampler(SMALL[0], 0), "2-D"),
        (lambda: ClassAwareSampler(SMALL, -1), "'seed'"),
        (lambda: ClassAwareSampler(SMALL, 0, images_per_visit=0), "'images_per_visit'"),
        (lambda: ReversedSampler(SMALL, 0, length=0), "'length'"),
        (lambda: RandomSampler(0, 0), "'n'"),
        (lambda: RandomSampler(5, 0).set_epoch(-1), "'epoch'"),
        (lambda: RandomSampler(5, 0).indices(1.5), "'epoch'"),
    ],
)
def test_bad_input_refused(call, match):
    with pytest.raises(NoisyMLTError, match=match):
        call()
