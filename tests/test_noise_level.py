"""Noise level of the training targets (noisymlt.training.noise_monitor), its figure, and the pseudo-label figure."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import interrupt_training, tiny_params, toy_trainer
from noisymlt.cli import main
from noisymlt.data.labels import read_labels, write_labels
from noisymlt.errors import NoisyMLTError
from noisymlt.methods.base import PublishedTargets
from noisymlt.methods.stitchup import stitched_noise_level
from noisymlt.config import resolve_run
from noisymlt.data.sampling import EpochPlan
from noisymlt.training.noise_monitor import NoiseMonitor, align_clean_labels

EPOCHS, ITERS = 2, 3


def ours_trainer(tiny_toy, out, method="ours", epochs=EPOCHS, **kwargs):
    resolved = resolve_run(tiny_params(method, epochs=epochs, lr_steps=[epochs]), "toy", method, 0.5, 0)
    return toy_trainer(tiny_toy, resolved, out, limit_iters=ITERS, **kwargs)


def read_log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tiny_toy, tmp_path_factory):
    """The same short Ours run, with and without the clean labels given to the trainer."""
    base = tmp_path_factory.mktemp("noise_runs")
    with_clean = ours_trainer(tiny_toy, base / "clean", clean_labels=tiny_toy["train"])
    with_clean.run()
    plain = ours_trainer(tiny_toy, base / "plain")
    plain.run()
    return {"clean": (with_clean, base / "clean"), "plain": (plain, base / "plain")}


def tables_by_id(tiny_toy) -> tuple[np.ndarray, np.ndarray]:
    """Noisy and clean labels straight from the two Parquet files, joined on image_id (not via the package)."""
    noisy = pd.read_parquet(tiny_toy["noisy"])
    clean = pd.read_parquet(tiny_toy["train"])
    classes = [c for c in clean.columns if c not in ("image_id", "path")]
    joined = noisy[["image_id"]].merge(clean, on="image_id", how="left", validate="one_to_one")
    return noisy[classes].to_numpy().astype(bool), joined[classes].to_numpy().astype(bool)


def test_logged_noise_at_iteration_0_equals_the_tables(runs, tiny_toy):
    trainer, out = runs["clean"]
    noisy, clean = tables_by_id(tiny_toy)
    log = {(r["branch"], r["targets"]): r for r in read_log(out / "noise_level.jsonl")
           if r["epoch"] == 1 and r["iteration"] == 0}
    for stream in trainer.streams:
        items = EpochPlan(stream, 0, trainer.iters).batches(0)[0]  # the trainer's first batch of this stream
        ids = np.array([i for i, _, _ in items])
        stitched = np.array([s for _, _, s in items])
        anchors = ids[:, 0]
        wrong = int((noisy[anchors] & ~clean[anchors]).sum())
        positives = int(noisy[anchors].sum())
        missing = int((~noisy[anchors] & clean[anchors]).sum())
        got = log[stream.name, "noisy"]
        assert (got["wrong_positives"], got["positives"], got["missing_positives"], got["rows"]) == (
            wrong, positives, missing, len(items))
        assert got["noise_level"] == pytest.approx(wrong / positives, abs=1e-6)
        assert 0.1 < got["noise_level"] < 0.9  # gamma 0.5: a real share of the positives is wrong
        union = stitched_noise_level(noisy, clean, anchors[stitched], ids[stitched, 1:])
        got = log[stream.name, "noisy_stitched"]
        assert (got["wrong_positives"], got["positives"], got["rows"]) == (
            int(union.wrong_positives.sum()), int(union.positives.sum()), int(stitched.sum()))
    assert {k for k in log} == {(b, t) for b in ("random", "balanced")
                                for t in ("noisy", "corrected", "noisy_stitched", "corrected_stitched")}


def test_stitched_union_noise_on_a_hand_made_example():
    clean = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]])
    monitor = NoiseMonitor(clean, {"head": [0], "medium": [1], "tail": [2]}, torch.device("cpu"), iterations=5)
    noisy = torch.tensor([[1, 0, 1],   # anchor image 0: class 2 wrong
                          [0, 0, 1],   # its partner, image 1: class 1 missing, class 2 wrong
                          [0, 1, 0],   # anchor image 2 (not stitched): class 1 wrong, class 2 missing
                          [1, 1, 0]], dtype=torch.float32)  # image 3: a partner never used
    corrected = noisy.clone()
    corrected[1, 1] = 1  # co-learning adds the partner's missing class 1
    record = PublishedTargets("random", torch.tensor([[0, 1], [2, 3]]), torch.tensor([True, False]), noisy, corrected)
    monitor.observe(0, 3, [record])
    got = {r["targets"]: r for r in monitor.records()}
    # stitched row 0: union of noisy {0, 2} u {2} = {0, 2}; union of clean {0} u {1} = {0, 1}
    s = got["noisy_stitched"]
    counts = ("rows", "wrong_positives", "positives", "missing_positives", "clean_positives")
    assert tuple(s[k] for k in counts) == (1, 1, 2, 1, 2)
    assert (s["wrong_positives_tail"], s["positives_head"], s["missing_positives_medium"]) == (1, 1, 1)
    assert s["noise_level"] == 0.5 and s["missing_rate"] == 0.5
    c = got["corrected_stitched"]  # {0, 1, 2} against {0, 1}
    assert (c["wrong_positives"], c["positives"], c["missing_positives"]) == (1, 3, 0)
    a = got["noisy"]  # anchors 0 and 2: {0, 2} vs {0}; {1} vs {2}
    assert tuple(a[k] for k in counts) == (2, 2, 3, 1, 2)
    assert got["corrected"]["positives"] == 3  # the correction touched a partner only
    assert (a["epoch"], a["iteration"], a["step"]) == (1, 3, 3)
    assert set(got) == {"noisy", "corrected", "noisy_stitched", "corrected_stitched"}


def test_clean_labels_do_not_change_training(runs):
    (a, out_a), (b, out_b) = runs["clean"], runs["plain"]
    assert a.run_id == b.run_id
    pa, pb = np.load(out_a / "predictions.npz"), np.load(out_b / "predictions.npz")
    for head in ("ensemble", "random", "balanced"):
        np.testing.assert_array_equal(pa[f"scores_{head}"], pb[f"scores_{head}"])
    sa = torch.load(out_a / "checkpoint.pt", weights_only=True)["model"]
    sb = torch.load(out_b / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    losses = [[{k: v for k, v in r.items() if k != "seconds"} for r in read_log(out / "train_log.jsonl")]
              for out in (out_a, out_b)]
    assert losses[0] == losses[1]
    assert len(read_log(out_a / "noise_level.jsonl")) == EPOCHS * ITERS * 2 * 4  # iterations x branches x kinds
    assert not (out_b / "noise_level.jsonl").exists()
    manifest = json.loads((out_a / "manifest.json").read_text())
    assert "clean_labels" in manifest["inputs"]


def test_resumed_run_writes_the_uninterrupted_log(runs, tiny_toy, tmp_path, monkeypatch):
    reference = (runs["clean"][1] / "noise_level.jsonl").read_text()
    # 1) killed in the middle of epoch 2; the workflow deletes the log (a declared output) before the rerun
    broken = ours_trainer(tiny_toy, tmp_path / "a", clean_labels=tiny_toy["train"])
    interrupt_training(monkeypatch, broken, ITERS + 2)
    assert {r["epoch"] for r in read_log(tmp_path / "a" / "noise_level.jsonl")} == {1}
    (tmp_path / "a" / "noise_level.jsonl").unlink()
    ours_trainer(tiny_toy, tmp_path / "a", clean_labels=tiny_toy["train"]).run()
    assert (tmp_path / "a" / "noise_level.jsonl").read_text() == reference

    # 2) killed after epoch 2's records were appended but before its checkpoint: no duplicate epoch
    broken = ours_trainer(tiny_toy, tmp_path / "b", clean_labels=tiny_toy["train"])
    save = broken.save_checkpoint

    def dying_save(epoch, history):
        if epoch == 2:
            raise KeyboardInterrupt
        save(epoch, history)

    monkeypatch.setattr(broken, "save_checkpoint", dying_save)
    with pytest.raises(KeyboardInterrupt):
        broken.run()
    assert {r["epoch"] for r in read_log(tmp_path / "b" / "noise_level.jsonl")} == {1, 2}
    ours_trainer(tiny_toy, tmp_path / "b", clean_labels=tiny_toy["train"]).run()
    assert (tmp_path / "b" / "noise_level.jsonl").read_text() == reference


def test_clean_rows_align_by_image_id_and_mismatches_name_both_files(tiny_toy, tmp_path):
    noisy_table = read_labels(tiny_toy["noisy"])
    clean = read_labels(tiny_toy["train"])
    shuffled = clean.subset(np.random.default_rng(0).permutation(len(clean)))
    write_labels(shuffled, tmp_path / "shuffled.parquet")
    aligned = align_clean_labels(tmp_path / "shuffled.parquet", noisy_table, tiny_toy["noisy"])
    np.testing.assert_array_equal(aligned, noisy_table.clean)  # back in the noisy table's row order
    write_labels(clean.subset(np.arange(len(clean) - 1)), tmp_path / "short.parquet")
    with pytest.raises(NoisyMLTError, match=r"short\.parquet.*noisy\.parquet.*different images"):
        ours_trainer(tiny_toy, tmp_path / "run", clean_labels=tmp_path / "short.parquet")
    flipped = read_labels(tiny_toy["train"])
    flipped.labels[0] = 1 - flipped.labels[0]
    write_labels(flipped, tmp_path / "flipped.parquet")
    with pytest.raises(NoisyMLTError, match=r"flipped\.parquet.*disagree"):
        align_clean_labels(tmp_path / "flipped.parquet", noisy_table, tiny_toy["noisy"])


@pytest.mark.parametrize("method, kinds", [
    ("ours_no_stitchup", {"noisy", "corrected"}),
    ("ours_no_pseudo", {"noisy", "noisy_stitched"}),
    ("ours_single_balanced", {"noisy"}),
    ("ours_single_random_stitchup", {"noisy", "noisy_stitched"}),
    ("ours_mixup", {"noisy"}),
    ("erm", set()),
])
def test_every_variant_logs_what_applies(tiny_toy, tmp_path, method, kinds):
    trainer = ours_trainer(tiny_toy, tmp_path / "run", method=method, epochs=1, clean_labels=tiny_toy["train"])
    trainer.fit()
    log = read_log(tmp_path / "run" / "noise_level.jsonl")
    assert {r["targets"] for r in log} == kinds
    branches = getattr(trainer.method, "specs", {})
    assert {r["branch"] for r in log} == (set(branches) if kinds else set())


def synthetic_log(path, wrong: dict, positives: dict) -> None:
    """EPOCHS x ITERS iterations of constant counts per (branch, targets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for epoch in range(1, EPOCHS + 1):
        for it in range(ITERS):
            for (branch, kind), w in wrong.items():
                p = positives[branch, kind]
                lines.append({"epoch": epoch, "iteration": it, "step": (epoch - 1) * ITERS + it, "branch": branch,
                              "targets": kind, "rows": 8, "wrong_positives": w, "positives": p,
                              "missing_positives": 0, "clean_positives": p - w,
                              **{f"{s}_{g}": v for g in ("head", "medium", "tail") for s, v in
                                 (("wrong_positives", w), ("positives", p), ("missing_positives", 0),
                                  ("clean_positives", p - w))}})
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_noise_figure_from_synthetic_logs(tmp_path):
    wrong = {("random", "noisy"): 5, ("balanced", "noisy"): 10, ("random", "corrected_stitched"): 1,
             ("balanced", "corrected_stitched"): 2}
    positives = {("random", "noisy"): 10, ("balanced", "noisy"): 40, ("random", "corrected_stitched"): 10,
                 ("balanced", "corrected_stitched"): 20}
    logs = [tmp_path / "runs" / f"s{s}" / "ours" / "noise_level.jsonl" for s in (0, 1)]
    for log in logs:
        synthetic_log(log, wrong, positives)
    out = tmp_path / "reports" / "noise_level_toy.png"
    assert main(["noise-figure", "--logs", *map(str, logs), "--out", str(out), "--title", "toy"]) == 0
    for suffix in (".png", ".pdf"):
        assert out.with_suffix(suffix).stat().st_size > 5000
    table = pd.read_csv(out.with_suffix(".csv")).set_index(["panel", "targets"])
    # the overall panel pools the counts: (5 + 10) / (10 + 40), not the mean of 0.5 and 0.25
    assert table.loc[("overall", "noisy"), "start"] == pytest.approx(0.3)
    assert table.loc[("random", "noisy"), "end"] == pytest.approx(0.5)
    assert table.loc[("balanced", "corrected_stitched"), "end_tail"] == pytest.approx(0.1)
    assert table.loc[("overall", "noisy"), "seeds"] == 2
    assert ("overall", "corrected") not in table.index  # a kind the logs lack is no line
    assert table.loc[("overall", "noisy"), "missing_end"] == 0.0  # the synthetic targets miss nothing
    assert "| overall | noisy labels | 2 | 30.00 | 30.00 |" in out.with_suffix(".md").read_text()
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["noise-figure", "--logs", str(empty), "--out", str(tmp_path / "x.png")]) == 2


