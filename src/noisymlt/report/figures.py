"""Figures from results.parquet, drawn for one column of a two-column paper (noisymlt.report.style):

* mAP against noise rate of the compared methods, a 2 x 2 block of panels (total, head, medium, tail) per
  dataset, the mean over seeds (``figure``; the 95% intervals are in the tables);
* an ablation sweep (the paper's K and p figures): mAP against the swept Stitch-Up option
  (``figure --ablation-spec ... --x ...``), with the published points where the paper gives them.

Each figure is written as PNG and PDF without creation dates, so identical results give identical files.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import pandas as pd

from noisymlt.data.labels import GROUPS
from noisymlt.errors import NoisyMLTError
from noisymlt.report.style import (BLACK, BLUE, COLUMN_WIDTH, GREEN, ORANGE, VERMILLION, FONT_PT, dataset_title,
                                   paper_style, save_figure)
from noisymlt.report.tables import gamma_text, mean_ci, method_choice, primary_head, read_results

MARKERS = "osv^D<>phXd"
PAPER_ABLATION_DATASET = "voc"  # every ablation of the paper is reported on VOC-MLT-Noise (its captions)


def method_styles(methods: list[str], variants: dict[str, tuple[str, str]] | None = None) -> dict[str, dict]:
    """Colour, marker and width per method: tab10 and a marker each, and the paper's method (the last one,
    as in the tables) in black and wider, so that eleven lines stay apart even where they cross. ``variants``:
    METHOD -> (the method it retrains, line style), a clean-then-retrain method drawn in that method's colour and
    marker, hollow, in its own line style, so that a pair reads as one (when that method is drawn too)."""
    import matplotlib

    variants = {m: v for m, v in (variants or {}).items() if v[0] in methods[:-1] and m in methods[:-1]}
    colors = matplotlib.colormaps["tab10"].colors
    plain = [m for m in methods[:-1] if m not in variants]
    styles = {m: {"color": colors[k % 10], "marker": MARKERS[k % len(MARKERS)], "lw": 1.0, "zorder": 2}
              for k, m in enumerate(plain)}
    for m, (base, line) in variants.items():
        styles[m] = {**styles[base], "ls": line, "mfc": "white"}
    if methods:
        styles[methods[-1]] = {"color": BLACK, "marker": "*", "lw": 1.6, "ms": 5.5, "zorder": 3}
    return styles


def cleaned_variants(clean: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """METHOD -> its ``clean`` block (params ``methods.METHOD.clean``) as method_styles' variants: the method it
    retrains, dashed (dotted for the oracle's cleaning)."""
    return {m: (block["of"], ":" if block.get("flags") == "oracle" else "--") for m, block in clean.items()}


def map_vs_gamma_figure(results: pd.DataFrame, methods: list[str], labels: dict[str, str],
                        variants: dict[str, tuple[str, str]] | None = None):
    """The Figure: per dataset, total / head / medium / tail mAP (%) against the noise rate, one line per
    method of ``methods`` (the compared methods; ablation variants belong to the ablation figures), each
    drawn from its primary head and titled with its label; ticks at the noise rates of the data; ``variants`` as
    method_styles draws them."""
    import matplotlib.pyplot as plt

    sel = results[(results["metric"] == "mAP") & results["method"].isin(methods)]
    if sel.empty:
        raise NoisyMLTError(f"results hold no mAP of the methods {methods}")
    methods = [m for m in methods if m in set(sel["method"])]
    datasets = sorted(dict.fromkeys(sel["dataset"]), key=lambda d: (d != "voc", d != "coco", d))
    gammas = sorted(set(sel["gamma"]))
    groups = ("total", *GROUPS)
    styles = method_styles(methods, variants)
    seeds = sel.groupby(["dataset", "gamma", "method"])["seed"].nunique()
    with paper_style():
        fig, axes = plt.subplots(2 * len(datasets), 2, figsize=(COLUMN_WIDTH, 0.9 + 2.45 * len(datasets)),
                                 squeeze=False, sharex=True, layout="constrained")
        for i, ds in enumerate(datasets):
            for j, group in enumerate(groups):
                ax = axes[2 * i + j // 2][j % 2]
                part = sel[(sel["dataset"] == ds) & (sel["group"] == group)]
                for method in methods:
                    rows = part[(part["method"] == method) & (part["head"] == primary_head(results, method))]
                    means = [(g, mean_ci(100 * r["value"].to_numpy())[0]) for g, r in rows.groupby("gamma")]
                    noisy = [(g, m) for g, m in means if g > 0]
                    if noisy:
                        ax.plot(*zip(*noisy), label=labels.get(method, method), **styles[method])
                    clean = [(g, m) for g, m in means if g == 0]  # the clean column: a point apart, no line to γ 0.3
                    if clean:
                        ax.plot(*zip(*clean), **{**styles[method], "linestyle": "none"},
                                **({} if noisy else {"label": labels.get(method, method)}))
                ax.set_title(f"{dataset_title(ds)}: {group}" if len(datasets) > 1 else group)
                ax.set_xticks(gammas, [gamma_text(g) for g in gammas])
                ax.grid(True)
                if j // 2 == 1:
                    ax.set_xlabel("noise rate $\\gamma$")
                if j % 2 == 0:
                    ax.set_ylabel("mAP (%)")
        entries = {}  # every method once, also one with runs on a later dataset only
        for ax in axes.flat:
            entries.update(zip(*reversed(ax.get_legend_handles_labels())))
        wide = max(map(len, entries)) > 12  # four columns of such names run past one paper column
        fig.legend(entries.values(), entries.keys(), loc="outside lower center", ncol=3 if wide else 4, frameon=False,
                   columnspacing=1.0, handletextpad=0.4)
        lo, hi = int(seeds.min()), int(seeds.max())
        title = "mAP" if len(datasets) > 1 else f"{dataset_title(datasets[0])}: mAP"
        fig.suptitle(f"{title}, mean over {lo if lo == hi else f'{lo}-{hi}'} seed{'s' if hi > 1 else ''}")
    return fig


def sweep_points(results: pd.DataFrame, block: dict, xs: dict[str, float], group: str = "total") -> pd.DataFrame:
    """One row per swept method and noise rate of the ablation: x, mean and 95% half-width of its primary
    head's mAP (%), seeds. Only the ablation's own noise rates and seeds count (as in its table): a variant
    that is also in the main grid has runs at every rate and seed there."""
    sel = results[(results["metric"] == "mAP") & (results["group"] == group)
                  & (results["dataset"] == block["dataset"])]
    if block.get("gammas"):
        sel = sel[sel["gamma"].isin([float(g) for g in block["gammas"]])]
    if block.get("seeds"):
        sel = sel[sel["seed"].isin(block["seeds"])]
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


def sweep_figure(points: pd.DataFrame, block: dict, xs: dict[str, float]):
    """The paper's K / p figures as a Figure: total mAP against the swept option, one line per noise rate
    (error bars: the 95% CI over seeds, from three seeds on). The published points share the axes only when they
    are on the same dataset; else they get a panel of their own, so that neither scale squeezes the other."""
    import matplotlib.pyplot as plt

    published = sorted((xs[m], v[0]) for m, v in (block.get("paper") or {}).items() if m in xs and v[0] is not None)
    beside = bool(published) and block["dataset"] != PAPER_ABLATION_DATASET
    gammas = sorted(set(points["gamma"]))
    seeds = int(points["seeds"].max())
    with paper_style():
        fig, axes = plt.subplots(1, 2 if beside else 1, figsize=(COLUMN_WIDTH, 2.3), squeeze=False,
                                 sharex=True, layout="constrained")
        ax = axes[0][0]
        for k, (gamma, part) in enumerate(points.groupby("gamma")):
            color = (BLUE, VERMILLION, GREEN, ORANGE)[k % 4]
            ax.plot(part["x"], part["mean"], marker=MARKERS[k], color=color, lw=1.2,
                    label=f"$\\gamma$ = {gamma:g}" if beside else f"measured, $\\gamma$ = {gamma:g}")
            if part["seeds"].min() >= 3:  # error bars: the 95% CI of the mean over seeds (t-based)
                ci = part["ci95"].fillna(0.0)
                ax.vlines(part["x"], part["mean"] - ci, part["mean"] + ci, color=color, lw=0.9)
        at = f", $\\gamma$ = {gammas[0]:g}" if len(gammas) == 1 else ""
        where = f"measured on {dataset_title(block['dataset'])}" if beside else dataset_title(block["dataset"])
        bars = "\nmean ± 95% CI" if points["seeds"].min() >= 3 else ""
        ax.set_title(f"{where}\n{seeds} seed{'s' if seeds > 1 else ''}{at}{bars}")
        paper_gammas = block.get("gammas") or []
        paper_at = f", $\\gamma$ = {float(paper_gammas[0]):g}" if len(paper_gammas) == 1 else ""
        if published:
            pax = axes[0][1] if beside else ax
            pax.plot(*zip(*published), ls="--", marker="x", color="0.35", lw=1.0,
                     label=f"paper, {dataset_title(PAPER_ABLATION_DATASET)}")
            if beside:
                pax.set_title(f"paper, {dataset_title(PAPER_ABLATION_DATASET)}\n{paper_at.lstrip(', ')}")
        if beside:  # one x title under both panels: two would not fit the column
            fig.supxlabel(block["sweep"]["label"], fontsize=FONT_PT)
        else:
            ax.set_xlabel(block["sweep"]["label"])
        for a in axes[0]:
            a.set_ylabel("total mAP (%)")
            a.set_xticks(sorted(set(points["x"])), [f"{x:g}" for x in sorted(set(points["x"]))])
            a.grid(True)
            a.margins(y=0.15)
        if len(ax.get_lines()) > 1:  # one line per panel is named by its title
            handles, names = ax.get_legend_handles_labels()
            fig.legend(handles, names, loc="outside lower center", ncol=min(3, len(names)), frameon=False)
        fig.suptitle("\n".join(textwrap.wrap(block["label"], 55, break_on_hyphens=False)))
    return fig


def _cmd_figure(args: argparse.Namespace) -> int:
    results = read_results(args.results)
    out = Path(args.out)
    if args.ablation_spec:
        block = json.loads(args.ablation_spec)
        if "sweep" not in block:
            raise NoisyMLTError(f"ablation {block.get('label', '?')!r} has no `sweep` key: nothing to plot")
        xs = json.loads(args.x or "{}")
        points = sweep_points(results, block, xs)
        save_figure(sweep_figure(points, block, xs), out)
        points.to_csv(out.with_suffix(".csv"), index=False, float_format="%.4f")
        return 0
    labels, methods, params = method_choice(args)
    clean = json.loads(args.cleaned) if args.cleaned else {
        m: b["clean"] for m, b in (params or {}).get("methods", {}).items() if isinstance(b, dict) and b.get("clean")}
    if not methods:
        raise NoisyMLTError("figure: name the compared methods (--methods, or --params files with grid.methods); "
                            "results.parquet also holds the ablation variants, which belong to their own figures")
    save_figure(map_vs_gamma_figure(results, methods, labels, cleaned_variants(clean)), out)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("figure", help="plot mAP against noise rate (mean over seeds) of the compared methods",
                       description="A 2 x 2 block of panels (total, head, medium, tail) per dataset, one line per "
                                   "method, sized for one column of a two-column paper. With --ablation-spec: "
                                   "an ablation's mAP against its swept option instead.")
    p.add_argument("--results", required=True, help="results.parquet from `noisymlt aggregate`")
    p.add_argument("--out", required=True, help="PNG to write (a PDF is written next to it)")
    p.add_argument("--methods", nargs="*", help="the methods to draw, in legend order (default: grid.methods "
                                               "of --params)")
    p.add_argument("--labels", help='method display names as JSON, e.g. \'{"erm": "ERM"}\'')
    p.add_argument("--params", nargs="*", help="params files: method labels and grid.methods")
    p.add_argument("--cleaned", help="the clean-then-retrain methods' `clean` blocks as JSON (default: from --params), "
                                     'e.g. \'{"clean_erm": {"of": "erm", "flags": "cleanlab"}}\': each drawn in the '
                                     "colour of the method it retrains, dashed (dotted: the oracle)")
    p.add_argument("--ablation-spec", help="an `ablations` block with a `sweep` key, as JSON: draw mAP against the "
                                           "swept option instead (the paper's K and p figures; also writes OUT .csv)")
    p.add_argument("--x", help='the swept value of each of its methods, as JSON, e.g. \'{"ours_k3": 3}\'')
    p.set_defaults(func=_cmd_figure)
