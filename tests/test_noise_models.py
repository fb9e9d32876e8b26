"""Statistics of the label-noise models (noisymlt.data.noise_models) against the test's own reading of each
definition: kept positives, flips per class pair, labels per image, and each model's own promise (missing: drops
and emptied images; uniform: replacements only to absent classes, all alike; class_conditional: the matrix rows,
zero entries never drawn, the matrix file's checks). The checks are helpers taking a draw function, so the same
helpers run on the package, on an independent simulation, and on deliberately wrong variants of each model, which
they must reject: checks that pass anything would prove nothing."""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chi2_contingency, chisquare

from noisymlt.data import noise
from noisymlt.data.labels import read_labels
from noisymlt.data.noise import inject_noise, noise_stats, transition_matrix
from noisymlt.data.noise_models import NOISE_MODULES, noise_model
from noisymlt.data.noise_models.base import KEEP, flips, read_matrix, register_noise_model, replaced_by_rows
from noisymlt.data.noise_models.class_conditional import ClassConditional
from noisymlt.data.noise_models.cooccurrence import CoOccurrence, cooccurrence_counts
from noisymlt.data.noise_models.missing import Missing
from noisymlt.data.noise_models.uniform import Uniform
from noisymlt.errors import NoisyMLTError

MODELS = ("cooccurrence", "uniform", "class_conditional", "missing")
C = 8
GAMMA = 0.4
SEED, SIM_SEED = 11, 1011  # the package's stream and the simulation's own
ALPHA = 1e-4  # a chi-square p-value below this rejects; the wrong variants below score p < 1e-7


@functools.cache
def labels() -> np.ndarray:
    """3000 long-tailed rows from two overlapping scenes (class 3 in both), 1..4 labels each, and class 7 only ever
    alone: co-occurrence rows of different shapes, one class that co-occurs with nothing, no image holding all."""
    rng = np.random.default_rng(5)
    scenes = [np.array([0, 1, 2, 3]), np.array([3, 4, 5, 6])]
    weights = [np.array([8.0, 4, 2, 1]) / 15, np.array([6.0, 3, 2, 1]) / 12]
    Y = np.zeros((3000, C), dtype=np.uint8)
    for r in range(len(Y)):
        if rng.random() < 0.06:
            Y[r, 7] = 1
            continue
        s = int(rng.random() < 0.4)
        k = int(rng.choice([1, 2, 3, 4], p=[0.35, 0.35, 0.2, 0.1]))
        Y[r, rng.choice(scenes[s], size=k, replace=False, p=weights[s])] = 1
    return Y


def conditional_matrix() -> np.ndarray:
    """Row-stochastic and asymmetric: class i stays with 0.1 + 0.05 i, else moves to i + 1 (0.6 of the rest) or
    i + 3 (0.4), mod C; every other entry is 0 and must never be drawn."""
    M = np.zeros((C, C))
    for i in range(C):
        stay = 0.1 + 0.05 * i
        M[i, i], M[i, (i + 1) % C], M[i, (i + 3) % C] = stay, 0.6 * (1 - stay), 0.4 * (1 - stay)
    return M


MATRIX = conditional_matrix()


def prepared_for(model: str):
    return MATRIX if model == "class_conditional" else None


# -- the test's own reading of the definitions ------------------------------------------------------------------

def leave_probabilities(model: str, Y: np.ndarray, gamma: float) -> np.ndarray:
    """Row i: probability that a clean positive of class i is replaced by class j (columns 0..C-1) or dropped
    (column C); it stays with the rest, 1 - gamma. Uniform's depends on the image: the average over ``Y``."""
    P = np.zeros((C, C + 1))
    if model == "missing":
        P[:, C] = gamma
    elif model == "class_conditional":
        P[:, :C] = gamma * MATRIX
    elif model == "cooccurrence":
        for i in range(C):
            together = np.array([0 if j == i else int((Y[:, i] & Y[:, j]).sum()) for j in range(C)], dtype=float)
            if not together.any():  # co-occurs with nothing: any other class alike
                together = (np.arange(C) != i).astype(float)
            P[i, :C] = gamma * together / together.sum()
    elif model == "uniform":
        for pattern, count in Counter(map(tuple, Y.tolist())).items():
            held = [i for i in range(C) if pattern[i]]
            lacking = [j for j in range(C) if not pattern[j]]
            for i in held:
                for j in lacking:
                    P[i, j] += count * gamma / len(lacking)
        P /= Y.sum(axis=0)[:, None]
    return P


