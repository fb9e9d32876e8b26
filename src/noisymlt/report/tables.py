"""Paper-layout tables from results.parquet: mean +- 95% CI over seeds, rank-1 bold, rank-2 underlined.

* ``table_total``: rows = methods, columns = dataset x noise rate, one class group (total mAP by default).
* ``--groups DATASET``: the paper's per-dataset tables, columns = noise rate x (head, medium, tail).
* ablation tables: rows = the ablation's method variants, columns = noise rate x group (total, head,
  medium, tail) on one dataset, as the paper's ablation tables.

Two-branch methods are ranked by their ensemble; their separate branches are listed below them, shaded
and left out of the ranking, as in the paper. Every table is written as LaTeX, as Markdown (printed by
the demo) and with a ``.cells.json`` sidecar mapping each cell to its runs, for ``noisymlt trace``.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from noisymlt.data.labels import GROUPS
from noisymlt.data.noise_models import PAPER
from noisymlt.errors import NoisyMLTError
from noisymlt.report.style import dataset_title

BRANCH_TITLES = {"random": "random", "balanced": "balance"}


def branch_title(label: str, head: str) -> str:
    """A branch row's title: "Ours-random" as in the paper; a label ending in punctuation ("-- / --",
    an ablation row) gets the branch in brackets instead."""
    branch = BRANCH_TITLES.get(head, head)
    return f"{label}-{branch}" if label[-1:].isalnum() else f"{label} ({branch})"


@dataclass
class Cell:
    mean: float
    ci: float | None  # 95% half-width; None with a single seed
    runs: list[dict]


def read_results(path: str | Path, every_noise_model: bool = False) -> pd.DataFrame:
    """results.parquet, or an error naming the file (every report command reads it through this).

    The main table compares noise models side by side (``every_noise_model``); every other table and figure shows
    one: the paper's when the results hold it, else the only one they hold (one_noise_model)."""
    try:
        results = pd.read_parquet(path, page_checksum_verification=True)  # written with page checksums (aggregate)
    except Exception as exc:
        raise NoisyMLTError(f"{path}: cannot read results ({exc})") from exc
    results = with_noise_model(results)
    return results if every_noise_model else one_noise_model(results, str(path))


def with_noise_model(results: pd.DataFrame) -> pd.DataFrame:
    """Results aggregated before noise models had a column hold the paper's model's runs."""
    return results if "noise_model" in results else results.assign(noise_model=PAPER)


def one_noise_model(results: pd.DataFrame, source: str) -> pd.DataFrame:
    """The rows of one noise model: the paper's if present, else the only one (several without the paper's:
    refused, naming them, rather than mixing their runs in one cell)."""
    models = list(dict.fromkeys(results["noise_model"]))
    if len(models) <= 1:
        return results
    if PAPER not in models:
        raise NoisyMLTError(f"{source}: results of noise models {', '.join(models)}; this table shows one (the "
                            "paper's, cooccurrence, when present): list it in grid.noise_models")
    return results[results["noise_model"] == PAPER]


def noise_columns(results: pd.DataFrame) -> list[str]:
    """The column keys that tell noise models apart: none while the results hold one."""
    return ["noise_model"] if results["noise_model"].nunique() > 1 else []


def noise_title(model: str) -> str:
    """A noise model as tables name it: its label, the paper's marked so."""
    from noisymlt.data.noise_models import noise_model

    label = noise_model(model).label
    return f"{label} (paper)" if model == PAPER else label


def noise_caption(results: pd.DataFrame) -> str:
    """What a caption adds about the noise: nothing for the paper's model alone (the tables as they always were),
    else the models' names."""
    models = list(dict.fromkeys(results["noise_model"]))
    if models == [PAPER]:
        return ""
    return ("; noise model" + ("s " if len(models) > 1 else " ") + ", ".join(noise_title(m) for m in models))


def mean_ci(values: np.ndarray) -> tuple[float, float | None]:
    """Mean and Student-t 95% confidence half-width over seeds."""
    from scipy import stats

    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), None
    if len(values) == 1:
        return float(values[0]), None
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()), float(half)


def primary_head(results: pd.DataFrame, method: str) -> str:
    """The head a method is ranked by: its ensemble if it has one, else its single head."""
    heads = set(results.loc[(results["method"] == method) & (results["metric"] == "mAP"), "head"])
    return "ensemble" if "ensemble" in heads else sorted(heads)[0]


