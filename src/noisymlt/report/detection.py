"""`noisymlt detection-table`: how well each method's ranking of suspect labels finds the wrong ones, per noise rate.

From the records of `noisymlt suspects --clean-labels` (noisymlt.inference.suspects), one a run, two tables. The
first: rows = method x scorer (the model's own prediction, Ours' pseudo-label rule, DivideMix's label refinement,
cleanlab on the same probabilities), columns = noise rate in four blocks: AP, the average precision of the ranking
over every (training image, class) entry, the wrong labels being the positives; P@n, the precision among the n most
suspect entries, n the number of wrong labels (which equals the recall there); P@k, the precision among the k most
suspect, k the budget (the top 1% of the entries, noisymlt.inference.suspects.BUDGET_SHARE); R, the recall of the
entries the scorer flags as wrong. The second: per row and noise rate, the recall of the n most suspect among the
positives the noise added, those it dropped, and the wrong entries of head, medium and tail classes. The
cross-fitting's base method has two rows more, its prediction's and cleanlab's on out-of-sample probabilities
(noisymlt.pipeline.crossfit). With ``--cleaned``, a third: what each cleaning of the clean-then-retrain methods
changed (noisymlt.pipeline.cleaning), the share of it truly wrong and the share of the wrong labels it reached.

Cells are mean +- 95% CI over seeds (Student t), in percent. Every method trains on a seed's one noisy set, so each
row is paired by seed with the reference, ERM's prediction: a cell is marked where the 95% interval of the paired
differences excludes 0. cleanlab's self-confidence ranks as the prediction does, so its ranking cells equal the
prediction's by construction and are shown once. The row ``chance`` is a ranking that knows nothing: its precision
and the recall of its top n are the share of wrong entries. The CSV has every number with its n, each paired
difference, the flags' precision and the counts. Written as OUT (.tex), OUT with .md and .csv.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
from pathlib import Path

import numpy as np

from noisymlt.core.files import read_json, replacing
from noisymlt.errors import NoisyMLTError, cause
from noisymlt.data.noise_models import PAPER
from noisymlt.inference.suspects import BUDGET_SHARE
from noisymlt.report.style import dataset_title
from noisymlt.report.tables import cell_text, mean_ci, noise_title

MEASURES = {"ap": "AP", "precision_at_wrong": "P@n", "precision_at_budget": "P@k", "flag_recall": "R"}
KINDS = {f"{kind}_recall_at_n": kind for kind in ("added", "dropped", "head", "medium", "tail")}
RANKING = ("ap", "precision_at_wrong", "precision_at_budget", *KINDS)  # measures of a ranking alone, not of flags
CHANCE = ("ap", "precision_at_wrong", "precision_at_budget", *KINDS)  # a blind ranking's: the share of wrong labels
COUNTS = ("wrong", "entries", "flagged", "budget", *(f"{k}_wrong" for k in KINDS.values()), "reach_wrong")
ORDER = [*MEASURES, "flag_precision", *KINDS, *(f"{k}_flag_recall" for k in KINDS.values()), "reach_recall_at_n",
         "reach_flag_recall", *COUNTS]
REFERENCE = ("erm", "model")


DETECTION_NUMBERS = ("wrong", "entries", "flagged", "precision_at_wrong", "flag_precision", "flag_recall", "ap")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)


def _problem(record) -> str | None:
    """What keeps a parsed file from being a suspects record with detection numbers (None: nothing)."""
    if not isinstance(record, dict):
        kind = {list: "a list", str: "a string", bool: "true or false", type(None): "null"}.get(type(record),
                                                                                             "a number")
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
        if not isinstance(rec, dict) or not isinstance(rec.get("title"), str):
            return f"scorer {scorer!r} has no 'title' text; rerun `noisymlt suspects` to write a current record"
        numbers = rec.get("detection")
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
        record = read_json(path, "a suspects record")
        problem = _problem(record)
        if problem:
            raise NoisyMLTError(f"{path}: {problem}")
        key = (record["method"], record["dataset"], float(record["gamma"]), record["seed"],
               record.get("noise_model", PAPER))
        if key in seen:
            raise NoisyMLTError(f"{path}: the same run as {seen[key]} ({record['method']}, gamma {record['gamma']}, "
                                f"seed {record['seed']}); give each run's record once")
        seen[key] = path
        records.append(record)
    if not records:
        raise NoisyMLTError("no suspects records given")
    return records


def level_of(record: dict) -> tuple[str, float]:
    """A record's noisy level, a column of the tables: (noise model, rate)."""
    return record.get("noise_model", PAPER), float(record["gamma"])