def simulate(model: str, Y: np.ndarray, gamma: float, seed: int) -> tuple[np.ndarray, dict]:
    """The definition drawn with the test's own random stream, class by class (rng.choice, random keys):
    the noisy labels and the counts ``inject_noise`` reports."""
    rng = np.random.default_rng(seed)
    rows, cols = np.nonzero(Y)
    leaves = rng.random(cols.size) < gamma
    target = np.full(cols.size, -1)
    if model == "uniform":
        leaves &= Y[rows].sum(axis=1) < C  # an image holding every class keeps its labels
        keys = rng.random((cols.size, C)) + 2.0 * Y[rows]  # the smallest key: a class the image lacks, all alike
        target[leaves] = keys[leaves].argmin(axis=1)
    elif model != "missing":
        R = leave_probabilities(model, Y, 1.0)[:, :C]
        for i in range(C):
            sel = np.flatnonzero(leaves & (cols == i))
            target[sel] = rng.choice(C, size=sel.size, p=R[i])
    moved, lost = target >= 0, leaves & (target < 0)
    noisy = np.zeros_like(Y)
    noisy[rows[~leaves], cols[~leaves]] = 1
    noisy[rows[moved], target[moved]] = 1
    flipped = np.zeros(Y.shape, dtype=bool)
    flipped[rows[leaves], cols[leaves]] = True
    replacement = np.full(Y.shape, -1)
    replacement[rows[moved], cols[moved]] = target[moved]
    transitions = np.zeros((C, C), dtype=np.int64)
    np.add.at(transitions, (cols[moved], target[moved]), 1)
    return noisy, {"flipped": flipped, "replacement": replacement, "transitions": transitions,
                   "dropped": np.bincount(cols[lost], minlength=C)}


def package(model: str):
    return lambda Y, gamma, seed: inject_noise(Y, gamma, seed, model, prepared_for(model))


def simulation(model: str):
    return functools.partial(simulate, model)


# -- the checks: draw(Y, gamma, seed) -> (noisy, info) against the definition of ``model`` ---------------------

def assert_fits(observed, probabilities, what: str) -> None:
    """Counts follow the probabilities: none where a probability is 0; chi-square p > ALPHA on the rest (cells
    expected under 5 pooled)."""
    observed, p = np.asarray(observed), np.asarray(probabilities, dtype=float)
    assert observed[p == 0].sum() == 0, f"{what}: counts {observed.tolist()} where the definition gives 0"
    expected = observed.sum() * p / p.sum()
    big, small = expected >= 5, (expected < 5) & (p > 0)
    obs, exp = list(observed[big]), list(expected[big])
    if small.any():
        obs.append(observed[small].sum())
        exp.append(expected[small].sum())
    if len(obs) < 2:
        return
    pvalue = chisquare(obs, exp).pvalue
    assert pvalue > ALPHA, (f"{what}: counts {observed.tolist()} vs expected {np.round(expected, 1).tolist()} "
                            f"(chi-square p = {pvalue:.2g})")


def check_kept(draw, model: str) -> None:
    """Each clean positive stays with probability 1 - gamma whatever its class: per class within 4.5 sigma
    (binomial), all positives together within 4 sigma; a kept positive is in the noisy set."""
    Y = labels()
    noisy, info = draw(Y, GAMMA, SEED)
    kept = Y.astype(bool) & ~info["flipped"]
    assert noisy[kept].all(), "a kept positive is missing from the noisy labels"
    n, k = Y.sum(axis=0), kept.sum(axis=0)
    off = np.abs(k - (1 - GAMMA) * n) / np.sqrt(n * GAMMA * (1 - GAMMA))
    assert (off <= 4.5).all(), (f"kept per class {k.tolist()} of {n.tolist()}: class {off.argmax()} off by "
                                f"{off.max():.1f} sigma")
    total = abs(k.sum() - (1 - GAMMA) * n.sum()) / math.sqrt(n.sum() * GAMMA * (1 - GAMMA))
    assert total <= 4, f"kept {k.sum()} of {n.sum()}: {total:.1f} sigma from 1 - gamma"


