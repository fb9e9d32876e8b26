"""The paper's pseudo-label figure (Fig. vis_pl): training images with their noisy, clean and pseudo labels.

For a finished run of the co-learning family (Ours), the model is rebuilt and its final checkpoint loaded
through the trainer itself (``Trainer`` + ``load_checkpoint``: same config, same inputs check), then every
training image is scored with the test transform and the final weights. Each branch's pseudo labels come
from its source branch (the peer for ``cross``, itself for ``self``) exactly as in training: the source's
sigmoid outputs with its neck and head in eval mode (``CoLearning._probs``), the method's per-class
thresholds and ``colearning.pseudo_labels`` (Eq. 3). What differs from a training step is only the view
(no augmentation) and the weights (the final ones instead of those of that step).

Images are picked deterministically: those where co-learning adds the most missing labels that are
really present, those where it discards the most wrong labels, then a few others drawn with a fixed
seed. Paper convention: in the pseudo labels an underlined label is a missing label the model added,
and in the noisy labels a bold label is a wrong label it discarded (its prediction fell below beta).
Clean labels are green, pseudo labels red. The clean labels are read only for drawing and choosing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError

GREEN = (0 / 255, 176 / 255, 80 / 255)  # the paper's clean-label colour
RED = (192 / 255, 0 / 255, 0 / 255)  # and its pseudo-label colour
SHORT = {"random": "R", "balanced": "B"}


def score_train_set(run: Path, train_labels: Path, split: Path, train_images: Path, device: str = "cpu") -> dict:
    """Branch probabilities, pseudo labels per trained branch and ensemble scores of every training image.

    Returns {"noisy": (N, C), "probs": {branch: (N, C)}, "pseudo": {branch: (N, C)} (the labels that
    branch trains on), "sources": {branch: source branch}, "scores": (N, C) of the method's first head,
    "classes", "image_ids", "paths", "trainer"}.
    """
    import torch

    # the family module, imported by name so that this command's code digest covers it
    from noisymlt.colearning import pseudo_labels
    from noisymlt.methods.colearning_family import CoLearning
    from noisymlt.train import Trainer

    config = Path(run) / "run_config.json"
    if not config.is_file():
        raise NoisyMLTError(f"{config}: missing; {run} is not a finished training run")
    resolved = json.loads(config.read_text())
    if resolved["method_cfg"]["family"] != "colearning":
        raise NoisyMLTError(f"{config}: method {resolved['method']!r} is not of the co-learning family; "
                            "it has no pseudo labels to show")
    # The trainer needs a test table only to check classes: the train table stands in (nothing is predicted).
    trainer = Trainer.from_run_dir(Path(run), test_labels=train_labels, train_images=train_images,
                                   test_images=train_images, device=device, train_labels=train_labels, split=split,
                                   resolved=resolved)
    method, model = trainer.method, trainer.model
    if not isinstance(method, CoLearning):  # the family check above, as the trainer built it
        raise NoisyMLTError(f"{config}: the trainer built a {type(method).__name__}, not a co-learning method")
    model.eval()
    names = list(method.specs)
    probs = {n: [] for n in names}
    scores = []
    with torch.no_grad():
        for _, images in trainer.iterate_train_eval():
            for n in names:
                probs[n].append(method._probs(model, n, images, None).cpu())
            scores.append(torch.sigmoid(next(iter(method.predict(model, images).values())).float()).cpu())
    probs = {n: torch.cat(p) for n, p in probs.items()}
    noisy = torch.as_tensor(trainer.train_table.labels, dtype=torch.float32)
    sources = {}
    pseudo = {}
    if method.source != "none":
        for n in names:
            sources[n] = n if method.source == "self" else next(m for m in names if m != n)
            alpha, beta = method.thresholds[sources[n]]
            pseudo[n] = pseudo_labels(noisy, probs[sources[n]], alpha, beta).numpy().astype(np.uint8)
    return {"noisy": trainer.train_table.labels, "probs": {n: p.numpy() for n, p in probs.items()},
            "pseudo": pseudo, "sources": sources, "scores": torch.cat(scores).numpy(),
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


def _tex(name: str) -> str:
    return name.replace("\\", "").replace("_", r"\_").replace(" ", r"\ ").replace("$", "")


def _fmt(names: list[str], bold: set[str] = frozenset(), underline: set[str] = frozenset()) -> str:
    """Comma-separated labels; bold / underlined ones in mathtext (the paper's convention)."""
    out = []
    for n in names:
        if n in underline:
            out.append(rf"$\underline{{\mathrm{{{_tex(n)}}}}}$")
        elif n in bold:
            out.append(rf"$\mathbf{{{_tex(n)}}}$")
        else:
            out.append(n.replace("$", ""))
    return ", ".join(out) if out else "-"


def plot_pseudo_labels(scored: dict, clean: np.ndarray, picks: list[tuple[int, str]], image_root: Path,
                       out: Path, top: int = 4) -> list[Path]:
    """One row per picked image: the image, then noisy / clean / pseudo labels per branch / predictions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from noisymlt.dataset import load_image

    classes = scored["classes"]
    names = lambda row: [classes[j] for j in np.flatnonzero(row)]  # noqa: E731
    n = len(picks)
    fig, axes = plt.subplots(n, 2, figsize=(9.5, 1.55 * n + 0.9), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 4.6]})
    for (row, why), (ax_img, ax_txt) in zip(picks, axes):
        ax_img.imshow(load_image(Path(image_root) / scored["paths"][row]))
        ax_img.set_axis_off()
        noisy, truth = scored["noisy"][row].astype(bool), clean[row].astype(bool)
        discarded = {classes[j] for p in scored["pseudo"].values()
                     for j in np.flatnonzero(noisy & ~p[row].astype(bool))}
        lines = [(f"{scored['image_ids'][row]} ({why})", "0.35"),
                 ("noisy: " + _fmt(names(noisy), bold=discarded), "black"),
                 ("clean: " + _fmt(names(truth)), GREEN)]
        for branch, labels in scored["pseudo"].items():
            added = {classes[j] for j in np.flatnonzero(labels[row].astype(bool) & ~noisy)}
            tag = f"pseudo ({SHORT.get(branch, branch)} from {SHORT.get(scored['sources'][branch], '?')})"
            lines.append((f"{tag}: " + _fmt(names(labels[row]), underline=added), RED))
        best = np.argsort(-scored["scores"][row], kind="stable")[:top]
        top_scores = ", ".join(f"{classes[j]} {scored['scores'][row][j]:.2f}" for j in best)
        lines.append(("prediction: " + top_scores, "black"))
        for i, (text, color) in enumerate(lines):
            ax_txt.text(0.0, 1 - (i + 0.5) / len(lines), text, color=color, fontsize=8, va="center",
                        transform=ax_txt.transAxes)
        ax_txt.set_axis_off()
    fig.text(0.01, 0.005, "Clean labels green, pseudo labels red (R: random branch, B: balanced branch). "
             "Underlined: a missing label the model added; bold: a wrong noisy label it discarded. "
             "Prediction: the top scores of the final model.", fontsize=7, va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.5 / (1.55 * n + 0.9), 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pdf = out.with_suffix(".pdf")
    fig.savefig(out, dpi=130)
    fig.savefig(pdf, metadata={"CreationDate": None})
    plt.close(fig)
    return [out, pdf]


def _cmd(args: argparse.Namespace) -> int:
    from noisymlt.noise_monitor import align_clean_labels

    scored = score_train_set(Path(args.run), Path(args.train_labels), Path(args.split), Path(args.train_images),
                             args.device)
    clean = align_clean_labels(Path(args.clean_labels), scored["trainer"].train_table, Path(args.train_labels))
    picks = pick_examples(scored["noisy"], clean, scored["pseudo"], args.count, args.seed)
    plot_pseudo_labels(scored, clean, picks, Path(args.train_images), Path(args.out), args.top)
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