def collect_cells(results: pd.DataFrame, column_keys: list[str]) -> dict:
    """cells[(method, head, *column)] over mAP rows, grouped by method, head and ``column_keys``."""
    sel = results[results["metric"] == "mAP"]
    if sel.empty:
        raise NoisyMLTError("results hold no mAP rows")
    cells = {}
    for key, part in sel.groupby(["method", "head", *column_keys], sort=False):
        m, ci = mean_ci(100 * part["value"].to_numpy())
        runs = [{"run_id": r.run_id, "seed": int(r.seed), "manifest": r.manifest}
                for r in part.sort_values("seed").itertuples()]
        cells[tuple(float(k) if isinstance(k, (float, np.floating)) else k for k in key)] = Cell(m, ci, runs)
    return cells


DECIMALS = 2  # mAP (%) in every table, and in the README's numbers (noisymlt.report.readme)


def cell_text(mean: float, ci: float | None, pm: str = " ± ") -> str:
    """'mean ± ci' at DECIMALS: the one rounding of a shown number, so the README reads as the tables do."""
    return f"{mean:.{DECIMALS}f}" + ("" if ci is None else f"{pm}{ci:.{DECIMALS}f}")


def fmt(cell: Cell | None, style: str, rank: int | None = None) -> str:
    if cell is None or not np.isfinite(cell.mean):
        return "--"
    text = cell_text(cell.mean, cell.ci, " $\\pm$ " if style == "tex" else " ± ")
    if rank == 1:
        return f"\\textbf{{{text}}}" if style == "tex" else f"**{text}**"
    if rank == 2:
        return f"\\underline{{{text}}}" if style == "tex" else f"_{text}_"
    return text


def html_cell(text: str) -> str:
    """A Markdown table cell as the HTML page shows it (bold and underline kept)."""
    import html
    import re

    text = html.escape(text.strip())
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"^_(.+)_$", r"<u>\1</u>", text)


def markdown_table_html(md_rows: list[str], caption: str) -> str:
    """A self-contained HTML page of a Markdown table (for Snakemake's report), bold/underline kept."""
    import html
    import re

    cell = html_cell
    split = [[c for c in row.strip().strip("|").split("|")] for row in md_rows if not row.startswith("|---")]
    head = "".join(f"<th>{cell(c)}</th>" for c in split[0])
    body = "\n".join("<tr>" + "".join(f"<td>{cell(c)}</td>" for c in row) + "</tr>" for row in split[1:])
    caption = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(caption))
    caption = re.sub(r"(?<!\w)_(.+?)_(?!\w)", r"<u>\1</u>", caption)
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><style>"
            "table{border-collapse:collapse;font:12px sans-serif}td,th{border:1px solid #ccc;padding:2px 6px;"
            "text-align:right}td:first-child,th:first-child{text-align:left}</style></head><body>"
            f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead><tbody>\n{body}\n"
            "</tbody></table></body></html>\n")


