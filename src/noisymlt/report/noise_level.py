"""The paper's "change of the noise level during training" figure (Figs. voc_stitchup / coco_stitchup).

Reads the ``noise_level.jsonl`` logs of one method's runs (one per seed; Ours at gamma 0.5 in the
paper) and draws three panels stacked in one column, the two branches pooled, the random branch, the
balanced branch: the noise level (wrong positives / positives of the training targets, see
noisymlt.training.noise_monitor) of every iteration, placed on an epoch axis, one line per kind of target: the
noisy labels as given, after Stitch-Up (union over the stitched images), after Co-Learning (pseudo
labels), and both. Each line is the mean over
seeds with a band of +- one standard deviation (from two seeds on). Rates are pooled counts (sums of
wrong positives over sums of positives), so a smoothing window or a pooled panel weighs every label
equally. Besides the PNG and PDF, a CSV and a Markdown table give each line's start (first epoch) and
end (last epoch) noise level, the end also per class group, and the missing rate at start and end.
No torch import: this only reads logs.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from noisymlt.data.labels import GROUPS
from noisymlt.errors import NoisyMLTError
from noisymlt.report.style import BLACK, BLUE, COLUMN_WIDTH, ORANGE, paper_style, save_figure

LINES = {"noisy": "noisy labels", "noisy_stitched": "Stitch-Up", "corrected": "Co-Learning",
         "corrected_stitched": "Co-Learning + Stitch-Up"}
PANELS = {"overall": ("random", "balanced"), "random": ("random",), "balanced": ("balanced",)}
TITLES = {"overall": "both branches (R + B)", "random": "random branch (R)", "balanced": "balanced branch (B)"}
# Lines that measure the same targets draw on top of each other (Co-Learning before any pseudo label fires
# equals the noisy labels; with Stitch-Up, Stitch-Up alone). Each line is therefore narrower than the one
# drawn before it, so that coinciding lines nest, and carries its own marker once per epoch at its own
# offset within the epoch. Colours from Okabe & Ito's colour-blind-safe palette.
STYLES = {"noisy": {"color": "0.6", "lw": 3.0, "marker": "o", "offset": 0.125, "mfc": "0.3"},
          "noisy_stitched": {"color": ORANGE, "lw": 2.0, "marker": "s", "offset": 0.375},
          "corrected": {"color": BLUE, "lw": 1.2, "marker": "^", "offset": 0.625},
          "corrected_stitched": {"color": BLACK, "lw": 0.7, "marker": "D", "offset": 0.875}}


def read_noise_logs(paths: list[Path]) -> pd.DataFrame:
    """All records of the given logs, with a ``seed`` column: the ``s<seed>`` folder of each run path
    when the paths name distinct seeds, else the log's position in the list."""
    frames, seeds = [], []
    for path in map(Path, paths):
        try:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, json.JSONDecodeError) as exc:
            raise NoisyMLTError(f"{path}: cannot read the noise log ({exc})") from exc
        if not rows:
            raise NoisyMLTError(f"{path}: empty noise log (a method that publishes no targets, or a run "
                                "trained without --clean-labels)")
        frames.append(pd.DataFrame(rows))
        match = re.search(r"(?:^|/)s(\d+)/", path.as_posix())
        seeds.append(int(match.group(1)) if match else None)
    if None in seeds or len(set(seeds)) != len(seeds):
        seeds = list(range(len(frames)))
    return pd.concat([f.assign(seed=s) for f, s in zip(frames, seeds)], ignore_index=True)


def _pooled(frame: pd.DataFrame, branches: tuple[str, ...], kind: str, by: str, scope: str = "total",
            stats: tuple[str, str] = ("wrong_positives", "positives")) -> pd.DataFrame:
    """Columns ``wrong`` and ``positives``: the two ``stats`` (numerator, denominator; default the noise
    level's) summed over ``branches`` per (seed, ``by``) for one target kind."""
    suffix = "" if scope == "total" else f"_{scope}"
    part = frame[(frame["targets"] == kind) & frame["branch"].isin(branches)]
    return part.groupby(["seed", by])[[f"{stat}{suffix}" for stat in stats]].sum().set_axis(
        ["wrong", "positives"], axis=1)