def test_noise_figure_content(tmp_path):
    """Panels titled with one word for each branch, the epoch on x (no unexplained lines), lines that
    coincide kept apart by width and by markers at their own places, and the layout checks of every figure."""
    from figure_checks import check_layout
    from noisymlt.report.noise_level import noise_level_figure, read_noise_logs

    kinds = ("noisy", "noisy_stitched", "corrected", "corrected_stitched")
    wrong = {(b, k): 4 for b in ("random", "balanced") for k in kinds}  # every line the same: all coincide
    wrong[("random", "noisy")] = 5
    positives = {key: 10 for key in wrong}
    positives[("balanced", "noisy")] = 40
    logs = [tmp_path / f"s{s}" / "noise_level.jsonl" for s in (0, 1)]
    for log in logs:
        synthetic_log(log, wrong, positives)
    fig = noise_level_figure(read_noise_logs(logs), "Toy-MLT-Noise: Ours, noise rate 0.5", smooth=2)
    check_layout(fig, internal_names=["ours", "toy", "balance", "corrected"])  # and no key with an underscore
    assert [ax.get_title() for ax in fig.axes] == ["both branches (R + B)", "random branch (R)", "balanced branch (B)"]
    names = ["noisy labels", "Stitch-Up", "Co-Learning", "Co-Learning + Stitch-Up"]
    for ax in fig.axes:
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == names  # nothing else drawn: no unlabelled vertical lines
        assert list(ax.get_xticks()) == list(range(EPOCHS + 1)) and ax.get_xlim() == (0, EPOCHS)
        widths = [line.get_linewidth() for line in lines]
        assert widths == sorted(widths, reverse=True) and len(set(widths)) == 4  # later lines nest inside
        assert len({line.get_marker() for line in lines}) == 4
        marked = [tuple(np.round(line.get_xdata()[line.get_markevery()], 3)) for line in lines]
        assert len(set(marked)) == 4 and all(len(m) == EPOCHS for m in marked)  # one marker an epoch, apart
    random, pooled = fig.axes[1].get_lines()[0], fig.axes[0].get_lines()[0]
    assert np.allclose(random.get_ydata(), 50.0) and np.allclose(pooled.get_ydata(), 100 * 9 / 50)
    assert np.allclose(random.get_xdata(), [i / ITERS for i in range(EPOCHS * ITERS)])  # iterations over epochs
    assert fig.axes[-1].get_xlabel() == "epoch"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == names
    assert fig.get_suptitle() == ("Toy-MLT-Noise: Ours, noise rate 0.5\n"
                                  "mean of 2 seeds ± 1 std, counts pooled over 2 iterations")