def check_flips(draw, model: str) -> None:
    """Where the leaving positives of each class go (replaced by j, dropped) follows the definition's row."""
    Y = labels()
    _, info = draw(Y, GAMMA, SEED)
    fates = np.hstack([info["transitions"], info["dropped"][:, None]])
    assert (fates.sum(axis=1) == info["flipped"].sum(axis=0)).all(), "a leaving positive neither replaced nor dropped"
    leave = leave_probabilities(model, Y, GAMMA)
    for i in range(C):
        assert_fits(fates[i], leave[i], f"{model}: class {i} replaced by 0..{C - 1} / dropped")


def check_labels_per_image(draw, model: str, copies: int = 4) -> None:
    """The number of noisy labels per image has the simulation's distribution (two-sample chi-square, counts under
    10 pooled) and mean (within 4 sigma), over ``copies`` noisy copies each: a replacement often lands on a label
    that itself left, so the count moves little and one copy of 3000 images would miss a wrong target set."""
    Y = labels()
    a = np.concatenate([draw(Y, GAMMA, SEED + s)[0].sum(axis=1) for s in range(copies)])
    b = np.concatenate([simulate(model, Y, GAMMA, SIM_SEED + s)[0].sum(axis=1) for s in range(copies)])
    table = np.array([np.bincount(a, minlength=C + 1), np.bincount(b, minlength=C + 1)])
    big = table.sum(axis=0) >= 10
    table = np.column_stack([table[:, big], table[:, ~big].sum(axis=1)]) if (~big).any() else table
    table = table[:, table.sum(axis=0) > 0]
    pvalue = chi2_contingency(table).pvalue
    assert pvalue > ALPHA, f"{model}: labels per image {table.tolist()} (measured; simulated): p = {pvalue:.2g}"
    sigma = math.sqrt(a.var() / a.size + b.var() / b.size)
    assert abs(a.mean() - b.mean()) <= 4 * sigma, f"{model}: mean labels per image {a.mean():.3f} vs {b.mean():.3f}"


def check_missing(draw, model: str) -> None:
    """Missing labels: each positive dropped with probability gamma (per class within 4.5 sigma), nothing replaced,
    and as many images left empty as expected: the sum over images of gamma ** labels, within 4 sigma."""
    Y = labels()
    noisy, info = draw(Y, GAMMA, SEED)
    assert info["transitions"].sum() == 0, "missing labels replaced a positive"
    assert (noisy == (Y.astype(bool) & ~info["flipped"])).all()
    n, dropped = Y.sum(axis=0), info["dropped"]
    off = np.abs(dropped - GAMMA * n) / np.sqrt(n * GAMMA * (1 - GAMMA))
    assert (off <= 4.5).all(), f"dropped per class {dropped.tolist()} of {n.tolist()}: {off.max():.1f} sigma"
    p_empty = GAMMA ** Y.sum(axis=1).astype(float)
    empty = int((noisy.sum(axis=1) == 0).sum())
    sigma = math.sqrt((p_empty * (1 - p_empty)).sum())
    assert abs(empty - p_empty.sum()) <= 4 * sigma, f"{empty} images left empty, expected {p_empty.sum():.0f}"


def check_uniform_over_absent(draw, model: str) -> None:
    """Uniform: a replacement is never a class of the image's clean set, and each class the image lacks is as
    likely: the target's rank among them is uniform, for every number of absent classes."""
    Y = labels()
    _, info = draw(Y, GAMMA, SEED)
    r, i = np.nonzero(info["replacement"] >= 0)
    j = info["replacement"][r, i]
    assert not Y[r, j].any(), f"{int(Y[r, j].sum())} replacement(s) by a class the image already holds"
    absent = Y[r] == 0
    size = absent.sum(axis=1)
    rank = (absent & (np.arange(C) < j[:, None])).sum(axis=1)
    for a in np.unique(size):
        assert_fits(np.bincount(rank[size == a], minlength=a), np.ones(a), f"rank among {a} absent classes")