def curves(frame: pd.DataFrame, branches: tuple[str, ...], kind: str, smooth: int = 1) -> pd.DataFrame:
    """Noise level per step (rows) and seed (columns), pooled over ``branches`` and a trailing window
    of ``smooth`` iterations."""
    counts = _pooled(frame, branches, kind, "step")
    if counts.empty:
        return pd.DataFrame()
    wrong = counts["wrong"].unstack("seed").sort_index()
    pos = counts["positives"].unstack("seed").sort_index()
    if smooth > 1:
        wrong, pos = (x.rolling(smooth, min_periods=1).sum() for x in (wrong, pos))
    return wrong / pos.where(pos > 0)


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per panel and line: seeds, mean noise level over the first and the last epoch (pooled counts per
    seed, then the mean over seeds), the last epoch's per class group, and the missing rate (missing
    positives / clean positives) of the first and last epoch."""
    first, last = frame["epoch"].min(), frame["epoch"].max()
    noise, missing = ("wrong_positives", "positives"), ("missing_positives", "clean_positives")
    rows = []
    for panel, branches in PANELS.items():
        for kind, label in LINES.items():
            row = {"panel": panel, "line": label, "targets": kind}
            for name, epoch, scope, stats in [("start", first, "total", noise), ("end", last, "total", noise),
                                              *((f"end_{g}", last, g, noise) for g in GROUPS),
                                              ("missing_start", first, "total", missing),
                                              ("missing_end", last, "total", missing)]:
                counts = _pooled(frame[frame["epoch"] == epoch], branches, kind, "epoch", scope, stats)
                rates = counts["wrong"] / counts["positives"].where(counts["positives"] > 0)
                row[name] = float(rates.mean()) if rates.notna().any() else float("nan")
                row["seeds"] = int(counts.index.get_level_values("seed").nunique())
            if row["seeds"]:
                rows.append(row)
    return pd.DataFrame(rows, columns=["panel", "line", "targets", "seeds", "start", "end",
                                       *(f"end_{g}" for g in GROUPS), "missing_start", "missing_end"])


def epoch_positions(frame: pd.DataFrame) -> pd.Series:
    """Each logged step's place on an epoch axis: epoch e's iterations spread evenly over [e - 1, e)."""
    steps = frame.groupby("epoch")["step"].agg(["min", "max"]).sort_index()
    pos = {}
    for k, (epoch, (lo, hi)) in enumerate(steps.iterrows()):
        for step in range(int(lo), int(hi) + 1):
            pos[step] = k + (step - lo) / (hi - lo + 1)
    return pd.Series(pos)


def noise_level_figure(frame: pd.DataFrame, title: str = "", smooth: int = 1):
    """The Figure: one panel per branch set (both, random, balanced) stacked in one column, the noise level
    (%) of each kind of target against the epoch, mean over seeds with a +- 1 std band from two seeds on."""
    import matplotlib.pyplot as plt

    panels = [p for p, branches in PANELS.items() if frame["branch"].isin(branches).any()
              and (len(branches) == 1 or frame["branch"].nunique() > 1)]
    at = epoch_positions(frame)
    epochs = frame["epoch"].nunique()
    with paper_style():
        fig, axes = plt.subplots(len(panels), 1, figsize=(COLUMN_WIDTH, 1.0 + 1.3 * len(panels)), squeeze=False,
                                 sharex=True, sharey=True, layout="constrained")
        for ax, panel in zip(axes[:, 0], panels):
            for kind, label in LINES.items():
                rates = curves(frame, PANELS[panel], kind, smooth)
                if rates.empty:
                    continue
                style = STYLES[kind]
                x = at.reindex(rates.index).to_numpy()
                mean = 100 * rates.mean(axis=1)
                marks = [int(np.argmin(np.abs(x - (e + style["offset"])))) for e in range(epochs)]
                ax.plot(x, mean, color=style["color"], lw=style["lw"], marker=style["marker"], markevery=marks,
                        ms=3.5, mfc=style.get("mfc", style["color"]), mec="white", mew=0.4, label=label)
                if rates.shape[1] >= 2:
                    std = 100 * rates.std(axis=1)
                    ax.fill_between(x, mean - std, mean + std, color=style["color"], alpha=0.12, lw=0)
            ax.set_title(TITLES[panel])
            ax.set_xticks(range(0, epochs + 1, -(-epochs // 12)))  # at most 13 ticks: readable in one column
            ax.set_xlim(0, epochs)
            ax.grid(True)
        axes[-1, 0].set_xlabel("epoch")
        fig.supylabel("noise level (% wrong positives)", fontsize=plt.rcParams["axes.labelsize"])
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False)
        seeds = frame["seed"].nunique()
        band = " ± 1 std" if seeds > 1 else ""
        window = f", counts pooled over {smooth} iterations" if smooth > 1 else ""
        fig.suptitle(f"{title}\nmean of {seeds} seed{'s' if seeds != 1 else ''}{band}{window}".strip())
    return fig


def write_summary(table: pd.DataFrame, csv: Path, md: Path) -> None:
    table.to_csv(csv, index=False, float_format="%.4f")
    cols = ["panel", "line", "seeds", "start", "end", *(f"end_{g}" for g in GROUPS), "missing_start", "missing_end"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in table.iterrows():
        cells = [str(row[c]) if c in ("panel", "line", "seeds") else
                 ("-" if pd.isna(row[c]) else f"{100 * row[c]:.2f}") for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    md.write_text("Noise level (% of positive targets that are wrong), mean over seeds; start = first epoch, "
                  "end = last epoch; missing = % of clean positives the targets lack.\n\n" + "\n".join(lines) + "\n")


def _cmd(args: argparse.Namespace) -> int:
    frame = read_noise_logs([Path(p) for p in args.logs])
    if args.smooth < 1:
        raise NoisyMLTError(f"--smooth: a window of at least 1 iteration, got {args.smooth}")
    out = Path(args.out)
    save_figure(noise_level_figure(frame, args.title, args.smooth), out)
    write_summary(summary(frame), out.with_suffix(".csv"), out.with_suffix(".md"))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "noise-figure", help="plot the label noise of the training targets against the iteration (paper Fig. 5/6)",
        description="Three panels (both branches, random branch, balanced branch) of the noise level logged by "
                    "`noisymlt train --clean-labels` (noise_level.jsonl), one line per kind of target (noisy, "
                    "Stitch-Up, Co-Learning, both), mean over the given runs' logs with a +-1 std band. Writes "
                    "OUT (PNG) and, beside it, .pdf, .csv and .md (start/end noise level per line).",
    )
    p.add_argument("--logs", nargs="+", required=True, help="noise_level.jsonl of each run (one per seed)")
    p.add_argument("--out", required=True, help="PNG to write (.pdf, .csv, .md beside it)")
    p.add_argument("--title", default="", help="figure title, e.g. the dataset and noise rate")
    p.add_argument("--smooth", type=int, default=1, help="pool the counts over this many iterations (default 1)")
    p.set_defaults(func=_cmd)