def test_pick_examples_prefers_corrections():
    from noisymlt.report.pseudo_labels import pick_examples

    noisy = np.array([[1, 0], [1, 1], [0, 1], [1, 0], [0, 1], [1, 1]])
    clean = np.array([[1, 1], [1, 0], [0, 1], [1, 1], [0, 1], [0, 1]])
    pseudo = {"random": np.array([[1, 1], [1, 0], [0, 1], [1, 0], [0, 1], [0, 1]])}
    picks = pick_examples(noisy, clean, pseudo, 3, seed=0)
    assert picks[:2] == [(0, "adds a missing label"), (1, "discards a wrong label")]
    assert picks[2][1] == "drawn at random" and picks[2][0] not in (0, 1)
    assert pick_examples(noisy, clean, pseudo, 3, seed=0) == picks  # deterministic


def check_pseudo_label_figure(scored: dict, clean: np.ndarray, root) -> None:
    """Corrections drawn in the paper's style (mathtext underline / bold) and named by a caption that
    describes only the marks that appear; every row named by its first word, colours safe for colour-blind
    readers (never the paper's red against green); sharp thumbnails; the layout checks of every figure."""
    from matplotlib.colors import to_hex

    from figure_checks import check_layout, strings
    from noisymlt.report.pseudo_labels import pick_examples, pseudo_label_figure
    from noisymlt.report.style import BLUE, VERMILLION
    from noisymlt.data.images import load_image

    plain = [r for r in range(len(clean)) if all((p[r] == scored["noisy"][r]).all() for p in scored["pseudo"].values())]
    assert plain, "the short run should leave some images uncorrected"
    fig = pseudo_label_figure(scored, clean, [(plain[0], "drawn at random")], root)
    check_layout(fig)
    text = " ".join(strings(fig))
    assert "pseudo R (from B):" in text and "pseudo B (from R):" in text and "prediction:" in text
    assert "Underlined" not in text and "Bold" not in text and "\\underline" not in text and "\\mathbf" not in text

    row = scored["pseudo"]["random"][0]  # force one added and one discarded label on image 0
    row[:] = scored["noisy"][0]
    row[np.flatnonzero(scored["noisy"][0] == 0)[0]] = 1
    row[np.flatnonzero(scored["noisy"][0] == 1)[0]] = 0
    picks = [(0, "forced"), *pick_examples(scored["noisy"], clean, scored["pseudo"], 2)]
    fig = pseudo_label_figure(scored, clean, picks, root)
    check_layout(fig)
    text = " ".join(strings(fig))
    assert "\\underline" in text and "\\mathbf" in text
    assert "Underlined: a missing label the model added." in text
    assert "Bold: a wrong noisy label the model discarded." in text
    kinds = {"#000000": ("noisy:", "prediction:", "    "), to_hex(BLUE): ("clean:", "    "),
             to_hex(VERMILLION): ("pseudo R (from B):", "pseudo B (from R):", "    ")}
    rows = [t for t in fig.texts if t.get_text().strip() and to_hex(t.get_color()) in kinds]
    assert len(rows) >= 5 * len(picks)
    for t in rows:  # the colour only repeats what the row's first word says
        assert t.get_text().startswith(kinds[to_hex(t.get_color())]), (t.get_text(), t.get_color())
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len(images) == len(picks)
    for im, (r, _) in zip(images, picks):
        pixels, shown = np.asarray(load_image(root / scored["paths"][r])), np.asarray(im.get_array())
        factor = shown.shape[0] // pixels.shape[0]
        assert im.get_interpolation() == "nearest" and shown.shape[0] >= 256 == 8 * pixels.shape[0]
        assert np.array_equal(shown, pixels.repeat(factor, 0).repeat(factor, 1))  # whole pixels, no blur