def collect(records: list[dict], methods: list[str]) -> tuple[list[tuple], list[tuple[str, str]], dict]:
    """(levels (noise model, rate), rows (method, scorer), values[(method, scorer, level, measure)] = {seed:
    value})."""
    levels = sorted({level_of(r) for r in records})
    values: dict[tuple, dict] = {}
    for record in sorted(records, key=lambda r: (r["method"], *level_of(r), r["seed"])):
        for scorer, rec in record["scorers"].items():
            for measure, value in rec["detection"].items():
                values.setdefault((record["method"], scorer, level_of(record), measure), {})[record["seed"]] = value
        # chance: a ranking that knows nothing; one noisy set a (rate, seed), whichever method's record says it
        first = next(iter(record["scorers"].values()))["detection"]
        share = first["wrong"] / first["entries"]
        for measure in CHANCE:
            values.setdefault(("chance", "", level_of(record), measure), {})[record["seed"]] = share
    scorers: dict[str, dict] = {}  # a method's scorers in its records' order: the model's, its own, cleanlab's
    for record in records:
        scorers.setdefault(record["method"], {}).update(dict.fromkeys(record["scorers"]))
    order = [m for m in methods if m in scorers] + sorted(set(scorers) - set(methods))
    rows = [(m, s) for m in order for s in scorers[m] if any((m, s, g, "ap") in values for g in levels)]
    return levels, [*rows, ("chance", "")], values


CLEANING_TITLES = {"cleanlab/drop": "cleanlab's flags, dropped", "cleanlab/flip": "cleanlab's flags, flipped",
                   "model/drop": "the prediction's flags, dropped", "model/flip": "the prediction's flags, flipped",
                   "oracle/drop": "the wrong labels, dropped (oracle)", "oracle/flip": "the wrong labels, flipped "
                   "(oracle)"}
CLEANING = {"changed": "changed", "precision": "truly wrong", "recall": "of the wrong", "added_recall": "added",
            "dropped_recall": "dropped"}


def cleaning_values(paths: list[str], clean_labels: str) -> dict:
    """What each cleaning (a `noisymlt clean-labels` record and the table beside it) changed, against the clean
    labels: values[("clean:FLAGS/ACTION", "", level, measure)] = {seed: value}, the measures of CLEANING: the
    entries changed, the share of them truly wrong (precision), the share of the wrong ones changed (recall), and
    that recall among the positives the noise added and those it dropped."""
    from noisymlt.data.labels import read_labels
    from noisymlt.data.parts import clean_rows

    clean = read_labels(clean_labels)
    values: dict[tuple, dict] = {}
    for path in paths:
        record = read_json(path, "a clean-labels record", require_object=True)
        missing = [k for k in ("inputs", "flags", "action", "gamma", "seed") if k not in record]
        if missing or "noisy" not in record["inputs"]:
            raise NoisyMLTError(f"{path}: no {', '.join(map(repr, missing or ['inputs.noisy']))}: not a record of "
                                "`noisymlt clean-labels`")
        cleaned = read_labels(Path(path).with_suffix(".parquet"))
        noisy_path = record["inputs"]["noisy"]["path"]
        noisy = read_labels(noisy_path, noisy_only=True)
        if cleaned.image_ids != noisy.image_ids:
            raise NoisyMLTError(f"{path}: its table's images are not those of {noisy_path}")
        given = np.asarray(noisy.labels) > 0.5
        wrong = given != (clean_rows(clean, clean_labels, noisy) > 0.5)
        changed = (cleaned.ignored > 0) if record["action"] == "drop" else (np.asarray(cleaned.labels) > 0.5) != given
        numbers = {"changed": int(changed.sum()),
                   "precision": float(wrong[changed].mean()) if changed.any() else None,
                   "recall": float((changed & wrong).sum() / wrong.sum()) if wrong.any() else None}
        for kind, members in (("added", wrong & given), ("dropped", wrong & ~given)):
            numbers[f"{kind}_recall"] = float((changed & members).sum() / members.sum()) if members.any() else None
        row = (f"clean:{record['flags']}/{record['action']}", "",
               (record.get("noise_model", PAPER), float(record["gamma"])))
        for measure, value in numbers.items():
            values.setdefault((*row, measure), {})[record["seed"]] = value
    return values