def render(results: pd.DataFrame, cells: dict, methods: list[str], cols: list[tuple], labels: dict[str, str],
           header_tex: list[str], header_md: str, spec: str, out_tex: Path, caption: str,
           unranked: set = frozenset(), note: str | None = None) -> dict:
    """Write the .tex/.md/.cells.json trio. Rows: each method's primary head, then its other heads. ``note``: a
    line under the table (the .md, the .html caption, a footnote row of the .tex)."""
    rows = []
    for m in methods:
        heads = list(dict.fromkeys(k[1] for k in cells if k[0] == m))
        if not heads:
            continue
        first = primary_head(results, m)
        rows += [(m, first, True)] + [(m, h, False) for h in heads if h != first]
    marks = {}
    for col in [c for c in cols if c not in unranked]:
        scored = sorted(((cells[(m, h, *col)].mean, (m, h)) for m, h, ranked in rows
                         if ranked and (m, h, *col) in cells and np.isfinite(cells[(m, h, *col)].mean)),
                        key=lambda t: -t[0])
        for rank, (_, r) in enumerate(scored[:2]):
            marks[(r, col)] = rank + 1
    lines = ["% generated by `noisymlt table`; cell provenance in the .cells.json sidecar",
             f"\\begin{{tabular}}{{{spec}}}", "\\toprule", *header_tex, "\\midrule"]
    md = [header_md, "|---|" + "---|" * len(cols)]
    shown = {}  # where each cell stands in the rendered files, and its text there (noisymlt trace checks them)
    for row, (m, h, ranked) in enumerate(rows):
        title = labels.get(m, m) if ranked else branch_title(labels.get(m, m), h)
        tex_cells = [fmt(cells.get((m, h, *c)), "tex", marks.get(((m, h), c))) for c in cols]
        md_cells = [fmt(cells.get((m, h, *c)), "md", marks.get(((m, h), c))) for c in cols]
        lines.append(("" if ranked else "\\rowcolor{Gray}\n") + f"{title} & " + " & ".join(tex_cells) + " \\\\")
        md.append(f"| {title} | " + " | ".join(md_cells) + " |")
        for col, c in enumerate(cols):
            if (m, h, *c) in cells:
                shown[(m, h, *c)] = {"row": row, "col": col + 1, "title": title, "tex": tex_cells[col],
                                     "md": md_cells[col], "html": html_cell(md_cells[col])}
    lines += ["\\bottomrule"]
    if note:
        lines.append(f"\\multicolumn{{{1 + len(cols)}}}{{l}}{{\\footnotesize {tex_text(note)}}} \\\\")
    lines += ["\\end{tabular}", ""]
    out_tex.parent.mkdir(parents=True, exist_ok=True)
    out_tex.write_text("\n".join(lines))
    legend = "mAP (%), mean ± 95% CI over seeds; **rank 1**, _rank 2_ (separate branches not ranked)"
    out_tex.with_suffix(".md").write_text(f"{caption}\n\n{legend}\n\n" + "\n".join(md) + "\n"
                                          + (f"\n{note}\n" if note else ""))
    html_caption = f"{caption}. {legend}" + (f". {note}" if note else "")
    out_tex.with_suffix(".html").write_text(markdown_table_html(md, html_caption))
    from noisymlt.core.manifest import file_sha256

    def name(key: tuple) -> str:
        return "/".join(f"{x:g}" if isinstance(x, float) else str(x) for x in key)

    sidecar = {"table": str(out_tex),
               "cells": {name(key): {"mean": c.mean, "ci95": c.ci, "runs": c.runs}
                         for key, c in cells.items() if key[0] in methods}}
    out_tex.with_suffix(".cells.json").write_text(json.dumps(sidecar, indent=1) + "\n")
    # where each cell stands in the files a reader sees, and their hashes (noisymlt trace checks them): a file of
    # its own, not the cells' sidecar, which DVC reads as metrics (its columns are numbers, not rendered text)
    record = {"table": str(out_tex),
              "rendered": {style: {"path": str(out_tex.with_suffix(f".{style}")),
                                   "sha256": file_sha256(out_tex.with_suffix(f".{style}"))}
                           for style in ("tex", "md", "html")},
              "shown": {name(key): at for key, at in shown.items() if key[0] in methods}}
    rendered_path(out_tex).write_text(json.dumps(record, indent=1) + "\n")
    return sidecar


def gamma_text(gamma: float) -> str:
    """A noise rate as a column header: 0 is the clean column (grid.clean_methods)."""
    return "clean" if float(gamma) == 0.0 else f"{gamma:g}"


def rendered_path(table: str | Path) -> Path:
    """The record of a table's rendered files beside it: reports/table_total.tex -> reports/table_total.rendered.json
    (also from its cells sidecar, reports/table_total.cells.json)."""
    table = Path(table)
    stem = table.name.removesuffix(".cells.json") if table.name.endswith(".cells.json") else table.stem
    return table.with_name(stem + ".rendered.json")


def write_table(results: pd.DataFrame, out_tex: Path, labels: dict[str, str], group: str = "total",
                methods: list[str] | None = None) -> dict:
    """Main comparison: columns = dataset x noise rate. Cell keys: METHOD/HEAD/DATASET/GAMMA. Results of several
    noise models: columns = dataset x model x rate, keys METHOD/HEAD/DATASET/MODEL/GAMMA, a header row names the
    models (grid.noise_models)."""
    results = with_noise_model(results)
    sel = results[results["group"] == group]
    by_noise = noise_columns(sel)
    cells = collect_cells(sel, ["dataset", *by_noise, "gamma"])
    methods = methods or list(dict.fromkeys(sel["method"]))
    order = {m: k for k, m in enumerate(dict.fromkeys([PAPER, *sel["noise_model"]]))}
    cols = sorted({k[2:] for k in cells}, key=lambda c: (c[0] != "voc", c[0] != "coco", c[0],
                                                         *([order[c[1]]] if by_noise else []), c[-1]))
    datasets = list(dict.fromkeys(c[0] for c in cols))
    per_ds = {d: [c for c in cols if c[0] == d] for d in datasets}
    header = ["Dataset & " + " & ".join(f"\\multicolumn{{{len(per_ds[d])}}}{{c}}{{{dataset_title(d)}}}"
                                        for d in datasets) + " \\\\", "\\midrule"]
    if by_noise:
        runs_of = [(c[0], c[1]) for c in cols]
        spans = list(dict.fromkeys(runs_of))
        header += ["Noise model & " + " & ".join(f"\\multicolumn{{{runs_of.count(s)}}}{{c}}{{{tex_text(noise_title(s[1]))}}}"
                                                 for s in spans) + " \\\\"]
    header += ["Noise rate~$\\gamma$ & " + " & ".join(gamma_text(c[-1]) for c in cols) + " \\\\"]
    header_md = "| Method | " + " | ".join(f"{dataset_title(c[0])}{f' {noise_title(c[1])}' if by_noise else ''} "
                                           f"{gamma_text(c[-1])}" for c in cols) + " |"
    spec = "l|" + "||".join("|".join("c" for _ in per_ds[d]) for d in datasets)
    return render(results, cells, methods, cols, labels, header, header_md, spec, out_tex,
                  f"{group} mAP{noise_caption(sel)}")


