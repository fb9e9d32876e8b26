"""`noisymlt suspects`: the training labels a finished run disputes, ranked, and how well each ranking finds the
labels that are really wrong where the clean ones are known (the benchmark's).

Every (training image, class) entry gets a score from each scorer that applies to the run, higher = more likely
wrong, and a flag, the scorer's own decision that the given label is wrong. The images are scored with the run's
test-time transform and final weights, in one pass of the run's predict loop (``Trainer.predict``):

- ``model`` (every method): the reported head's probability p against the given label y, ``|y - p|``; flagged
  where the prediction at 0.5 contradicts the label (score > 0.5).
- the method's own scorers, as it owns its loss (``Method.score_labels``, from the outputs of its
  ``predict_for_scoring`` in the same pass): a method that corrects its labels while training ranks them by that
  correction (docs/use-a-trained-model.md lists them). A scorer that can flag only some entries says which
  (``reach``); the record then says how many wrong labels lie there and what share of them it flags.
- ``cleanlab`` (every method, on the same probabilities as ``model``): cleanlab's multi-label label-quality score
  per class (``get_label_quality_scores_per_class``, its default self-confidence), score = 1 - quality, and its
  flags from confident learning (``find_multilabel_issues_per_class``, prune_by_noise_rate). Self-confidence of a
  binary label is p for a given 1 and 1 - p for a given 0, so this ranking is ``model``'s; confident learning's
  per-class thresholds make the flags differ. cleanlab asks for out-of-sample probabilities (a model that never
  trained on the image); the run's own are in-sample, which makes a fitted label look right.
- ``model_oos`` and ``cleanlab_oos`` (with ``--out-of-sample``): the same two on cross-fitted probabilities
  (noisymlt.pipeline.crossfit), as cleanlab asks, and cleanlab's per-image label quality score
  (``get_label_quality_scores``) as the table's ``image_quality``.

Writes OUT (.csv): image, class, the given label, each scorer's score, rank (1 = most suspect of all entries) and
flag, and, with ``--clean-labels``, ``wrong`` (the given label differs from the clean one); a row for every entry
some scorer flags, in the order of the run's natural scorer (the method's own first, else model). And OUT's
``.json``: the run, per scorer what it is and how many it flags, and with the clean labels how well it finds the
wrong ones (``detection``, noisymlt.inference.suspects.detection): precision at the number of wrong labels (the
top-n entries, ties by image and class order; equal to the recall there) and at a budget (the top 1% of the
entries), precision and recall of its flags, the average precision of its ranking, and the recalls of the top n
and of the flags for the positives the noise added and those it dropped, and for head, medium and tail classes.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path

import numpy as np

from noisymlt.data.noise_models import PAPER
from noisymlt.errors import NoisyMLTError
from noisymlt.evaluation.label_scores import LabelScores

log = logging.getLogger(__name__)
GENERIC = ("model", "cleanlab", "model_oos", "cleanlab_oos")  # not a method's own: those order its table
# cleanlab's self-confidence ranks a binary label as the prediction does (p for a given 1, 1 - p for a given 0)
SAME_RANKING = {"cleanlab": "model", "cleanlab_oos": "model_oos"}


def model_scores(noisy: np.ndarray, probs: np.ndarray) -> LabelScores:
    score = np.abs(noisy - probs)
    return LabelScores("its prediction", "|given - p|, p the reported head's probability; flagged where it exceeds "
                       "0.5", score, score > 0.5)


def cleanlab_scores(noisy: np.ndarray, probs: np.ndarray) -> LabelScores:
    from cleanlab.multilabel_classification.filter import find_multilabel_issues_per_class
    from cleanlab.multilabel_classification.rank import get_label_quality_scores_per_class

    labels = [list(np.flatnonzero(row > 0.5)) for row in noisy]
    probs = np.clip(probs.astype(np.float64), 0.0, 1.0)
    with warnings.catch_warnings(record=True) as said:  # e.g. a class with too few examples: logged once
        warnings.simplefilter("always")
        quality = np.asarray(get_label_quality_scores_per_class(labels, probs))
        # one process: cleanlab's default pool of every core took 1.2 s a toy run, one process 0.02 s
        issues = np.asarray(find_multilabel_issues_per_class(labels, probs, low_memory=False, n_jobs=1))
    for warning in {str(w.message) for w in said}:
        log.info("cleanlab: %s", warning)
    if quality.shape != noisy.shape or issues.shape != noisy.shape:
        raise NoisyMLTError(f"cleanlab returned shapes {quality.shape} and {issues.shape} for {noisy.shape} labels")
    return LabelScores("cleanlab", "1 - cleanlab's per-class label quality (self-confidence) on the model's "
                       "probabilities; flagged by confident learning (find_multilabel_issues_per_class, "
                       "prune_by_noise_rate)", 1.0 - quality, issues.astype(bool))


def out_of_sample_scores(noisy: np.ndarray, probs: np.ndarray) -> dict[str, LabelScores]:
    """The prediction's and cleanlab's scorers on out-of-sample probabilities (cross-fitting's,
    noisymlt.pipeline.crossfit), as cleanlab's docs ask for them."""
    model, cleanlab = model_scores(noisy, probs), cleanlab_scores(noisy, probs)
    return {"model_oos": LabelScores("its prediction, out of sample", "|given - p|, p the probability of the "
                                     "cross-fitted run that held the image out; flagged where it exceeds 0.5",
                                     model.score, model.flagged),
            "cleanlab_oos": LabelScores("cleanlab, out of sample", "1 - cleanlab's per-class label quality "
                                        "(self-confidence) on the cross-fitted probabilities; flagged by confident "
                                        "learning (find_multilabel_issues_per_class, prune_by_noise_rate)",
                                        cleanlab.score, cleanlab.flagged)}


