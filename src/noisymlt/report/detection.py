"""`noisymlt detection-table`: how well each method's ranking of suspect labels finds the wrong ones, per noise rate.

From the records of `noisymlt suspects --clean-labels` (noisymlt.inference.suspects), one a run: rows = method x
scorer (the model's own prediction, Ours' pseudo-label rule, DivideMix's label refinement, cleanlab on the same
probabilities), columns = noise rate in three blocks: AP, the average precision of the ranking over every (training
image, class) entry, the wrong labels being the positives; P@n, the precision among the n most suspect entries, n
the number of wrong labels (which equals the recall there); R, the recall of the entries the scorer flags as wrong.
Cells are mean +- 95% CI over seeds (Student t), in percent. The row ``chance`` is a ranking that knows nothing:
its AP and its P@n are both the share of wrong entries. The CSV has every number, also each scorer's flag count
and flag precision. Written as OUT (.tex), OUT with .md and .csv.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
from pathlib import Path

import numpy as np

from noisymlt.core.files import replacing
from noisymlt.errors import NoisyMLTError, cause
from noisymlt.report.style import dataset_title
from noisymlt.report.tables import cell_text, mean_ci, noise_title

SCORER_TITLES = {"model": "its prediction", "pseudo_labels": "pseudo-label rule", "dividemix": "label refinement",
                 "cleanlab": "cleanlab"}
MEASURES = {"ap": "AP", "precision_at_wrong": "P@n", "flag_recall": "R"}


DETECTION_NUMBERS = ("wrong", "entries", "flagged", "precision_at_wrong", "flag_precision", "flag_recall", "ap")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _problem(record) -> str | None:
    """What keeps a parsed file from being a suspects record with detection numbers (None: nothing)."""
    if not isinstance(record, dict):
        kind = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(type(record), "a number")
        return f"holds {kind}, not a record of `noisymlt suspects`"
    missing = [k for k in ("method", "dataset", "gamma", "seed", "scorers") if k not in record]
    if missing:
        return f"no {', '.join(map(repr, missing))}: not a record of `noisymlt suspects`"
    if not isinstance(record["method"], str) or not isinstance(record["dataset"], str):
        return "'method' and 'dataset' must be text"
    if not _number(record["gamma"]) or not _number(record["seed"]):
        return f"'gamma' ({record['gamma']!r}) and 'seed' ({record['seed']!r}) must be numbers"
    if not isinstance(record["scorers"], dict) or not record["scorers"]:
        return "'scorers' must map each scorer to its numbers"
    for scorer, rec in record["scorers"].items():
        if scorer not in SCORER_TITLES:
            return f"unknown scorer {scorer!r} (known: {', '.join(SCORER_TITLES)})"
        numbers = rec.get("detection") if isinstance(rec, dict) else None
        if numbers is None:
            return f"scorer {scorer!r} has no detection numbers; run `noisymlt suspects` with --clean-labels"
        if not isinstance(numbers, dict) or any(k not in numbers for k in DETECTION_NUMBERS):
            return f"scorer {scorer!r}: 'detection' must hold {', '.join(DETECTION_NUMBERS)}"
        bad = [k for k in DETECTION_NUMBERS if not (numbers[k] is None or _number(numbers[k]))]
        if bad:
            return f"scorer {scorer!r}: {', '.join(bad)} must be numbers or null"
    return None


def read_records(paths: list[str]) -> list[dict]:
    """The records, each checked (one line naming the file otherwise); two records of one (method, dataset, noise
    rate, seed, noise model) are refused: averaged, they would count one noisy set as two seeds."""
    records, seen = [], {}
    for path in paths:
        try:
            record = json.loads(Path(path).read_bytes())
        except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
            raise NoisyMLTError(f"{path}: cannot read a suspects record ({cause(exc)})") from None
        problem = _problem(record)
        if problem:
            raise NoisyMLTError(f"{path}: {problem}")
        key = (record["method"], record["dataset"], float(record["gamma"]), record["seed"],
               record.get("noise_model", "paper"))
        if key in seen:
            raise NoisyMLTError(f"{path}: the same run as {seen[key]} ({record['method']}, gamma {record['gamma']}, "
                                f"seed {record['seed']}); give each run's record once")
        seen[key] = path
        records.append(record)
    if not records:
        raise NoisyMLTError("no suspects records given")
    return records


def collect(records: list[dict], methods: list[str]) -> tuple[list[float], list[tuple[str, str]], dict]:
    """(noise rates, rows (method, scorer), values[(method, scorer, gamma, measure)] = the seeds' values)."""
    gammas = sorted({float(r["gamma"]) for r in records})
    values: dict[tuple, list] = {}
    chance: dict[tuple, dict] = {}  # (gamma, measure) -> seed -> share: one noisy set a (rate, seed), every method
    for record in sorted(records, key=lambda r: (r["method"], r["gamma"], r["seed"])):
        for scorer, rec in record["scorers"].items():
            for measure, value in rec["detection"].items():
                values.setdefault((record["method"], scorer, record["gamma"], measure), []).append(value)
        first = next(iter(record["scorers"].values()))["detection"]
        for measure in ("ap", "precision_at_wrong"):  # a ranking's; how much a flagger recalls is its own choice
            chance.setdefault((record["gamma"], measure), {})[record["seed"]] = first["wrong"] / first["entries"]
    for (gamma, measure), shares in chance.items():
        values[("chance", "", gamma, measure)] = list(shares.values())
    present = {r["method"] for r in records}
    order = [m for m in methods if m in present] + sorted(present - set(methods))
    rows = [(m, s) for m in order for s in SCORER_TITLES if any((m, s, g, "ap") in values for g in gammas)]
    return gammas, [*rows, ("chance", "")], values


def cell(values: dict, key: tuple) -> tuple[float, float | None] | None:
    got = [v for v in values.get(key, []) if v is not None]
    if not got:
        return None
    mean, ci = mean_ci(100 * np.asarray(got, dtype=float))
    return mean, ci


def write_tables(records: list[dict], out: Path, labels: dict[str, str], methods: list[str]) -> None:
    gammas, rows, values = collect(records, methods)
    datasets = sorted({r["dataset"] for r in records})
    models = sorted({r.get("noise_model", "paper") for r in records})
    title = (f"Finding the wrong training labels ({', '.join(dataset_title(d) for d in datasets)}; noise model "
             f"{', '.join(noise_title(m) for m in models)}): per method and scorer, AP = the average precision of its ranking of every "
             "(image, class) label, P@n = its precision among the n most suspect, n the number of wrong labels "
             "(= its recall there), R = the recall of the labels it flags as wrong; %, mean ± 95% CI over seeds")
    header = ["Method", "Scorer", *(f"{short} γ={g:g}" for short in MEASURES.values() for g in gammas)]

    def text(method: str, scorer: str, gamma: float, measure: str, pm: str) -> str:
        got = cell(values, (method, scorer, gamma, measure))
        return "--" if got is None else cell_text(*got, pm=pm)

    md = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    caption = title.replace("%", "\\%").replace("±", "$\\pm$").replace("γ", "$\\gamma$")
    tex = ["\\begin{table}[t]", "\\centering", f"\\caption{{{caption}}}",
           "\\begin{tabular}{ll" + "c" * (len(header) - 2) + "}", "\\toprule",
           " & ".join(["Method", "Scorer", *(f"{short.replace('n', '$n$')} $\\gamma={g:g}$"
                                             for short in MEASURES.values() for g in gammas)]) + " \\\\", "\\midrule"]
    for method, scorer in rows:
        name = "chance" if method == "chance" else labels.get(method, method)
        shown = SCORER_TITLES.get(scorer, "")
        cells = [text(method, scorer, g, m, " ± ") for m in MEASURES for g in gammas]
        md.append("| " + " | ".join([name, shown, *cells]) + " |")
        tex_cells = [text(method, scorer, g, m, " $\\pm$ ") for m in MEASURES for g in gammas]
        tex.append(" & ".join([name.replace("_", "\\_"), shown, *tex_cells]) + " \\\\")
    tex += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
    out.parent.mkdir(parents=True, exist_ok=True)
    measures = tuple(dict.fromkeys((*MEASURES, "flag_precision", "flagged", "wrong", "entries")))
    with contextlib.ExitStack() as whole:  # the three files reach their names together, once all are whole
        tex_tmp, md_tmp, csv_tmp = (whole.enter_context(replacing(out.with_suffix(suffix)))
                                    for suffix in (".tex", ".md", ".csv"))
        tex_tmp.write_text("\n".join(tex) + "\n")
        md_tmp.write_text("\n".join(md) + "\n")
        _write_csv(csv_tmp, rows, gammas, values, measures)


def _write_csv(path: Path, rows, gammas, values, measures) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", "scorer", "gamma", "measure", "mean", "ci95", "seeds"])
        for method, scorer in rows:
            for gamma in gammas:
                for measure in measures:
                    got = [v for v in values.get((method, scorer, gamma, measure), []) if v is not None]
                    if got:
                        mean, ci = mean_ci(np.asarray(got, dtype=float))
                        writer.writerow([method, scorer, gamma, measure, f"{mean:.6g}",
                                         "" if ci is None else f"{ci:.6g}", len(got)])


def _cmd_detection(args: argparse.Namespace) -> int:
    from noisymlt.core.files import check_outputs

    out = Path(args.out)
    if out.suffix != ".tex":
        raise NoisyMLTError(f"--out {out}: a .tex file (its .md and .csv are written beside it)")
    check_outputs({f"--records {path}": path for path in args.records},
                  {f"--out's {suffix}": out.with_suffix(suffix) for suffix in (".tex", ".md", ".csv")})
    try:
        labels = json.loads(args.labels) if args.labels else {}
    except ValueError as exc:
        raise NoisyMLTError(f"--labels {args.labels[:80]}: not JSON ({cause(exc)})") from None
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise NoisyMLTError(f"--labels {args.labels[:80]}: each method's display name must be text")
    write_tables(read_records(args.records), out, labels, args.methods or [])
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser("detection-table", help="how well each method's suspect-label ranking finds the wrong labels",
                       description="From `noisymlt suspects --clean-labels` records: the average precision of each "
                                   "ranking and its precision at n wrong labels, per method, scorer and noise rate, "
                                   "mean +- 95%% CI over seeds. Writes OUT (.tex), OUT with .md and .csv.")
    p.add_argument("--records", required=True, nargs="+", help="the .json records of `noisymlt suspects`")
    p.add_argument("--out", required=True, help="LaTeX file to write")
    p.add_argument("--methods", nargs="*", help="row order (default: by name)")
    p.add_argument("--labels", help='method display names as JSON, e.g. \'{"erm": "ERM"}\'')
    p.set_defaults(func=_cmd_detection)