def write_groups_table(results: pd.DataFrame, out_tex: Path, labels: dict[str, str], dataset: str,
                       methods: list[str] | None = None, note: str | None = None) -> dict:
    """The paper's per-dataset tables (table:VOC, table:COCO): columns = noise rate x (head, medium,
    tail) on one dataset. Cell keys: METHOD/HEAD/GAMMA/GROUP. ``note``: the group thresholds when they are not
    SPEC 1's (``groups_note``)."""
    sel = results[(results["dataset"] == dataset) & results["group"].isin(GROUPS)]
    if methods:
        sel = sel[sel["method"].isin(methods)]
    if sel.empty:
        raise NoisyMLTError(f"results hold no head/medium/tail rows on dataset {dataset!r}")
    cells = collect_cells(sel, ["gamma", "group"])
    methods = methods or list(dict.fromkeys(sel["method"]))
    gammas = sorted({k[2] for k in cells})
    cols = [(g, grp) for g in gammas for grp in GROUPS]
    title = dataset_title(dataset)
    header = [f"\\multicolumn{{{1 + len(cols)}}}{{c}}{{{title}}} \\\\", "\\midrule",
              "Noise rate~$\\gamma$ & " + " & ".join(f"\\multicolumn{{3}}{{c}}{{{gamma_text(g)}}}" for g in gammas) + " \\\\",
              "\\midrule",
              "Methods & " + " & ".join(grp for _ in gammas for grp in GROUPS) + " \\\\"]
    header_md = "| Method | " + " | ".join(f"{grp} ({'clean' if g == 0 else f'γ={g:g}'})" for g, grp in cols) + " |"
    spec = "l|" + "|".join("ccc" for _ in gammas)
    return render(results, cells, methods, cols, labels, header, header_md, spec, out_tex,
                  f"head / medium / tail mAP on {title}", note=note)


def groups_note(train_labels: str | Path) -> str | None:
    """The group thresholds of a dataset's class split, as a line under its group table, when `noisymlt longtail`
    scaled them (recorded in the training subset's label table); None for SPEC 1's 100 / 20."""
    from noisymlt.data.labels import read_labels
    from noisymlt.data.structure import recorded_thresholds, threshold_text

    table = read_labels(train_labels)
    thresholds = recorded_thresholds(table.meta, str(train_labels))
    if thresholds["rule"] != "scaled":
        return None
    return f"Groups by training images per class: {threshold_text(thresholds, len(table))}."


def tex_text(text: str) -> str:
    """Plain text as LaTeX text (a note under a table)."""
    return text.replace("%", "\\%").replace(">=", "$\\geq$").replace("<", "$<$").replace("_", "\\_")