CHECKS = {"kept": check_kept, "flips": check_flips, "labels_per_image": check_labels_per_image,
          "missing": check_missing, "uniform_absent": check_uniform_over_absent}
OWN_CHECKS = {model: ["kept", "flips", "labels_per_image"] for model in MODELS}
OWN_CHECKS["missing"].append("missing")
OWN_CHECKS["uniform"].append("uniform_absent")
MODEL_CHECKS = [(model, check) for model in MODELS for check in OWN_CHECKS[model]]


@pytest.mark.parametrize(("model", "check"), MODEL_CHECKS)
def test_model_follows_its_definition(model, check):
    CHECKS[check](package(model), model)


@pytest.mark.parametrize(("model", "check"), MODEL_CHECKS)
def test_checks_accept_the_independent_simulation(model, check):
    """The simulation passes the checks too: the checks and the simulation agree with the definition."""
    CHECKS[check](simulation(model), model)


@pytest.mark.parametrize("model", MODELS)
def test_transition_matrix_is_the_definition(model):
    Y = labels()
    leave = leave_probabilities(model, Y, GAMMA)
    expected = leave.copy()
    expected[np.arange(C), np.arange(C)] += 1 - leave.sum(axis=1)
    np.testing.assert_allclose(transition_matrix(Y, GAMMA, model, prepared_for(model)), expected, atol=1e-12)


# -- wrong variants, which the checks must reject --------------------------------------------------------------

def uniform_over_other_classes(clean, cols, gamma, rng):
    """A leaving positive of class i replaced by any class but i, all alike: wrong for uniform (the image's own
    classes are drawn too) and for cooccurrence (not in proportion to co-occurrence)."""
    C = clean.shape[1]
    return replaced_by_rows((1.0 - np.eye(C)) / (C - 1), cols, gamma, rng)


class UniformOverAllOthers(Uniform):
    """Wrong: a replacement is any other class, held by the image or not."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return uniform_over_other_classes(clean, cols, gamma, rng)


class UniformSkipsLastAbsent(Uniform):
    """Wrong by one: picks among the first count - 1 absent classes, so the last is never drawn."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        out = np.full(cols.size, KEEP, dtype=np.int64)
        flip = np.flatnonzero(flips(cols.size, gamma, rng))
        absent = clean[rows[flip]] == 0
        pick = (rng.random(flip.size) * np.maximum(absent.sum(axis=1) - 1, 1)).astype(np.int64)
        out[flip] = (np.cumsum(absent, axis=1) <= pick[:, None]).sum(axis=1)
        return out


class MissingTwice(Missing):
    """Wrong: drops with probability 2 gamma."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return super().draw(clean, rows, cols, min(1.0, 2 * gamma), rng, prepared)


class MissingPlusTenth(Missing):
    """Wrong: drops with probability gamma + 0.1."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return super().draw(clean, rows, cols, min(1.0, gamma + 0.1), rng, prepared)


class ClassConditionalTransposed(ClassConditional):
    """Wrong: draws from the columns of the matrix (its transpose, rows renormalised)."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return super().draw(clean, rows, cols, gamma, rng, np.ascontiguousarray(prepared.T))


class ClassConditionalNoDiagonal(ClassConditional):
    """Wrong: reads the diagonal as 'kept' and renormalises the rest, so a replaced label never stays."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return super().draw(clean, rows, cols, gamma, rng, prepared * (1.0 - np.eye(len(prepared))))


