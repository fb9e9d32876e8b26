"""Which classes each toy image shows: the toy's label models (noisymlt.data.toy draws the glyphs).

``voc``: K "scenes", each a probability per class with labels independent within it, a Bernoulli mixture fit
to VOC2012 trainval's labels (scripts/fit_toy_scenes.py -> toy_scenes.json), glyph class i standing for VOC
class i. The pool then has VOC's class frequencies and co-occurrence (a hub class, glyph 14 for person, in the
images of almost every class), and the [DB] subsampling gives a subset with VOC-MLT's structure
(noisymlt.data.structure; tests/test_structure.py). The test set comes from the same scenes in other
proportions, as VOC2007 test comes from another year's photos than VOC2012 trainval.

``glyph``: the first toy's six hand-made scenes, 1-4 objects drawn from a scene's class distribution. Its
training subset has 2 head classes and a tail apart from the head (issue 37's measurements); it stays
selectable, with its bytes unchanged, until the demo moves to ``voc``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Iterator

import numpy as np

from noisymlt.core.files import read_json
from noisymlt.errors import NoisyMLTError

LABEL_MODELS = ("glyph", "voc")
DEFAULT_SIZES = {"glyph": (2400, 1000), "voc": (5770, 1000)}  # voc: half VOC2012 trainval's 11,540 as the pool

SCENES_FILE = Path(__file__).with_name("toy_scenes.json")
MAX_REDRAWS = 1000  # an empty draw has probability < 0.6 per image: this bound is never reached
# Test scene weights: the pool's times exp(0.5 z), z ~ N(0, 1) per scene. 0.5 gives a pool-to-test class-frequency
# rank correlation of 0.75 over 8 generator seeds (VOC2012 trainval to VOC2007 test: 0.77), chosen on that alone.
TEST_SCENE_SHIFT = 0.5

# glyph model: (scene, probability, {class index: weight}); every class also gets LEAK weight in every scene so
# that rare cross-scene pairs exist. Indices are the toy classes' (noisymlt.data.toy.GLYPHS).
GLYPH_SCENES: tuple[tuple[str, float, dict[int, float]], ...] = (
    ("street", 0.30, {0: 5, 2: 4, 1: 2, 6: 1, 18: 0.5, 12: 0.3}),
    ("home", 0.25, {0: 5, 3: 3, 7: 3, 5: 2, 4: 1, 19: 0.4}),
    ("farm", 0.15, {10: 3, 11: 2, 0: 2, 13: 1, 9: 0.5}),
    ("harbour", 0.12, {8: 3, 14: 2, 0: 2, 15: 1, 17: 0.4}),
    ("garden", 0.10, {16: 2, 10: 2, 3: 2, 1: 1, 12: 0.5}),
    ("station", 0.08, {17: 2, 2: 2, 15: 1, 18: 1, 19: 0.5}),
)
LEAK = 0.05
OBJECTS_PER_IMAGE = (0.4, 0.3, 0.2, 0.1)  # P(1), P(2), P(3), P(4) instances


@lru_cache(maxsize=None)
def fitted_scenes(num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Scene weights (K,) and per-scene label probabilities (K, C) of toy_scenes.json."""
    record = read_json(SCENES_FILE, "the toy's scene model")
    try:
        weights = np.asarray(record["weights"], dtype=np.float64)
        theta = np.asarray(record["theta"], dtype=np.float64)
    except (ValueError, KeyError, TypeError) as exc:
        raise NoisyMLTError(f"{SCENES_FILE}: cannot read the toy's scene model ({exc})") from exc
    if theta.shape != (weights.size, num_classes) or not ((theta > 0) & (theta < 1)).all() or (weights <= 0).any():
        raise NoisyMLTError(f"{SCENES_FILE}: needs K positive weights and K x {num_classes} probabilities in (0, 1), "
                            f"got {weights.shape} and {theta.shape}")
    return weights / weights.sum(), theta


def _pick(cdf: np.ndarray, u: float) -> int:
    # inverse-CDF draw (min() guards the last bin against cumsum rounding below 1)
    return min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)


def _voc_draws(rng: np.random.Generator, n_trainval: int, n_test: int, num_classes: int,
               record: dict) -> Iterator[tuple[int, list[int]]]:
    weights, theta = fitted_scenes(num_classes)
    test_weights = weights * np.exp(TEST_SCENE_SHIFT * rng.standard_normal(weights.size))
    test_weights /= test_weights.sum()
    record.update(scene_model=SCENES_FILE.name, test_scene_weights=[round(float(v), 6) for v in test_weights])
    cdfs = (np.cumsum(weights), np.cumsum(test_weights))
    for row in range(n_trainval + n_test):
        for _ in range(MAX_REDRAWS):
            scene = _pick(cdfs[row >= n_trainval], rng.random())
            classes = np.flatnonzero(rng.random(num_classes) < theta[scene])
            if classes.size:
                break
        else:
            raise NoisyMLTError(f"{SCENES_FILE}: {MAX_REDRAWS} empty label draws in a row; the scene model is broken")
        # glyphs in random order: which one is drawn last (on top) says nothing about its class
        yield scene, [int(classes[i]) for i in rng.permutation(classes.size)]


def _glyph_draws(rng: np.random.Generator, n_trainval: int, n_test: int, num_classes: int,
                 record: dict) -> Iterator[tuple[int, list[int]]]:
    probs = np.array([p for _, p, _ in GLYPH_SCENES], dtype=np.float64)
    table = np.full((len(GLYPH_SCENES), num_classes), LEAK)
    for s, (_, _, members) in enumerate(GLYPH_SCENES):
        for c, w in members.items():
            table[s, c] += w
    scene_cdf = np.cumsum(probs / probs.sum())
    class_cdf = np.cumsum(table / table.sum(axis=1, keepdims=True), axis=1)
    count_cdf = np.cumsum(OBJECTS_PER_IMAGE)
    record.update(scene_names=[name for name, _, _ in GLYPH_SCENES])
    for _ in range(n_trainval + n_test):
        u = rng.random(2)
        scene = _pick(scene_cdf, u[0])
        n_obj = 1 + _pick(count_cdf, u[1])
        yield scene, [min(int(c), num_classes - 1)
                      for c in np.searchsorted(class_cdf[scene], rng.random(n_obj), side="right")]


def label_draws(model: str, rng: np.random.Generator, n_trainval: int, n_test: int, num_classes: int,
                record: dict) -> Iterator[tuple[int, list[int]]]:
    """(scene, classes in drawing order) per image, trainval first; a class may repeat (another instance).
    ``record`` receives what the toy's manifest should say about the model."""
    if model not in LABEL_MODELS:
        raise NoisyMLTError(f"toy scenes: unknown label model {model!r}; choose one of {', '.join(LABEL_MODELS)}")
    draws = _voc_draws if model == "voc" else _glyph_draws
    return draws(rng, n_trainval, n_test, num_classes, record)