def write_ablation_table(results: pd.DataFrame, out_tex: Path, labels: dict[str, str], block: dict) -> dict:
    """Ablation layout: columns = noise rate x (total, head, medium, tail) on one dataset, rows titled by
    the block's ``rows``; the published numbers (``paper``) follow in a last column for comparison.
    Cell keys: METHOD/HEAD/GAMMA/GROUP."""
    methods, dataset = block["methods"], block["dataset"]
    # only the ablation's own noise rates and seeds: a variant that is also in the main grid (Ours) has runs
    # at every rate and seed there, which would make columns and means the ablation never asked for
    sel = results[(results["dataset"] == dataset) & results["method"].isin(methods)
                  & results["group"].isin(("total", *GROUPS))
                  & results["gamma"].isin([float(g) for g in block["gammas"]]) & results["seed"].isin(block["seeds"])]
    if sel.empty:
        raise NoisyMLTError(f"results hold no runs of {methods} on {dataset}")
    cells = collect_cells(sel, ["gamma", "group"])
    gammas = sorted({k[2] for k in cells})
    cols = [(g, grp) for g in gammas for grp in ("total", *GROUPS)]
    paper = block.get("paper", {})
    if paper:  # a pseudo-column holding the published values, never ranked
        cols.append(("paper", "total"))
        for m, values in paper.items():
            if values[0] is not None:
                cells[(m, primary_head(sel, m) if m in set(sel["method"]) else "main", "paper", "total")] = Cell(
                    float(values[0]), None, [])
    header = []
    if len(gammas) > 1:
        header += ["Noise rate~$\\gamma$ & " + " & ".join(f"\\multicolumn{{4}}{{c}}{{{g:g}}}" for g in gammas)
                   + (" & " if paper else "") + " \\\\"]
    header += ["Method & " + " & ".join(grp.capitalize() for _ in gammas for grp in ("total", *GROUPS))
               + (" & Paper" if paper else "") + " \\\\"]
    header_md = "| Method | " + " | ".join("paper total" if g == "paper" else f"{grp} (γ={g:g})"
                                           for g, grp in cols) + " |"
    spec = "l|" + "||".join("cccc" for _ in gammas) + ("|c" if paper else "")
    row_labels = {**labels, **block.get("rows", {})}
    sidecar = render(results, cells, methods, cols, row_labels, header, header_md, spec, out_tex,
                     f"{block['label']} ({dataset_title(dataset)})", unranked={("paper", "total")})
    return sidecar


def method_choice(args: argparse.Namespace) -> tuple[dict[str, str], list[str] | None, dict | None]:
    """(display names, methods to show or None for all, params or None) from a report command's --labels and
    --methods, or from --params files (their methods' labels and grid.methods)."""
    labels = json.loads(args.labels) if args.labels else {}
    params = None
    if args.params:
        from noisymlt.config import load_params

        params = load_params(*args.params)
        labels = {name: block.get("label", name) for name, block in params["methods"].items()}
    return labels, args.methods or (params["grid"]["methods"] if params else None), params


def _cmd_table(args: argparse.Namespace) -> int:
    main_table = not (args.ablation or args.ablation_spec or args.groups)
    results = read_results(args.results, every_noise_model=main_table)
    labels, methods, params = method_choice(args)
    if args.ablation:
        if params is None or args.ablation not in params.get("ablations", {}):
            raise NoisyMLTError(f"--ablation {args.ablation!r} needs --params files that define it")
        write_ablation_table(results, Path(args.out), labels, params["ablations"][args.ablation])
    elif args.ablation_spec:
        write_ablation_table(results, Path(args.out), labels, json.loads(args.ablation_spec))
    elif args.groups:
        note = groups_note(args.train_labels) if args.train_labels else None
        write_groups_table(results, Path(args.out), labels, args.groups, methods, note)
    else:
        write_table(results, Path(args.out), labels, args.group, methods)
    if args.print:
        print(Path(args.out).with_suffix(".md").read_text())
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("table", help="paper-layout LaTeX/Markdown table from results.parquet",
                       description="Main table: rows = methods (two-branch methods also show their branches, shaded "
                                   "and not ranked), columns = dataset x noise rate; cells = mean +- 95%% CI over "
                                   "seeds. --ablation NAME: the ablation layout (columns = total/head/medium/tail). "
                                   "Writes OUT (.tex), OUT with .md and with .cells.json.")
    p.add_argument("--results", required=True, help="results.parquet from `noisymlt aggregate`")
    p.add_argument("--out", required=True, help="LaTeX file to write")
    p.add_argument("--group", default="total", choices=["total", "head", "medium", "tail"])
    p.add_argument("--methods", nargs="*", help="rows, in order (default: grid.methods of --params, else all)")
    p.add_argument("--labels", help='method display names as JSON, e.g. \'{"erm": "ERM"}\'')
    p.add_argument("--params", nargs="*", help="params files: method labels, grid and ablation definitions")
    p.add_argument("--ablation", help="name of an `ablations` block of --params: write its table")
    p.add_argument("--ablation-spec", help="an `ablations` block as JSON (what the workflow passes)")
    p.add_argument("--groups", metavar="DATASET",
                   help="the per-dataset layout (the paper's VOC and COCO tables): columns = noise rate x "
                        "head/medium/tail on DATASET")
    p.add_argument("--train-labels", metavar="TABLE",
                   help="with --groups: DATASET's training subset (data/DATASET/train_labels.parquet), whose "
                        "recorded group thresholds the table states when `noisymlt longtail` scaled them")
    p.add_argument("--print", action="store_true", help="print the Markdown version")
    p.set_defaults(func=_cmd_table)