class CoOccurrenceUniform(CoOccurrence):
    """Wrong: replacements uniform over the other classes, not in proportion to co-occurrence."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        return uniform_over_other_classes(clean, cols, gamma, rng)


class CoOccurrenceOverPartners(CoOccurrence):
    """Wrong: uniform over the classes that co-occur with i (the right support, the wrong proportions)."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        R = (cooccurrence_counts(clean) > 0).astype(float)
        R[R.sum(axis=1) == 0] = 1.0 - np.eye(clean.shape[1])[R.sum(axis=1) == 0]
        return replaced_by_rows(R / R.sum(axis=1, keepdims=True), cols, gamma, rng)


class CoOccurrenceWithSelf(CoOccurrence):
    """Wrong: the co-occurrence counts keep their diagonal (a class 'co-occurs' with itself), so a label may be
    replaced by itself."""

    def draw(self, clean, rows, cols, gamma, rng, prepared):
        Y = clean.astype(np.float64)
        N = Y.T @ Y
        return replaced_by_rows(N / N.sum(axis=1, keepdims=True), cols, gamma, rng)


# variant -> (the model it imitates, the checks that must reject it)
WRONG = {
    UniformOverAllOthers: ("uniform", ["flips", "labels_per_image", "uniform_absent"]),
    UniformSkipsLastAbsent: ("uniform", ["flips", "uniform_absent"]),
    MissingTwice: ("missing", ["kept", "labels_per_image", "missing"]),
    MissingPlusTenth: ("missing", ["kept", "labels_per_image", "missing"]),
    ClassConditionalTransposed: ("class_conditional", ["flips"]),
    ClassConditionalNoDiagonal: ("class_conditional", ["flips"]),
    CoOccurrenceUniform: ("cooccurrence", ["flips", "labels_per_image"]),
    CoOccurrenceOverPartners: ("cooccurrence", ["flips"]),
    CoOccurrenceWithSelf: ("cooccurrence", ["flips", "labels_per_image"]),
}


def registered_variant(monkeypatch, variant: type) -> tuple[str, object]:
    """The variant as a registered model under a test-only name, so that it runs through the real inject_noise;
    monkeypatch takes it out again."""
    like, _ = WRONG[variant]
    model = variant()
    model.name = model.label = f"test-{variant.__name__}"
    monkeypatch.setitem(register_noise_model.MODELS, model.name, model)
    monkeypatch.setitem(NOISE_MODULES, model.name, NOISE_MODULES[like])
    return model.name, lambda Y, gamma, seed: inject_noise(Y, gamma, seed, model.name, prepared_for(like))


@pytest.mark.parametrize(("variant", "check"), [(v, c) for v, (_, checks) in WRONG.items() for c in checks],
                         ids=lambda p: getattr(p, "__name__", p))
def test_checks_reject_wrong_variant(monkeypatch, variant, check):
    name, draw = registered_variant(monkeypatch, variant)
    assert draw(labels(), GAMMA, SEED)[1]["model"] == name  # the variant ran, not its model
    with pytest.raises(AssertionError):
        CHECKS[check](draw, WRONG[variant][0])


# -- each model's own promises ---------------------------------------------------------------------------------

def test_uniform_image_holding_every_class_keeps_its_labels():
    Y = np.vstack([np.ones((50, C), dtype=np.uint8), labels()[:200]])
    noisy, info = inject_noise(Y, 1.0, 0, "uniform")
    assert (noisy[:50] == 1).all() and not info["flipped"][:50].any()
    assert info["flipped"][50:].sum() == Y[50:].sum()  # every other positive leaves at gamma 1
    np.testing.assert_allclose(transition_matrix(Y[:50], 1.0, "uniform")[:, :C], np.eye(C))


def test_class_conditional_follows_the_rows_at_gamma_one():
    """Every positive leaves: the diagonal is drawn (the label is replaced by itself and stays in the noisy set), a
    zero entry never is, and each row's counts fit the matrix."""
    Y = labels()
    noisy, info = inject_noise(Y, 1.0, 3, "class_conditional", MATRIX)
    counts = info["transitions"]
    assert counts.sum() == Y.sum() and info["dropped"].sum() == 0
    assert counts[MATRIX == 0].sum() == 0
    assert (np.diag(counts) > 0).all()
    stayed = info["replacement"] == np.arange(C)
    assert stayed.any() and noisy[stayed].all() and info["flipped"][stayed].all()
    for i in range(C):
        assert_fits(counts[i], MATRIX[i], f"class {i}")