def test_pseudo_label_figure_of_a_short_run(runs, tiny_toy, tmp_path):
    _, out = runs["clean"]
    png = tmp_path / "pseudo_labels_toy.png"
    args = ["pseudo-label-figure", "--run", str(out), "--train-labels", str(tiny_toy["noisy"]), "--clean-labels",
            str(tiny_toy["train"]), "--split", str(tiny_toy["split"]), "--train-images", str(tiny_toy["root"]),
            "--out", str(png), "--count", "4"]
    assert main(args) == 0
    assert png.stat().st_size > 5000 and png.with_suffix(".pdf").stat().st_size > 5000

    from noisymlt.report.pseudo_labels import score_train_set

    scored = score_train_set(out, tiny_toy["noisy"], tiny_toy["split"], tiny_toy["root"])
    n = len(read_labels(tiny_toy["noisy"]))
    assert set(scored["pseudo"]) == {"random", "balanced"} and scored["sources"] == {"random": "balanced",
                                                                                      "balanced": "random"}
    assert scored["scores"].shape == (n, 20) and scored["probs"]["random"].shape == (n, 20)
    # Eq. 3 with the method's thresholds on the source's outputs
    from noisymlt.methods.pseudo_labels import pseudo_labels

    alpha, beta = scored["trainer"].method.thresholds["balanced"]
    expected = pseudo_labels(scored["noisy"].astype(np.float32), scored["probs"]["balanced"], alpha, beta)
    np.testing.assert_array_equal(scored["pseudo"]["random"], expected)
    # the figure, as a reader sees it (see test_pseudo_label_figure_content)
    check_pseudo_label_figure(scored, read_labels(tiny_toy["noisy"]).clean, tiny_toy["root"])
    # a run of another family has no pseudo labels to show
    erm = runs["clean"][1].parent / "erm"
    erm.mkdir()
    (erm / "run_config.json").write_text(json.dumps(resolve_run(tiny_params("erm"), "toy", "erm", 0.5, 0)))
    (erm / "checkpoint.pt").write_bytes(b"")
    with pytest.raises(NoisyMLTError, match="not of the co-learning family"):
        score_train_set(erm, tiny_toy["noisy"], tiny_toy["split"], tiny_toy["root"])
