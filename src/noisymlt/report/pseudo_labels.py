"""The paper's pseudo-label figure (Fig. vis_pl): training images with their noisy, clean and pseudo labels.

For a finished run of the co-learning family (Ours), the model is rebuilt and its final checkpoint loaded
through the trainer itself (``Trainer`` + ``load_checkpoint``: same config, same inputs check), then every
training image is scored with the test transform and the final weights. Each branch's pseudo labels come
from its source branch (the peer for ``cross``, itself for ``self``) exactly as in training: the source's
sigmoid outputs with its neck and head in eval mode (``CoLearning._probs``), the method's per-class
thresholds and ``noisymlt.methods.pseudo_labels.pseudo_labels`` (Eq. 3). What differs from a training step is only the view
(no augmentation) and the weights (the final ones instead of those of that step).

Images are picked deterministically: those where co-learning adds the most missing labels that are
really present, those where it discards the most wrong labels, then a few others drawn with a fixed
seed. Paper convention: in the pseudo labels an underlined label is a missing label the model added,
and in the noisy labels a bold label is a wrong label it discarded (its prediction fell below beta).
Unlike the paper's green and red, no meaning rests on colour alone: every row starts with the word for
what it lists (noisy, clean, pseudo), and the colours (clean blue, pseudo vermillion) are Okabe & Ito's,
safe for colour-blind readers. The caption names only the cases the figure shows. Small images are
enlarged by whole-pixel repetition, so the thumbnails stay sharp. The clean labels are read only for
drawing and choosing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from noisymlt.core.files import read_json
from noisymlt.errors import NoisyMLTError
from noisymlt.report.style import BLUE, COLUMN_WIDTH, FONT_PT, VERMILLION, paper_style, save_figure

SHORT = {"random": "R", "balanced": "B"}
THUMB_IN = 0.8  # thumbnail side (inches); text fills the rest of the column
THUMB_PX = 256  # smaller images are enlarged to at least this by whole-pixel repetition


def score_train_set(run: Path, train_labels: Path, split: Path, train_images: Path, device: str = "cpu") -> dict:
    """Branch probabilities, pseudo labels per trained branch and ensemble scores of every training image.

    Returns {"noisy": (N, C), "probs": {branch: (N, C)}, "pseudo": {branch: (N, C)} (the labels that
    branch trains on), "sources": {branch: source branch}, "scores": (N, C) of the method's first head,
    "classes", "image_ids", "paths", "trainer"}.
    """
    import torch

    # the family module, imported by name so that this command's code digest covers it
    from noisymlt.methods.colearning import CoLearning
    from noisymlt.methods.pseudo_labels import pseudo_labels
    from noisymlt.training.trainer import Trainer

    config = Path(run) / "run_config.json"
    if not config.is_file():
        raise NoisyMLTError(f"{config}: missing; {run} is not a finished training run")
    resolved = read_json(config, "a run's configuration", require_object=True)
    if resolved["method_cfg"]["family"] != "colearning":
        raise NoisyMLTError(f"{config}: method {resolved['method']!r} is not of the co-learning family; "
                            "it has no pseudo labels to show")
    # The trainer needs a test table only to check classes: the train table stands in (nothing is predicted).
    trainer = Trainer.from_run_dir(Path(run), test_labels=train_labels, train_images=train_images,
                                   test_images=train_images, device=device, train_labels=train_labels, split=split,
                                   resolved=resolved)
    method = trainer.method
    if not isinstance(method, CoLearning):  # the family check above, as the trainer built it
        raise NoisyMLTError(f"{config}: the trainer built a {type(method).__name__}, not a co-learning method")
    names = list(method.specs)
    outputs = trainer.predict(part="train", forward=method.predict_for_scoring)  # one pass: heads and branches
    probs = {n: torch.as_tensor(outputs[f"branch:{n}"]) for n in names}
    noisy = torch.as_tensor(trainer.train_table.labels, dtype=torch.float32)
    sources = {}
    pseudo = {}
    if method.source != "none":
        for n in names:
            sources[n] = method.source_of(n)
            alpha, beta = method.thresholds[sources[n]]
            pseudo[n] = pseudo_labels(noisy, probs[sources[n]], alpha, beta).numpy().astype(np.uint8)
    return {"noisy": trainer.train_table.labels, "probs": {n: p.numpy() for n, p in probs.items()},
            "pseudo": pseudo, "sources": sources, "scores": outputs[method.heads[0]],
            "classes": list(trainer.train_table.classes), "image_ids": list(trainer.train_table.image_ids),
            "paths": list(trainer.train_table.paths), "trainer": trainer}


def pick_examples(noisy: np.ndarray, clean: np.ndarray, pseudo: dict[str, np.ndarray], count: int,
                  seed: int = 0) -> list[tuple[int, str]]:
    """(row, why) of ``count`` images: about a third where co-learning adds correct missing labels (most
    first), a third where it discards wrong ones, the rest drawn with ``seed``; ties by row order."""
    noisy, clean = noisy.astype(bool), clean.astype(bool)
    added, removed = np.zeros(len(noisy), dtype=np.int64), np.zeros(len(noisy), dtype=np.int64)
    for labels in pseudo.values():
        labels = labels.astype(bool)
        added += (labels & ~noisy & clean).sum(1)
        removed += (~labels & noisy & ~clean).sum(1)
    chosen: list[tuple[int, str]] = []
    n_each = max(1, count // 3)
    for score, why in ((added, "adds a missing label"), (removed, "discards a wrong label")):
        order = np.argsort(-score, kind="stable")
        for row in order[score[order] > 0]:
            if len([c for c in chosen if c[1] == why]) == n_each or len(chosen) == count:
                break
            if int(row) not in {r for r, _ in chosen}:
                chosen.append((int(row), why))
    rest = np.random.default_rng(seed).permutation(len(noisy))
    for row in rest:
        if len(chosen) >= count:
            break
        if int(row) not in {r for r, _ in chosen}:
            chosen.append((int(row), "drawn at random"))
    return chosen


def _shown(name: str) -> str:
    """A class name as a reader sees it: toy classes are written like ``red_disc``."""
    return name.replace("_", " ")


def _tex(name: str) -> str:
    return _shown(name).replace("\\", "").replace(" ", r"\ ").replace("$", "")


def _label(name: str, bold: bool = False, underline: bool = False) -> str:
    """One label; bold / underlined ones in mathtext (the paper's convention)."""
    if underline:
        return rf"$\underline{{\mathrm{{{_tex(name)}}}}}$"
    if bold:
        return rf"$\mathbf{{{_tex(name)}}}$"
    return _shown(name).replace("$", "")


def thumbnail(image) -> tuple[np.ndarray, str]:
    """(pixels, interpolation): an image smaller than THUMB_PX enlarged by an integer factor, each pixel
    repeated (nearest neighbour), so that neither matplotlib nor a PDF viewer blurs it."""
    pixels = np.asarray(image)
    factor = -(-THUMB_PX // min(pixels.shape[:2]))
    if factor <= 1:
        return pixels, "antialiased"
    return pixels.repeat(factor, axis=0).repeat(factor, axis=1), "nearest"


class _Writer:
    """Wraps a row of items (comma-separated labels, or the caption's words) at the measured width of what
    is drawn, mathtext included."""

    def __init__(self, fig):
        self.fig, self.renderer = fig, fig.canvas.get_renderer()

    def measure(self, text: str) -> float:
        probe = self.fig.text(0, 0, text, fontsize=FONT_PT)
        width = probe.get_window_extent(self.renderer).width
        probe.remove()
        return width

    def wrap(self, prefix: str, items: list[str], width_in: float, sep: str = ",") -> list[str]:
        """Lines of at most ``width_in``: ``prefix`` then the items, continuation lines indented."""
        lines, line = [], prefix
        for k, item in enumerate(items):
            piece = item + (sep if k < len(items) - 1 else "")
            trial = f"{line} {piece}" if line.strip() else f"{line}{piece}"
            if line.strip() and self.measure(trial) > width_in * self.fig.dpi:
                lines.append(line)
                trial = ("    " if prefix else "") + piece
            line = trial
        return [*lines, line]


def pseudo_label_figure(scored: dict, clean: np.ndarray, picks: list[tuple[int, str]], image_root: Path,
                        top: int = 4):
    """The Figure, one column wide: per picked image a thumbnail, then its noisy, clean and pseudo labels
    (per branch) and the model's top predictions, each row named by its first word; a caption below that
    explains the marks that appear."""
    import matplotlib.pyplot as plt

    from noisymlt.data.images import load_image

    classes = scored["classes"]
    names = lambda row: [classes[j] for j in np.flatnonzero(row)]  # noqa: E731
    line_in = 1.35 * FONT_PT / 72
    text_x = 0.04 + THUMB_IN + 0.1
    with paper_style():
        fig = plt.figure(figsize=(COLUMN_WIDTH, 1.0))
        writer = _Writer(fig)

        def wrap(prefix: str, items: list[str]) -> list[str]:  # a row of the text column; "-" for no label
            return writer.wrap(prefix, items or ["-"], COLUMN_WIDTH - text_x - 0.04)

        blocks, marks = [], {"added": False, "discarded": False}
        for row, why in picks:
            noisy, truth = scored["noisy"][row].astype(bool), clean[row].astype(bool)
            discarded = {classes[j] for p in scored["pseudo"].values()
                         for j in np.flatnonzero(noisy & ~p[row].astype(bool))}
            marks["discarded"] |= bool(discarded)
            lines = [(f"{scored['image_ids'][row]} ({why})", "0.35")]
            lines += [(t, "black") for t in wrap("noisy:", [_label(n, bold=n in discarded) for n in names(noisy)])]
            lines += [(t, BLUE) for t in wrap("clean:", [_label(n) for n in names(truth)])]
            for branch, labels in scored["pseudo"].items():
                added = {classes[j] for j in np.flatnonzero(labels[row].astype(bool) & ~noisy)}
                marks["added"] |= bool(added)
                tag = f"pseudo {SHORT.get(branch, branch)} (from {SHORT.get(scored['sources'][branch], '?')}):"
                lines += [(t, VERMILLION) for t in wrap(tag, [_label(n, underline=n in added)
                                                              for n in names(labels[row])])]
            best = np.argsort(-scored["scores"][row], kind="stable")[:top]
            lines += [(t, "black") for t in wrap("prediction:", [f"{_shown(classes[j])} {scored['scores'][row][j]:.2f}"
                                                                 for j in best])]
            blocks.append((row, lines))
        caption = _caption(scored, marks, top)
        caption_lines = writer.wrap("", caption.split(" "), COLUMN_WIDTH - 0.08, sep="")
        heights = [max(THUMB_IN, len(lines) * line_in) + 0.12 for _, lines in blocks]
        total = 0.06 + sum(heights) + len(caption_lines) * line_in + 0.08
        fig.set_size_inches(COLUMN_WIDTH, total)
        top_in = total - 0.06
        for (row, lines), height in zip(blocks, heights):
            pixels, interpolation = thumbnail(load_image(Path(image_root) / scored["paths"][row]))
            ax = fig.add_axes((0.04 / COLUMN_WIDTH, (top_in - THUMB_IN) / total, THUMB_IN / COLUMN_WIDTH,
                               THUMB_IN / total))
            ax.imshow(pixels, interpolation=interpolation)
            ax.set_axis_off()
            for k, (text, color) in enumerate(lines):
                fig.text(text_x / COLUMN_WIDTH, (top_in - (k + 0.5) * line_in) / total, text, color=color,
                         va="center", fontsize=FONT_PT)
            top_in -= height
        for k, text in enumerate(caption_lines):
            fig.text(0.04 / COLUMN_WIDTH, (top_in - (k + 0.5) * line_in) / total, text, va="center",
                     fontsize=FONT_PT, color="0.2")
    return fig


def _caption(scored: dict, marks: dict, top: int) -> str:
    """What the rows mean, and only the marks that appear."""
    parts = ["noisy: the training labels; clean: the true labels (for reference; training never reads them)"]
    if scored["pseudo"]:
        branches = ", ".join(f"{SHORT.get(b, b)}: {b} branch" for b in scored["pseudo"])
        parts.append(f"pseudo: the labels a branch trains on, from the named branch's predictions ({branches})")
    parts.append(f"prediction: the final model's top {top} scores")
    text = "; ".join(parts) + "."
    if marks["added"]:
        text += " Underlined: a missing label the model added."
    if marks["discarded"]:
        text += " Bold: a wrong noisy label the model discarded."
    return text[0].upper() + text[1:]


def _cmd(args: argparse.Namespace) -> int:
    from noisymlt.training.noise_monitor import align_clean_labels

    scored = score_train_set(Path(args.run), Path(args.train_labels), Path(args.split), Path(args.train_images),
                             args.device)
    clean = align_clean_labels(Path(args.clean_labels), scored["trainer"].train_table, Path(args.train_labels))
    picks = pick_examples(scored["noisy"], clean, scored["pseudo"], args.count, args.seed)
    save_figure(pseudo_label_figure(scored, clean, picks, Path(args.train_images), args.top), Path(args.out))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "pseudo-label-figure", help="training images with noisy, clean and pseudo labels of a finished Ours run "
                                    "(paper Fig. vis_pl)",
        description="Rebuild a finished co-learning run from its folder (run_config.json, checkpoint.pt), score "
                    "every training image, compute each branch's pseudo labels as training does (Eq. 3, the "
                    "method's thresholds) and draw a grid of a few deterministically chosen images. Writes OUT "
                    "(PNG) and OUT with suffix .pdf.",
    )
    p.add_argument("--run", required=True, help="run folder of a finished Ours (co-learning family) run")
    p.add_argument("--train-labels", required=True, help="the noisy train labels the run trained on")
    p.add_argument("--clean-labels", required=True, help="the clean long-tail subset (drawing and choosing only)")
    p.add_argument("--split", required=True, help="head/medium/tail class split JSON of the run")
    p.add_argument("--train-images", required=True, help="folder the train label paths are relative to")
    p.add_argument("--out", required=True, help="PNG to write (.pdf beside it)")
    p.add_argument("--count", type=int, default=6, help="images to show (default 6)")
    p.add_argument("--top", type=int, default=4, help="top-scoring classes listed as the prediction (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the images drawn at random (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), auto or cuda:N")
    p.set_defaults(func=_cmd)