def reference_of(rows: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The row every other is paired against: ERM's in-sample prediction, when ERM is among the records."""
    return REFERENCE if REFERENCE in rows else None


def summary(values: dict, key: tuple, reference: tuple[str, str] | None) -> dict | None:
    """Mean and 95% CI over seeds of one cell (in %), and, paired by seed (the same noisy set) against the
    reference row, the mean and 95% CI of the differences and whether that interval excludes 0."""
    seeds = {s: v for s, v in values.get(key, {}).items() if v is not None}
    if not seeds:
        return None
    mean, ci = mean_ci(100 * np.asarray(list(seeds.values()), dtype=float))
    out = {"mean": mean, "ci": ci, "seeds": len(seeds), "delta": None, "delta_ci": None, "paired": 0,
           "decided": False}
    if reference is not None and key[:2] != reference:
        ref = values.get((*reference, *key[2:]), {})
        diffs = [100 * (v - ref[s]) for s, v in seeds.items() if ref.get(s) is not None]
        if diffs:
            out["delta"], out["delta_ci"] = mean_ci(np.asarray(diffs, dtype=float))
            out["paired"] = len(diffs)
            out["decided"] = out["delta_ci"] is not None and abs(out["delta"]) > out["delta_ci"]
    return out


def same_ranking(values: dict, twins: dict[str, str], method: str, scorer: str, gamma: float, measure: str) -> bool:
    """A scorer whose record says it ranks as another does (cleanlab's self-confidence as the prediction it reads:
    ``same_ranking_as``): its ranking measures, equal to that scorer's, are shown once."""
    twin = twins.get(scorer)
    if twin is None or measure not in RANKING:
        return False
    own, other = values.get((method, scorer, gamma, measure)), values.get((method, twin, gamma, measure))
    return own is not None and own == other


def write_tables(records: list[dict], out: Path, labels: dict[str, str], methods: list[str],
                 cleaned: dict | None = None) -> None:
    """The tables (module docstring); ``cleaned``: cleaning_values, a third table of what each cleaning changed."""
    levels, rows, values = collect(records, methods)
    cleaned = cleaned or {}
    cleanings = list(dict.fromkeys(key[:2] for key in cleaned))
    titles = {scorer: rec["title"] for record in records for scorer, rec in record["scorers"].items()}
    twins = {scorer: rec["same_ranking_as"] for record in records for scorer, rec in record["scorers"].items()
             if rec.get("same_ranking_as")}
    reference = reference_of(rows)
    datasets = sorted({r["dataset"] for r in records})
    models = sorted({r.get("noise_model", PAPER) for r in records})

    def level_text(level):  # a column's noisy level: its rate, and its noise model where the table has several
        return f"γ={level[1]:g}" if len(models) == 1 else f"{noise_title(level[0])} γ={level[1]:g}"

    budgets = sorted({rec["detection"].get("budget") for r in records for rec in r["scorers"].values()} - {None})
    where = (f"{', '.join(dataset_title(d) for d in datasets)}; noise model "
             f"{', '.join(noise_title(m) for m in models)}")
    title = (f"Finding the wrong training labels ({where}): per method and scorer, AP = the average precision of its "
             "ranking of every (image, class) label, P@n = its precision among the n most suspect, n the number of "
             "wrong labels (= its recall there), P@k = its precision among the k most suspect, k the budget of a "
             f"person checking the top {100 * BUDGET_SHARE:g}% of the labels (k = {', '.join(map(str, budgets))}), "
             "R = the recall of the labels it flags as wrong; %, mean ± 95% CI over seeds")
    kinds_title = (f"Which wrong labels the n most suspect catch ({where}): recall among the positives the noise "
                   "added (given 1, clean 0) and those it dropped (given 0, clean 1), and among the wrong labels of "
                   "head, medium and tail classes; %, mean ± 95% CI over seeds")
    note = ("Each scorer is paired by seed with "
            + ("ERM's prediction (the reference; the same noisy set a seed): ↑ / ↓ where the 95% interval of the "
               "paired difference lies above / below 0 (the CSV has every difference). " if reference else
               "no reference (ERM is not among the records: nothing is paired). ")
            + "cleanlab ranks a binary label by self-confidence, p or 1 - p, as the prediction does: its AP, P@n and "
              "P@k equal the prediction's by construction and are shown once (=); its flags (confident learning) "
              "differ. chance: a ranking that knows nothing, whose precision and recall of the top n are the share "
              "of wrong labels.")
    folds = sorted({r["out_of_sample_folds"] for r in records if r.get("out_of_sample_folds")})
    if folds:
        note += (f" Rows 'out of sample': the same scorers on cross-fitted probabilities, as cleanlab asks for them "
                 f"(K = {', '.join(map(str, folds))} folds: each training image predicted by a run of the method "
                 "trained on the other folds, never on its label).")

    reach = []  # what the pseudo-label rule can change at all, and how much of it it flags
    for method, scorer in rows:
        for g in levels:
            can, wrong = values.get((method, scorer, g, "reach_wrong")), values.get((method, scorer, g, "wrong"))
            if can and wrong:
                share = 100 * np.mean([can[s] / wrong[s] for s in can if wrong.get(s)])
                found = [v for v in values.get((method, scorer, g, "reach_flag_recall"), {}).values() if v is not None]
                reach.append(f"{labels.get(method, method)} at {level_text(g)}: {share:.1f}% of the wrong labels, of "
                             f"which it flags {100 * np.mean(found):.1f}%" if found else
                             f"{labels.get(method, method)} at {level_text(g)}: {share:.1f}% of the wrong labels")
    if reach:
        note += (" The pseudo-label rule can change only the labels its thresholds reach (a given 0 in a class whose "
                 "alpha is on, a given 1 in a class whose beta is on; [CL]'s thresholds: alpha for head classes, beta "
                 "for tail ones), so its R counts wrong labels it could never flag. Within its reach, mean over seeds: "
                 + "; ".join(reach) + ".")

    cleaning_title = (f"What each cleaning changed ({where}): the labels it dropped or flipped (count), the share of "
                      "them truly wrong, the share of the wrong labels it changed, and that share among the positives "
                      "the noise added and those it dropped; %, mean ± 95% CI over seeds")
    cleaning_note = ("A cleaning is the training table of the clean-then-retrain methods (noisymlt clean-labels): "
                     "cleanlab flags on cross-fitted probabilities; the oracle changes exactly the wrong labels "
                     "(it reads the clean ones).")

    def text(method, scorer, gamma, measure, style):
        if same_ranking(values, twins, method, scorer, gamma, measure):
            return "="
        if method.startswith("clean:"):  # a cleaning's: counts as they are, shares in %, nothing paired
            got = summary(cleaned, (method, scorer, gamma, measure), None)
            if got is None:
                return "--"
            mean, ci = (got["mean"] / 100, got["ci"] and got["ci"] / 100) if measure == "changed" else (got["mean"],
                                                                                                       got["ci"])
            return cell_text(mean, ci, " $\\pm$ " if style == "tex" else " ± ")
        got = summary(values, (method, scorer, gamma, measure), reference)
        if got is None:
            return "--"
        shown = cell_text(got["mean"], got["ci"], " $\\pm$ " if style == "tex" else " ± ")
        if got["decided"]:
            up = got["delta"] > 0
            shown += ("$^\\uparrow$" if up else "$^\\downarrow$") if style == "tex" else (" ↑" if up else " ↓")
        return shown

    def block(heading, measures, by_gamma_rows, style, block_rows=None):
        cols = ["Method", "Scorer", *([] if by_gamma_rows else ["γ"] if len(models) == 1 else ["noise, γ"]), *heading]
        lines = []
        for method, scorer in block_rows or rows:
            name = "chance" if method == "chance" else labels.get(method, method)
            shown = titles.get(scorer, "")
            if method.startswith("clean:"):
                name, shown = "cleaning", CLEANING_TITLES.get(method.removeprefix("clean:"), method)
            if style == "tex":
                name = name.replace("_", "\\_")
            if by_gamma_rows:
                lines.append([name, shown, *(text(method, scorer, g, m, style) for m in measures for g in levels)])
            else:
                for g in levels:
                    lines.append([name, shown, level_text(g).removeprefix("γ="),
                                  *(text(method, scorer, g, m, style) for m in measures)])
        return cols, lines

    main_head = [f"{short} {level_text(g)}" for short in MEASURES.values() for g in levels]
    kinds_head = list(KINDS.values())
    md = []
    tex = []
    blocks = [(main_head, title, MEASURES, True, rows, note), (kinds_head, kinds_title, KINDS, False, rows, note)]
    if cleanings:
        blocks.append((list(CLEANING.values()), cleaning_title, CLEANING, False, cleanings, cleaning_note))
    for heading, caption, measures, wide, block_rows, under in blocks:
        cols, lines = block(heading, measures, wide, "md", block_rows)
        md += [f"**{caption}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
               *("| " + " | ".join(line) + " |" for line in lines), "", under, ""]
        cols, lines = block(heading, measures, wide, "tex", block_rows)
        tex_cols = [c.replace("γ", "$\\gamma$").replace("P@n", "P@$n$").replace("P@k", "P@$k$") for c in cols]
        tex_caption = (caption + " " + under).replace("%", "\\%").replace("±", "$\\pm$").replace("γ", "$\\gamma$") \
            .replace("↑", "$\\uparrow$").replace("↓", "$\\downarrow$")
        tex += ["\\begin{table}[t]", "\\centering", f"\\caption{{{tex_caption}}}",
                "\\begin{tabular}{" + "l" * (len(cols) - len(heading)) + "c" * len(heading) + "}", "\\toprule",
                " & ".join(tex_cols) + " \\\\", "\\midrule", *(" & ".join(line) + " \\\\" for line in lines),
                "\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    measures = sorted({m for (_, _, _, m) in values},
                      key=lambda m: (m not in ORDER, ORDER.index(m) if m in ORDER else m))
    with contextlib.ExitStack() as whole:  # the three files reach their names together, once all are whole
        tex_tmp, md_tmp, csv_tmp = (whole.enter_context(replacing(out.with_suffix(suffix)))
                                    for suffix in (".tex", ".md", ".csv"))
        tex_tmp.write_text("\n".join(tex))
        md_tmp.write_text("\n".join(md))
        _write_csv(csv_tmp, rows, levels, values, measures, reference)
        if cleanings:
            with open(csv_tmp, "a", newline="") as fh:
                _write_rows(csv.writer(fh), cleanings, sorted({k[2] for k in cleaned}), cleaned, list(CLEANING), None)


def _write_csv(path: Path, rows, levels, values, measures, reference) -> None:
    """Every number: per (method, scorer, rate, measure) the mean, its 95% CI and the seeds, in the record's unit
    (fractions, counts), and the paired difference from the reference row with its CI, its seeds and whether it is
    decided."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["method", "scorer", "noise_model", "gamma", "measure", "mean", "ci95", "seeds", "vs_reference",
                         "vs_reference_ci95", "paired_seeds", "decided"])
        _write_rows(writer, rows, levels, values, measures, reference)


def _write_rows(writer, rows, levels, values, measures, reference) -> None:
    for method, scorer in rows:
        for level in levels:
            for measure in measures:
                got = summary(values, (method, scorer, level, measure), reference)
                if got is None:
                    continue

                def num(x):  # summary's percent back to the record's own unit
                    return "" if x is None else f"{x / 100:.6g}"

                writer.writerow([method, scorer, *level, measure, num(got["mean"]), num(got["ci"]), got["seeds"],
                                 num(got["delta"]), num(got["delta_ci"]), got["paired"], int(got["decided"])])


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
    if bool(args.cleaned) != bool(args.clean_labels):
        raise NoisyMLTError("--cleaned and --clean-labels go together: the cleanings' records and the truth they are "
                            "measured against")
    cleaned = cleaning_values(args.cleaned, args.clean_labels) if args.cleaned else None
    write_tables(read_records(args.records), out, labels, args.methods or [], cleaned)
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
    p.add_argument("--cleaned", nargs="*", help="the .json records of `noisymlt clean-labels`: a table of what each "
                                                "cleaning changed")
    p.add_argument("--clean-labels", help="the clean labels the cleanings are measured against")
    p.set_defaults(func=_cmd_detection)
