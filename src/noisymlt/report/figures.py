"""Figures from results.parquet: mAP against noise rate, one panel per dataset and class group
(mean over seeds; a 95% confidence band from three seeds on)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from noisymlt.errors import NoisyMLTError
from noisymlt.labels import GROUPS
from noisymlt.report.tables import mean_ci, primary_head

MARKERS = "os^vD<>ph*"


def plot_map_vs_gamma(results: pd.DataFrame, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = matplotlib.colormaps["tab20"]
    sel = results[results["metric"] == "mAP"]
    datasets = list(dict.fromkeys(sel["dataset"]))
    groups = ("total", *GROUPS)
    fig, axes = plt.subplots(len(datasets), len(groups), figsize=(3.2 * len(groups), 2.8 * len(datasets)),
                             squeeze=False, sharex=True)
    for i, ds in enumerate(datasets):
        for j, group in enumerate(groups):
            ax = axes[i][j]
            part = sel[(sel["dataset"] == ds) & (sel["group"] == group)]
            for k, method in enumerate(dict.fromkeys(part["method"])):
                rows = part[(part["method"] == method) & (part["head"] == primary_head(results, method))]
                stats = [(g, *mean_ci(100 * r["value"].to_numpy())) for g, r in rows.groupby("gamma")]
                xs = [s[0] for s in stats]
                ys = [s[1] for s in stats]
                ci = [s[2] or 0.0 for s in stats]
                line = ax.plot(xs, ys, marker=MARKERS[k % len(MARKERS)], ms=3, lw=1.2, label=method,
                               color=colors(k % 20))[0]
                if rows["seed"].nunique() >= 3:  # a t-interval over 2 seeds is too wide to read
                    ax.fill_between(xs, [y - c for y, c in zip(ys, ci)], [y + c for y, c in zip(ys, ci)],
                                    color=line.get_color(), alpha=0.1, lw=0)
            ax.set_title(f"{ds}: {group}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(datasets) - 1:
                ax.set_xlabel("noise rate $\\gamma$")
            if j == 0:
                ax.set_ylabel("mAP (%)")
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    # no Software / creation-date metadata: the figure is a tracked output, the same data give the same bytes
    fig.savefig(out, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return out


def _cmd_figure(args: argparse.Namespace) -> int:
    try:
        results = pd.read_parquet(args.results)
    except Exception as exc:
        raise NoisyMLTError(f"{args.results}: cannot read results ({exc})") from exc
    plot_map_vs_gamma(results, Path(args.out))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("figure", help="plot mAP against noise rate (mean and 95%% CI band over seeds)",
                       description="One panel per dataset and class group (total, head, medium, tail).")
    p.add_argument("--results", required=True, help="results.parquet from `noisymlt aggregate`")
    p.add_argument("--out", required=True, help="PNG to write")
    p.set_defaults(func=_cmd_figure)