def image_quality(noisy: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """cleanlab's label quality score of each image (``multilabel_classification.get_label_quality_scores``, its
    defaults: self-confidence per class, aggregated by an exponential moving average), lower = more suspect."""
    from cleanlab.multilabel_classification.rank import get_label_quality_scores

    labels = [list(np.flatnonzero(row > 0.5)) for row in noisy]
    return np.asarray(get_label_quality_scores(labels, np.clip(probs.astype(np.float64), 0.0, 1.0)))


def read_out_of_sample(path: Path, table) -> tuple[np.ndarray, int]:
    """The probabilities of `noisymlt crossfit gather` in the rows and classes of ``table`` (the run's training
    labels) and the number of folds they came from, or one line saying why they are not that table's."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            ids, classes, probs = [str(i) for i in npz["image_ids"]], [str(c) for c in npz["classes"]], npz["probs"]
            folds = len(npz["runs"])
    except (OSError, KeyError, ValueError) as exc:
        raise NoisyMLTError(f"{path}: not out-of-sample probabilities of `noisymlt crossfit gather` ({exc})") from None
    if classes != [str(c) for c in table.classes]:
        raise NoisyMLTError(f"{path}: its classes are not the run's")
    where = {image: k for k, image in enumerate(ids)}
    missing = [str(i) for i in table.image_ids if str(i) not in where]
    if missing:
        raise NoisyMLTError(f"{path}: no probabilities of {len(missing)} training image(s) of the run, e.g. "
                            f"{missing[0]!r}")
    return probs[[where[str(i)] for i in table.image_ids]].astype(np.float64), folds


# The labels a person would check by hand: the top 1% of a run's (image, class) entries by a scorer's ranking
BUDGET_SHARE = 0.01


def detection(score: np.ndarray, flagged: np.ndarray, wrong: np.ndarray, given: np.ndarray | None = None,
              groups: dict[str, list[int]] | None = None, reach: np.ndarray | None = None) -> dict:
    """How well a ranking and its flags find the wrong labels (``wrong``: given != clean), over every entry: the
    precision of its top n (n the wrong entries) and of its top k (k the budget, ``BUDGET_SHARE`` of the entries),
    its flags' precision and recall, its average precision. With ``given`` (the given labels), the same recalls for
    the positives the noise added (given 1, clean 0) and those it dropped (given 0, clean 1); with ``groups`` (class
    indices by head / medium / tail), for the wrong entries of each group's classes; with ``reach`` (the entries the
    scorer can flag at all), for the wrong entries within it: ``KIND_wrong``, ``KIND_recall_at_n`` (the share of them
    among the top n) and ``KIND_flag_recall``."""
    from noisymlt.evaluation.metrics import average_precision

    s, f, w = score.reshape(-1), flagged.reshape(-1), wrong.reshape(-1).astype(bool)
    n = int(w.sum())
    budget = max(1, int(np.ceil(BUDGET_SHARE * w.size)))
    out = {"wrong": n, "entries": int(w.size), "flagged": int(f.sum()), "budget": budget}
    if n == 0:
        return {**out, "precision_at_wrong": None, "flag_precision": None, "flag_recall": None, "ap": None,
                "precision_at_budget": None}
    order = np.argsort(-s, kind="stable")
    top = np.zeros(w.size, bool)
    top[order[:n]] = True
    out.update(precision_at_wrong=float(w[top].mean()), flag_precision=float(w[f].mean()) if f.any() else None,
               flag_recall=float((w & f).sum() / n), ap=average_precision(w, s),
               precision_at_budget=float(w[order[:budget]].mean()))
    kinds: dict[str, np.ndarray] = {}
    if given is not None:
        g = np.asarray(given).reshape(-1) > 0.5
        kinds.update(added=w & g, dropped=w & ~g)
    if groups is not None:
        column = np.tile(np.arange(wrong.shape[1]), wrong.shape[0])
        kinds.update({name: w & np.isin(column, classes) for name, classes in groups.items()})
    if reach is not None:
        kinds["reach"] = w & np.asarray(reach).reshape(-1)
    for kind, members in kinds.items():
        count = int(members.sum())
        out[f"{kind}_wrong"] = count
        out[f"{kind}_recall_at_n"] = float((members & top).sum() / count) if count else None
        out[f"{kind}_flag_recall"] = float((members & f).sum() / count) if count else None
    return out


def ranks(score: np.ndarray) -> np.ndarray:
    """1 for the highest score, ties by entry order (image, then class)."""
    order = np.argsort(-score.reshape(-1), kind="stable")
    out = np.empty(order.size, dtype=np.int64)
    out[order] = np.arange(1, order.size + 1)
    return out.reshape(score.shape)


def suspicion(trainer, out_of_sample: np.ndarray | None = None) -> dict[str, LabelScores]:
    """Every scorer that applies to the run (see the module docstring), in the table's order: the model's, the
    method's own, cleanlab's, and with ``out_of_sample`` (cross-fitted probabilities in the run's rows) the model's
    and cleanlab's on those."""
    from noisymlt.inference.run_model import recorded_heads

    noisy = np.asarray(trainer.train_table.labels, dtype=np.float64)
    method = trainer.method
    outputs = trainer.predict(part="train", forward=method.predict_for_scoring)
    probs = outputs[recorded_heads(trainer.out)[0]].astype(np.float64)
    own = method.score_labels(trainer.model, noisy, outputs)
    clash = set(own) & set(GENERIC)
    if clash:
        raise NoisyMLTError(f"method {trainer.cfg['method']!r}: its label scorer {sorted(clash)[0]!r} takes the name "
                            "of a scorer every run has")
    out = {"model": model_scores(noisy, probs), **own, "cleanlab": cleanlab_scores(noisy, probs)}
    if out_of_sample is not None:
        out.update(out_of_sample_scores(noisy, out_of_sample))
    return out


def write_suspects(out: Path, trainer, scored: dict, wrong: np.ndarray | None,
                   quality: np.ndarray | None = None) -> None:
    """The table of flagged entries at OUT (the caller's temporary name)."""
    import csv

    table = trainer.train_table
    noisy = np.asarray(table.labels) > 0.5
    natural = next((name for name in scored if name not in GENERIC), "model")
    rank = {name: ranks(scorer.score) for name, scorer in scored.items()}
    any_flag = np.any([scorer.flagged for scorer in scored.values()], axis=0)
    rows, cols = np.nonzero(any_flag)
    order = np.argsort(rank[natural][rows, cols], kind="stable")
    header = ["image", "class", "given", *(f"{n}_{k}" for n in scored for k in ("score", "rank", "flagged"))]
    if quality is not None:
        header.append("image_quality")
    if wrong is not None:
        header.append("wrong")
    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for r, c in zip(rows[order], cols[order]):
            cells = [table.image_ids[r], table.classes[c], int(noisy[r, c])]
            for name, scorer in scored.items():
                cells += [format(float(scorer.score[r, c]), ".6g"), int(rank[name][r, c]), int(scorer.flagged[r, c])]
            if quality is not None:
                cells.append(format(float(quality[r]), ".6g"))
            if wrong is not None:
                cells.append(int(wrong[r, c]))
            writer.writerow(cells)


def clean_truth(trainer, clean_labels: Path) -> np.ndarray:
    """(N, C) where the run's given training label differs from the clean one, row by row by image id."""
    from noisymlt.data.labels import read_labels
    from noisymlt.data.parts import clean_rows

    table = trainer.train_table
    return (clean_rows(read_labels(clean_labels), clean_labels, table) > 0.5) != (np.asarray(table.labels) > 0.5)


def suspects_of_run(run: Path, out: Path, *, clean_labels: Path | None = None, device: str = "cpu",
                    train_images: Path | None = None, out_of_sample: Path | None = None) -> dict:
    import contextlib

    from noisymlt.core.files import replacing, write_json
    from noisymlt.data.labels import GROUPS
    from noisymlt.inference.run_model import load_run

    from noisymlt.evaluation.metrics import average_precision

    trainer = load_run(run, device=device, train_images=train_images)
    noisy = np.asarray(trainer.train_table.labels, dtype=np.float64)
    oos, folds = read_out_of_sample(out_of_sample, trainer.train_table) if out_of_sample else (None, None)
    scored = suspicion(trainer, oos)
    quality = image_quality(noisy, oos) if oos is not None else None
    wrong = clean_truth(trainer, clean_labels) if clean_labels else None
    record = {"run": str(run), "run_id": trainer.run_id, "method": trainer.cfg["method"],
              "dataset": trainer.cfg["dataset"], "gamma": float(trainer.cfg["gamma"]), "seed": int(trainer.cfg["seed"]),
              "noise_model": (trainer.cfg.get("noise") or {}).get("model", PAPER),  # the paper's: not in the config
              "checkpoint_sha256": trainer.checkpoint_sha256, "table": out.name, "scorers": {}}
    for name, scorer in scored.items():
        rec = {"title": scorer.title, "how": scorer.how, "flagged": int(scorer.flagged.sum())}
        if name in SAME_RANKING:
            rec["same_ranking_as"] = SAME_RANKING[name]
        if wrong is not None:
            rec["detection"] = detection(scorer.score, scorer.flagged, wrong, given=trainer.train_table.labels,
                                         groups={g: trainer.split[g] for g in GROUPS}, reach=scorer.reach)
        record["scorers"][name] = rec
    if quality is not None:  # cleanlab's per-image score: how well it ranks the images that hold a wrong label
        image = record["scorers"]["cleanlab_oos"]
        image["image_quality"] = "cleanlab's get_label_quality_scores per image (table column image_quality)"
        if wrong is not None:
            any_wrong = wrong.any(1)
            image["image_detection"] = {"images": int(len(any_wrong)), "with_wrong": int(any_wrong.sum()),
                                        "ap": average_precision(any_wrong, 1.0 - quality) if any_wrong.any()
                                        else None}
    if wrong is not None:
        record["clean_labels"] = str(clean_labels)
    if out_of_sample:
        record["out_of_sample"] = str(out_of_sample)
        record["out_of_sample_folds"] = folds
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as whole:  # both files reach their names together, once both are whole
        record_tmp = whole.enter_context(replacing(out.with_suffix(".json")))
        write_suspects(whole.enter_context(replacing(out)), trainer, scored, wrong, quality)
        write_json(record_tmp, record)
    return record


def _cmd_suspects(args: argparse.Namespace) -> int:
    from noisymlt.inference.run_model import check_run_outputs

    if len(args.run) != len(args.out):
        raise NoisyMLTError(f"{len(args.run)} --run but {len(args.out)} --out: one table a run")
    oos = args.out_of_sample or [None] * len(args.run)
    if len(oos) != len(args.run):
        raise NoisyMLTError(f"{len(args.run)} --run but {len(oos)} --out-of-sample: one file a run, in order")
    outs = [Path(out) for out in args.out]
    for out in outs:  # every output checked before the first run is scored
        if out.suffix != ".csv":
            raise NoisyMLTError(f"--out {out}: a .csv file")
    written = {}
    for out in outs:
        written[f"--out {out}"] = out
        written[f"the record of {out}"] = out.with_suffix(".json")
    for run in args.run:
        check_run_outputs(Path(run), {"--clean-labels": args.clean_labels,
                                      **{f"--out-of-sample {p}": p for p in oos if p}}, written)
    for run, out, probs in zip(args.run, outs, oos):
        record = suspects_of_run(Path(run), out, clean_labels=Path(args.clean_labels) if args.clean_labels else None,
                                 device=args.device, train_images=args.train_images,
                                 out_of_sample=Path(probs) if probs else None)
        flagged = ", ".join(f"{name} {rec['flagged']}" for name, rec in record["scorers"].items())
        print(f"{run}: flagged {flagged}: {out}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "suspects", help="the training labels a finished run disputes, ranked, and how well it finds wrong ones",
        description="Score every (training image, class) label of a finished run by how likely it is wrong: the "
                    "model's own prediction, the method's own label correction where it has one, cleanlab's "
                    "multi-label ranking. Writes a table of the flagged labels (image, class, given, score, rank) "
                    "and a .json record; with --clean-labels, how well each finds the wrong labels.")
    p.add_argument("--run", required=True, nargs="+", help="finished run folder(s)")
    p.add_argument("--out", required=True, nargs="+", help="the .csv table to write, one a run, in order")
    p.add_argument("--clean-labels", help="the clean labels of the same training images (the benchmark's clean "
                                          "subset), to measure the rankings against")
    p.add_argument("--train-images", help="the run's training image folder, for a run without the image cache")
    p.add_argument("--out-of-sample", nargs="+", metavar="NPZ",
                   help="cross-fitted probabilities of the run's training images (`noisymlt crossfit gather`), one "
                        "a run: adds the prediction's and cleanlab's scorers on them, as cleanlab asks")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.set_defaults(func=_cmd_suspects)
