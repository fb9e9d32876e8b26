"""Label-noise injection (SPEC 2): rates, replacement distribution, determinism, refusals, CLI."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chisquare

from noisymlt.data import noise
from noisymlt.data.labels import LabelTable, read_labels, write_labels
from noisymlt.data.noise import inject_noise, noise_stats, transition_matrix
from noisymlt.data.noise_models.cooccurrence import cooccurrence_counts
from noisymlt.errors import NoisyMLTError


def synthetic_labels(n: int = 4000, C: int = 8, seed: int = 123) -> np.ndarray:
    """Multi-label rows with structure: two 'scenes' of classes that co-occur, 1..3 labels each."""
    rng = np.random.default_rng(seed)
    scenes = [np.arange(0, C // 2), np.arange(C // 2 - 1, C)]  # one class shared by both
    Y = np.zeros((n, C), dtype=np.uint8)
    for r in range(n):
        members = scenes[int(rng.integers(2))]
        k = int(rng.integers(1, 4))
        Y[r, rng.choice(members, size=min(k, members.size), replace=False)] = 1
    return Y


def run_cli(argv: list[str]) -> int:
    """The `noise` subcommand through its own argparse registration (what `noisymlt noise` runs)."""
    parser = argparse.ArgumentParser(prog="noisymlt")
    noise.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_transition_matrix_by_hand():
    # class 0 with 1 twice and with 2 once; class 3 never co-occurs
    Y = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]])
    T, N = transition_matrix(Y, 0.4), cooccurrence_counts(Y)
    assert T.shape == (4, 5) and (T[:, 4] == 0).all()  # column C: dropped, never by this model
    T = T[:, :4]
    assert N.tolist() == [[0, 2, 1, 0], [2, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    np.testing.assert_allclose(np.diag(T), 0.6)
    np.testing.assert_allclose(T[0], [0.6, 0.4 * 2 / 3, 0.4 / 3, 0.0])
    np.testing.assert_allclose(T[1], [0.4, 0.6, 0.0, 0.0])
    np.testing.assert_allclose(T[3], [0.4 / 3, 0.4 / 3, 0.4 / 3, 0.6])  # uniform fallback
    np.testing.assert_allclose(T.sum(axis=1), 1.0)


@pytest.mark.parametrize("gamma", [0.3, 0.5, 0.7, 0.9])
def test_realised_flip_rate_matches_gamma(gamma):
    Y = synthetic_labels()
    noisy, info = inject_noise(Y, gamma, seed=0)
    positives = int(Y.sum())
    flips = int(info["transitions"].sum())
    assert flips == int(info["flipped"].sum())
    sigma = math.sqrt(positives * gamma * (1 - gamma))
    assert abs(flips - gamma * positives) <= 4 * sigma, (flips, gamma * positives, sigma)
    stats = noise_stats(Y, noisy, [f"c{j}" for j in range(8)], info["transitions"], gamma=gamma, seed=0)
    assert stats["flip_rate"] == pytest.approx(flips / positives)
    for j, rate in enumerate(stats["flip_rate_per_class"]):
        n_j = int(Y[:, j].sum())
        assert abs(rate - gamma) <= 4 * math.sqrt(gamma * (1 - gamma) / n_j), (j, rate)
    # kept labels are exactly the unflipped clean positives
    kept = Y.astype(bool) & ~info["flipped"]
    assert noisy[kept].all()
    assert noisy.any(axis=1).all()


def test_replacements_follow_cooccurrence_rows():
    Y = synthetic_labels()
    _, info = inject_noise(Y, 0.9, seed=1)
    N, counts = cooccurrence_counts(Y), info["transitions"]
    assert np.diag(counts).sum() == 0  # a label is never "replaced" by itself
    for i in (0, 3):  # a single-scene class and the class shared by both scenes
        row = counts[i]
        support = N[i] > 0
        assert row[~support].sum() == 0  # never replaced by a class it does not co-occur with
        expected = N[i, support] / N[i, support].sum() * row.sum()
        assert row.sum() > 800
        assert chisquare(row[support], expected).pvalue > 1e-3
    # the recorded per-label replacements agree with the count matrix
    src = np.argwhere(info["flipped"])
    targets = info["replacement"][info["flipped"]]
    rebuilt = np.zeros_like(counts)
    np.add.at(rebuilt, (src[:, 1], targets), 1)
    assert (rebuilt == counts).all()
    assert (info["replacement"][~info["flipped"]] == -1).all()


def test_lopsided_row_is_sampled_in_proportion():
    # class 0 co-occurs with 1 three times as often as with 2: replacement P = 0.75 / 0.25
    base = np.array([[1, 1, 0]] * 3 + [[1, 0, 1]])
    Y = np.tile(base, (500, 1))
    _, info = inject_noise(Y, 1.0, seed=2)
    row = info["transitions"][0]
    assert row[0] == 0 and row.sum() == 2000
    assert abs(row[1] / 2000 - 0.75) <= 4 * math.sqrt(0.75 * 0.25 / 2000)


def test_class_without_cooccurrence_gets_uniform_replacements():
    Y = np.hstack([synthetic_labels(n=2000, C=7), np.zeros((2000, 1), dtype=np.uint8)])
    Y = np.vstack([Y, np.tile(np.eye(8, dtype=np.uint8)[7], (1500, 1))])  # class 7 only ever alone
    T, N = transition_matrix(Y, 0.6), cooccurrence_counts(Y)
    assert N[7].sum() == 0
    np.testing.assert_allclose(T[7, :7], 0.6 / 7)
    _, info = inject_noise(Y, 0.6, seed=3)
    row = info["transitions"][7]
    assert row[7] == 0 and (row[:7] > 0).all()
    assert chisquare(row[:7]).pvalue > 1e-3


def test_same_seed_same_output_different_seed_differs():
    Y = synthetic_labels()
    a, info_a = inject_noise(Y, 0.5, seed=7)
    b, info_b = inject_noise(Y, 0.5, seed=7)
    c, _ = inject_noise(Y, 0.5, seed=8)
    assert a.tobytes() == b.tobytes()
    assert (info_a["replacement"] == info_b["replacement"]).all()
    assert (a != c).any()
    assert a.dtype == np.uint8 and a.shape == Y.shape


def test_gamma_zero_is_identity_and_gamma_one_flips_everything():
    Y = synthetic_labels(n=500)
    same, info = inject_noise(Y, 0.0, seed=0)
    assert (same == Y).all() and info["transitions"].sum() == 0
    noisy, info = inject_noise(Y, 1.0, seed=0)
    assert info["transitions"].sum() == Y.sum()
    assert noisy.any(axis=1).all()  # every image keeps a positive even when every label moves


def test_every_image_keeps_a_positive_on_single_label_rows():
    Y = np.eye(6, dtype=np.uint8)[np.arange(3000) % 6]
    noisy, _ = inject_noise(Y, 0.9, seed=4)
    assert (noisy.sum(axis=1) == 1).all()


def test_noise_stats_by_hand():
    clean = np.array([[1, 0, 0], [1, 1, 0]])
    noisy = np.array([[0, 1, 0], [1, 1, 0]])
    transitions = np.array([[0, 1, 0], [0, 0, 0], [0, 0, 0]])
    stats = noise_stats(clean, noisy, ["a", "b", "c"], transitions, gamma=0.5, seed=3)
    json.dumps(stats)  # JSON-able
    assert stats["gamma"] == 0.5 and stats["seed"] == 3
    assert stats["clean_counts"] == [2, 1, 0] and stats["noisy_counts"] == [1, 2, 0]
    assert stats["flipped_positives"] == 1
    assert stats["flip_rate"] == pytest.approx(1 / 3)
    assert stats["flip_rate_per_class"] == [0.5, 0.0, None]
    assert stats["missing_rate"] == pytest.approx(1 / 3)
    assert stats["wrong_fraction"] == pytest.approx(1 / 3)
    assert stats["wrong_fraction_per_class"] == [0.0, 0.5, None]
    assert stats["transition_counts"] == transitions.tolist()
    assert stats["classes_without_noisy_positives"] == 1 and stats["empty_classes"] == ["c"]


@pytest.mark.parametrize(
    ("gamma", "seed", "Y", "message"),
    [
        (-0.1, 0, [[1, 0]], r"gamma.*\[0, 1\]"),
        (1.5, 0, [[1, 0]], r"gamma.*\[0, 1\]"),
        (float("nan"), 0, [[1, 0]], r"gamma.*\[0, 1\]"),
        (0.5, -1, [[1, 0]], r"seed.*>= 0"),
        (0.5, 0, [[0, 0], [0, 0]], "no positive label"),
        (0.5, 0, [[1, 0], [0, 0]], r"1 image\(s\) without any positive.*row 1"),
        (0.5, 0, [[1], [1]], "at least 2 classes"),
        (0.5, 0, [[2, 0]], "0 or 1"),
    ],
)
def test_bad_input_refused(gamma, seed, Y, message):
    with pytest.raises(NoisyMLTError, match=message):
        inject_noise(np.array(Y), gamma, seed)


def write_reference_csv(path, Y: np.ndarray, classes: list[str]) -> list[str]:
    ids = [f"2008_{i:06d}" for i in range(len(Y))]
    frame = pd.DataFrame(Y, columns=classes)
    frame.insert(0, "image_id", ids)
    frame.to_csv(path, index=False)
    return ids


def test_cli_round_trip_from_reference_csv(tmp_path):
    classes = [f"class{j}" for j in range(8)]
    Y = synthetic_labels(n=600)
    ids = write_reference_csv(tmp_path / "train.csv", Y, classes)
    out = tmp_path / "noisy" / "g0.5_s2.parquet"
    argv = ["noise", "--labels", str(tmp_path / "train.csv"), "--gamma", "0.5", "--seed", "2", "--out", str(out)]
    assert run_cli(argv) == 0
    table = read_labels(out)
    assert table.image_ids == ids and table.classes == classes
    assert (table.clean == Y).all()
    expected, _ = inject_noise(Y, 0.5, 2)
    assert (table.labels == expected).all()
    assert table.meta["gamma"] == 0.5 and table.meta["seed"] == 2
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["image_id", *classes, *[f"clean_{c}" for c in classes]]
    stats = json.loads(out.with_suffix(".json").read_text())
    assert stats["gamma"] == 0.5 and stats["seed"] == 2 and stats["num_images"] == 600
    assert stats["flipped_positives"] == round(stats["flip_rate"] * Y.sum())
    assert stats["noisy_counts"] == table.labels.sum(axis=0).tolist()
    # deterministic: a rerun overwrites with identical bytes; explicit --stats path honoured
    first = out.read_bytes()
    assert run_cli(argv + ["--stats", str(tmp_path / "s.json")]) == 0
    assert out.read_bytes() == first
    assert json.loads((tmp_path / "s.json").read_text()) == stats
    assert not list(out.parent.glob("*.tmp"))


def test_cli_keeps_paths_of_a_parquet_input(tmp_path):
    Y = synthetic_labels(n=50, C=4)
    ids = [f"{i:06d}" for i in range(50)]
    clean = LabelTable(ids, list("abcd"), Y, paths=[f"JPEGImages/{i}.jpg" for i in ids])
    write_labels(clean, tmp_path / "clean.parquet")
    out = tmp_path / "noisy.parquet"
    labels = str(tmp_path / "clean.parquet")
    assert run_cli(["noise", "--labels", labels, "--gamma", "0.3", "--seed", "0", "--out", str(out)]) == 0
    table = read_labels(out)
    assert table.paths == clean.paths and table.image_ids[0] == "000000"
    assert (table.clean == Y).all()


def test_cli_refusals_name_the_option_or_file(tmp_path):
    classes = ["a", "b", "c"]
    good = tmp_path / "good.csv"
    write_reference_csv(good, np.array([[1, 0, 0], [0, 1, 1]]), classes)
    bad = tmp_path / "has_empty_row.csv"
    write_reference_csv(bad, np.array([[1, 0, 0], [0, 0, 0]]), classes)
    out = str(tmp_path / "o.parquet")
    with pytest.raises(NoisyMLTError, match=r"--gamma.*\[0, 1\]"):
        run_cli(["noise", "--labels", str(good), "--gamma", "1.2", "--seed", "0", "--out", out])
    with pytest.raises(NoisyMLTError, match=r"--seed.*>= 0"):
        run_cli(["noise", "--labels", str(good), "--gamma", "0.5", "--seed", "-3", "--out", out])
    with pytest.raises(NoisyMLTError, match=r"has_empty_row\.csv.*without any positive"):
        run_cli(["noise", "--labels", str(bad), "--gamma", "0.5", "--seed", "0", "--out", out])
    run_cli(["noise", "--labels", str(good), "--gamma", "0.5", "--seed", "0", "--out", out])
    with pytest.raises(NoisyMLTError, match=r"o\.parquet.*already a noisy table"):
        run_cli(["noise", "--labels", out, "--gamma", "0.5", "--seed", "0", "--out", str(tmp_path / "p.parquet")])
    assert not (tmp_path / "p.parquet").exists()


def test_voc_mlt_reference_at_gamma_half(reference_dir):
    table = read_labels(reference_dir / "voc_mlt_train_labels.csv")
    assert len(table) == 1142
    noisy, info = inject_noise(table.labels, 0.5, seed=0)
    positives = int(table.labels.sum())
    flips = int(info["transitions"].sum())
    assert abs(flips - 0.5 * positives) <= 4 * math.sqrt(positives * 0.25)
    assert noisy.any(axis=1).all()
    # VOC-MLT's classes all co-occur with something, so no replacement leaves the co-occurrence support
    N = cooccurrence_counts(table.labels)
    assert (N.sum(axis=1) > 0).all()
    assert (info["transitions"][N == 0] == 0).all()
    stats = noise_stats(table.labels, noisy, table.classes, info["transitions"], gamma=0.5, seed=0)
    assert 0.3 < stats["wrong_fraction"] < 0.6


def test_noisymlt_command_reports_refusal(tmp_path, capsys):
    from noisymlt.cli import main

    write_reference_csv(tmp_path / "l.csv", np.array([[1, 0], [0, 1]]), ["a", "b"])
    argv = ["noise", "--labels", str(tmp_path / "l.csv"), "--gamma", "0.5", "--seed", "0"]
    assert main(argv + ["--out", str(tmp_path / "ok.parquet")]) == 0
    assert main(["noise", "--labels", str(tmp_path / "l.csv"), "--gamma", "7", "--seed", "0",
                 "--out", str(tmp_path / "bad.parquet")]) == 2
    assert "noisymlt noise: error: --gamma: noise rate must lie in [0, 1], got 7.0" in capsys.readouterr().err
    assert not (tmp_path / "bad.parquet").exists()


def _noisy_table(n: int = 60) -> LabelTable:
    rng = np.random.default_rng(0)
    labels = (rng.random((n, 3)) < 0.4).astype(np.uint8)
    return LabelTable([f"im{i}" for i in range(n)], ["red_disc", "blue_bar", "cat"], labels,
                      clean=(rng.random((n, 3)) < 0.4).astype(np.uint8))


def test_a_flipped_byte_that_still_parses_is_caught_on_read(tmp_path):
    """issue 40: one byte flipped in a dictionary page of a noisy table left a file that still read, with every
    red_disc noisy label 0, and 11 runs trained on it. The table holds a digest of each column's values (and
    Parquet page checksums): the damaged file is refused on read, naming it, before any training."""
    import pyarrow.parquet as pq

    path = write_labels(_noisy_table(), tmp_path / "g0.9_s4.parquet")
    assert read_labels(path).labels.sum() > 0
    # the reproduction, byte for byte: the dictionary of column 2 (red_disc) loses its value 1
    c = pq.ParquetFile(path).metadata.row_group(0).column(2)
    b = bytearray(path.read_bytes())
    s = b.index(b"\x1c\x01\x00\x00\x00", c.dictionary_page_offset)
    b[s + 1] = 0
    path.write_bytes(b)
    with pytest.raises(NoisyMLTError, match=rf"^{path}: cannot read label table \(.*checksum.*\); the file was "
                                            "damaged since it was written: delete it and rerun the workflow"):
        read_labels(path)
    # the same edit with the page checksum out of the way (a writer that kept the metadata but not the values):
    # the column digest names the column
    table = pq.read_table(write_labels(_noisy_table(), tmp_path / "b.parquet"))
    frame = table.to_pandas()
    frame["red_disc"] = 0
    import pyarrow as pa

    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(table.schema.metadata),
                   tmp_path / "edited.parquet")
    with pytest.raises(NoisyMLTError, match=r"column\(s\) \['red_disc'\] no longer hold the values written"):
        read_labels(tmp_path / "edited.parquet")
    # noisy-only reads (model selection) check the columns they read
    assert read_labels(write_labels(_noisy_table(), tmp_path / "ok.parquet"), noisy_only=True).clean is None


def test_the_paper_models_draws_are_pinned():
    """The paper's model draws what it drew before noise models became plug-ins (the digests below come from that
    code, commit 529e87b): finished noisy sets, and the runs trained on them, stay valid. numpy's PCG64 stream and
    its doubles are the same on every platform."""
    import hashlib

    rng = np.random.default_rng(20261129)
    Y = (rng.random((3000, 20)) < 0.12).astype(np.uint8)
    Y[np.arange(3000), rng.integers(0, 20, 3000)] = 1
    Y[:, 19] = 0
    Y[:50, :19] = 0
    Y[:50, 19] = 1  # a class that co-occurs with nothing: replaced uniformly
    Y[np.flatnonzero(~Y.any(axis=1)), 0] = 1
    pinned = {(0.3, 0): "9a0abc726303f9d6", (0.3, 1): "239851d064a4b4b6", (0.5, 0): "51fc91ac8024086e",
              (0.5, 1): "31d4987a5fbb30ac", (0.7, 0): "33e5917ddf2fb4e3", (0.7, 1): "774ad38ab3ca3a2f",
              (0.9, 0): "9d9a2b28618c0962", (0.9, 1): "63c7abbce7937422"}
    for (gamma, seed), digest in pinned.items():
        noisy, _ = inject_noise(Y, gamma, seed)
        assert hashlib.sha256(noisy.tobytes()).hexdigest()[:16] == digest, (gamma, seed)
