"""Figures from results.parquet, mean over seeds with a 95% confidence band from three seeds on:

* mAP against noise rate, one panel per dataset and class group (``figure``);
* an ablation sweep (the paper's K and p figures): mAP against the swept Stitch-Up option
  (``figure --ablation-spec ... --x ...``), with the published points where the paper gives them.

Each figure is written as PNG and PDF without creation dates, so identical results give identical files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from noisymlt.errors import NoisyMLTError
from noisymlt.labels import GROUPS
from noisymlt.report.tables import mean_ci, primary_head, read_results

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
    return save_figure(fig, out)


def save_figure(fig, out: Path) -> Path:
    """OUT (PNG) and OUT with .pdf, with no dates or version stamps inside (reproducible bytes)."""
    import matplotlib.pyplot as plt

    out.parent.mkdir(parents=True, exist_ok=True)
    # no Software / creation-date metadata: figures are tracked outputs, the same data give the same bytes
    fig.savefig(out, dpi=120, metadata={"Software": None})
    fig.savefig(out.with_suffix(".pdf"), metadata={"CreationDate": None, "Producer": None, "Creator": None})
    plt.close(fig)
    return out


def sweep_points(results: pd.DataFrame, block: dict, xs: dict[str, float], group: str = "total") -> pd.DataFrame:
    """One row per swept method: x, mean and 95% half-width of its primary head's mAP (%), seeds."""
    sel = results[(results["metric"] == "mAP") & (results["group"] == group)
                  & (results["dataset"] == block["dataset"])]
    rows = []
    for method in block["methods"]:
        if method not in xs:
            raise NoisyMLTError(f"ablation {block.get('label', '?')}: no x value for method {method!r}")
        part = sel[(sel["method"] == method) & (sel["head"] == primary_head(results, method))] \
            if method in set(sel["method"]) else sel.iloc[:0]
        for gamma, runs in part.groupby("gamma"):
            mean, ci = mean_ci(100 * runs["value"].to_numpy())
            rows.append({"method": method, "gamma": float(gamma), "x": float(xs[method]), "mean": mean,
                         "ci95": ci, "seeds": int(runs["seed"].nunique())})
    if not rows:
        raise NoisyMLTError(f"results hold no runs of {block['methods']} on {block['dataset']}")
    return pd.DataFrame(rows).sort_values(["gamma", "x"])


def plot_sweep(results: pd.DataFrame, block: dict, xs: dict[str, float], out: Path) -> Path:
    """The paper's K / p figures: total mAP against the swept option, one line per noise rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sweep_points(results, block, xs)
    fig, ax = plt.subplots(figsize=(3.6, 2.8))
    for k, (gamma, part) in enumerate(points.groupby("gamma")):
        line = ax.plot(part["x"], part["mean"], marker=MARKERS[k], lw=1.4, label=f"measured, $\\gamma$={gamma:g}")[0]
        if part["seeds"].min() >= 3:
            ci = part["ci95"].fillna(0.0)
            ax.fill_between(part["x"], part["mean"] - ci, part["mean"] + ci, color=line.get_color(), alpha=0.15, lw=0)
    published = [(xs[m], v[0]) for m, v in (block.get("paper") or {}).items() if m in xs and v[0] is not None]
    if published:
        px, py = zip(*sorted(published))
        ax.plot(px, py, ls="--", marker="x", color="0.4", lw=1, label="paper (VOC-MLT-Noise)")
    ax.set_xlabel(block["sweep"]["label"])
    ax.set_ylabel("total mAP (%)")
    ax.set_xticks(sorted(set(points["x"])))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(block["label"], fontsize=8)
    fig.tight_layout()
    points.to_csv(out.with_suffix(".csv"), index=False, float_format="%.4f")
    return save_figure(fig, out)


def _cmd_figure(args: argparse.Namespace) -> int:
    results = read_results(args.results)
    if args.ablation_spec:
        block = json.loads(args.ablation_spec)
        if "sweep" not in block:
            raise NoisyMLTError(f"ablation {block.get('label', '?')!r} has no `sweep` key: nothing to plot")
        plot_sweep(results, block, json.loads(args.x or "{}"), Path(args.out))
    else:
        plot_map_vs_gamma(results, Path(args.out))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("figure", help="plot mAP against noise rate (mean and 95%% CI band over seeds)",
                       description="One panel per dataset and class group (total, head, medium, tail).")
    p.add_argument("--results", required=True, help="results.parquet from `noisymlt aggregate`")
    p.add_argument("--out", required=True, help="PNG to write (a PDF is written next to it)")
    p.add_argument("--ablation-spec", help="an `ablations` block with a `sweep` key, as JSON: draw mAP against the "
                                           "swept option instead (the paper's K and p figures; also writes OUT .csv)")
    p.add_argument("--x", help='the swept value of each of its methods, as JSON, e.g. \'{"ours_k3": 3}\'')
    p.set_defaults(func=_cmd_figure)