def test_missing_stats_count_drops_and_empty_images():
    Y = labels()
    noisy, info = inject_noise(Y, GAMMA, SEED, "missing")
    stats = noise_stats(Y, noisy, [f"c{j}" for j in range(C)], info["transitions"], gamma=GAMMA, seed=SEED,
                        model="missing", dropped=info["dropped"])
    json.dumps(stats)
    assert stats["model"] == "missing" and stats["flipped_positives"] == 0  # flips count replacements only
    assert stats["dropped_positives"] == int(info["flipped"].sum()) == int(Y.sum() - noisy.sum())
    assert stats["drop_rate"] == pytest.approx(stats["dropped_positives"] / Y.sum())
    assert stats["images_without_noisy_labels"] == int((noisy.sum(axis=1) == 0).sum()) > 0
    assert stats["labels_per_image"]["noisy"] == np.bincount(noisy.sum(axis=1), minlength=5).tolist()
    all_gone, _ = inject_noise(Y, 1.0, SEED, "missing")
    assert not all_gone.any()


# -- the matrix file -------------------------------------------------------------------------------------------

def write_matrix_csv(path, M, names) -> str:
    rows = [",".join(["", *names])] + [",".join([name, *map(repr, map(float, row))]) for name, row in zip(names, M)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_matrix_file_csv_and_npy_read_alike(tmp_path):
    names = [f"c{j}" for j in range(C)]
    np.save(tmp_path / "m.npy", MATRIX)
    from_csv = read_matrix(write_matrix_csv(tmp_path / "m.csv", MATRIX, names), names, "test")
    assert (from_csv == MATRIX).all() and (read_matrix(tmp_path / "m.npy", names, "test") == MATRIX).all()
    prepared = noise_model("class_conditional").prepare({"matrix": str(tmp_path / "m.csv")}, names, "params.yaml")
    assert (prepared == MATRIX).all()


# file -> its content (CSV text or an array for .npy) and the one error it must get
BAD_MATRICES = {
    "wrong_names.csv": (",a,b,c\na,1,0,0\nc,0,1,0\nb,0,0,1\n",
                        r"the header row and the first column must name the dataset's 3 classes in its order "
                        r"\(a, b, c\)"),
    "row_sum.csv": (",a,b,c\na,1,0,0\nb,0.5,0.4,0\nc,0,0,1\n", r"row 'b' sums to 0\.9, not 1 \(1 row\(s\) off\)"),
    "negative.csv": (",a,b,c\na,1.2,-0.2,0\nb,0,1,0\nc,0,0,1\n", r"entries must be probabilities in \[0, 1\]"),
    "ragged.csv": (",a,b,c\na,1,0,0\nb,0,1\nc,0,0,1\n", r"row 'b' has 2 values, need 3 \(one per class\)"),
    "text.csv": (",a,b,c\na,1,0,0\nb,0,one,0\nc,0,0,1\n", r"a cell is not a number \(.*\)"),
    "shape.npy": (np.eye(3)[:, :2], r"shape \(3, 2\), the dataset has 3 classes: need 3 x 3"),
}


@pytest.mark.parametrize("name", BAD_MATRICES)
def test_bad_matrix_file_refused_naming_it(tmp_path, name):
    content, message = BAD_MATRICES[name]
    path = tmp_path / name
    if path.suffix == ".npy":
        np.save(path, content)
    else:
        path.write_text(content)
    where = rf"^params\.yaml: noise\.class_conditional\.matrix: {re.escape(str(path))}: "
    with pytest.raises(NoisyMLTError, match=where + message + "$"):
        noise_model("class_conditional").prepare({"matrix": str(path)}, ["a", "b", "c"], "params.yaml")


def test_matrix_file_missing_or_not_given(tmp_path):
    model = noise_model("class_conditional")
    with pytest.raises(NoisyMLTError, match=rf"{re.escape(str(tmp_path / 'nope.csv'))}: no such file$"):
        model.prepare({"matrix": str(tmp_path / "nope.csv")}, ["a", "b"], "params.yaml")
    with pytest.raises(NoisyMLTError, match=r"params\.yaml: noise model class_conditional needs "
                                            r"noise\.class_conditional\.matrix"):
        model.prepare({}, ["a", "b"], "params.yaml")


# -- the command -----------------------------------------------------------------------------------------------

def run_cli(argv: list[str]) -> int:
    """The `noise` subcommand through its own argparse registration (what `noisymlt noise` runs)."""
    parser = argparse.ArgumentParser(prog="noisymlt")
    noise.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


PAPER_STATS_KEYS = {"gamma", "seed", "num_images", "classes", "clean_positives", "noisy_positives", "clean_counts",
                    "noisy_counts", "flipped_positives", "flip_rate", "flip_rate_per_class", "missing_rate",
                    "wrong_fraction", "wrong_fraction_per_class", "transition_counts",
                    "classes_without_noisy_positives", "empty_classes", "source"}


def test_cli_names_the_model_and_the_paper_default_stays_unnamed(tmp_path, capsys):
    names = [f"c{j}" for j in range(C)]
    Y = labels()[:600]
    frame = pd.DataFrame(Y, columns=names)
    frame.insert(0, "image_id", [f"im{i:04d}" for i in range(len(Y))])
    frame.to_csv(tmp_path / "train.csv", index=False)
    base = ["noise", "--labels", str(tmp_path / "train.csv"), "--gamma", "0.5", "--seed", "1"]

    out = tmp_path / "uniform.parquet"
    assert run_cli(base + ["--out", str(out), "--model", "uniform"]) == 0
    table = read_labels(out)
    assert table.meta["noise"] == {"model": "uniform"}
    assert (table.labels == inject_noise(Y, 0.5, 1, "uniform")[0]).all()
    stats = json.loads(out.with_suffix(".json").read_text())
    assert stats["model"] == "uniform" and stats["dropped_positives"] == 0
    assert stats["labels_per_image"] == {
        "clean": np.bincount(Y.sum(axis=1), minlength=5).tolist(),
        "noisy": np.bincount(table.labels.sum(axis=1), minlength=5).tolist()}

    matrix = write_matrix_csv(tmp_path / "m.csv", MATRIX, names)
    out = tmp_path / "cc.parquet"
    assert run_cli(base + ["--out", str(out), "--model", "class_conditional", "--option", f"matrix={matrix}"]) == 0
    assert read_labels(out).meta["noise"] == {"model": "class_conditional", "matrix": matrix}

    # the paper's model, by default or by name: no model keys, the same bytes
    default, named = tmp_path / "default.parquet", tmp_path / "named.parquet"
    assert run_cli(base + ["--out", str(default)]) == 0
    assert run_cli(base + ["--out", str(named), "--model", "cooccurrence"]) == 0
    assert "noise" not in read_labels(default).meta
    assert set(json.loads(default.with_suffix(".json").read_text())) == PAPER_STATS_KEYS
    assert default.read_bytes() == named.read_bytes()
    assert default.with_suffix(".json").read_bytes() == named.with_suffix(".json").read_bytes()

    # an option the model does not read is refused, naming it and what the model reads, before anything is written
    refused = tmp_path / "refused.parquet"
    with pytest.raises(NoisyMLTError, match=r"^noise model uniform: unknown option\(s\) matrix; it reads none$"):
        run_cli(base + ["--out", str(refused), "--model", "uniform", "--option", f"matrix={matrix}"])
    with pytest.raises(NoisyMLTError, match=r"^noise model class_conditional: unknown option\(s\) matrx; it reads "
                                            r"matrix$"):
        run_cli(base + ["--out", str(refused), "--model", "class_conditional", "--option", f"matrx={matrix}"])
    from noisymlt.cli import main

    assert main(base + ["--out", str(refused), "--model", "missing", "--option", "rate=0.2"]) == 2
    assert "noise model missing: unknown option(s) rate; it reads none" in capsys.readouterr().err
    assert not refused.exists() and not refused.with_suffix(".json").exists()
