"""`noisymlt suspects`: the training labels a finished run disputes, ranked, and how well each ranking finds the
labels that are really wrong where the clean ones are known (the benchmark's).

Every (training image, class) entry gets a score from each scorer that applies to the run, higher = more likely
wrong, and a flag, the scorer's own decision that the given label is wrong. The images are scored with the run's
test-time transform and final weights:

- ``model`` (every method): the reported head's probability p against the given label y, ``|y - p|``; flagged
  where the prediction at 0.5 contradicts the label (score > 0.5).
- ``pseudo_labels`` (Ours and the co-learning family, unless its pseudo labels are off): the rule Ours trains with
  (Eq. 3; noisymlt.methods.pseudo_labels), applied once with each trained branch's source branch: a given 0 becomes
  1 where the source's q > alpha, a given 1 becomes 0 where q < beta. The score is the larger margin past the
  threshold over the two branches' corrections (``q - alpha`` for a given 0, ``beta - q`` for a given 1); flagged
  where either correction changes the label (score > 0). As in a training step, but on unaugmented views with the
  final weights. It can change only the entries its thresholds reach (``pseudo_label_reach``: [CL]'s turn alpha on
  for head classes, beta for tail ones); the record says how many wrong labels those are and what share of them it
  flags (``reach_wrong``, ``reach_flag_recall``).
- ``dividemix`` (DivideMix): its label refinement, ``w y + (1 - w) p`` with w the image's clean probability from
  the co-divide (the GMM on the per-image losses of the other net, noisymlt.methods.dividemix) and p the net's own
  probability; the score is how far the refined label moves from the given one, ``(1 - w) |y - p|``, the mean over
  the two nets; flagged where it crosses 0.5.
- ``cleanlab`` (every method, on the same probabilities as ``model``): cleanlab's multi-label label-quality score
  per class (``get_label_quality_scores_per_class``, its default self-confidence), score = 1 - quality, and its
  flags from confident learning (``find_multilabel_issues_per_class``, prune_by_noise_rate). Self-confidence of a
  binary label is p for a given 1 and 1 - p for a given 0, so this ranking is ``model``'s; confident learning's
  per-class thresholds make the flags differ. cleanlab asks for out-of-sample probabilities (a model that never
  trained on the image); the run's own are in-sample, which makes a fitted label look right. Out-of-sample ones
  would take K trainings of every run (K-fold cross-fitting), K times the grid's training cost: not done here.

Writes OUT (.csv): image, class, the given label, each scorer's score, rank (1 = most suspect of all entries) and
flag, and, with ``--clean-labels``, ``wrong`` (the given label differs from the clean one); a row for every entry
some scorer flags, in the order of the run's natural scorer (pseudo_labels, dividemix, else model). And OUT's
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

log = logging.getLogger(__name__)
NATURAL = ("pseudo_labels", "dividemix", "model")  # the first a run has orders its table
HOW = {
    "model": "|given - p|, p the reported head's probability; flagged where it exceeds 0.5",
    "pseudo_labels": "the pseudo-label rule's larger margin past alpha (a given 0) or beta (a given 1) over the "
                     "two branches' corrections; flagged where either changes the label",
    "dividemix": "(1 - w) |given - p|, w the co-divide's clean probability of the image and p the net's own, mean "
                 "over the two nets; flagged where the refined label crosses 0.5",
    "cleanlab": "1 - cleanlab's per-class label quality (self-confidence) on the model's probabilities; flagged by "
                "confident learning (find_multilabel_issues_per_class, prune_by_noise_rate)",
}


def model_scores(noisy: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    score = np.abs(noisy - probs)
    return score, score > 0.5


def pseudo_label_scores(noisy: np.ndarray, corrections: list[tuple[np.ndarray, np.ndarray, np.ndarray]]):
    """``corrections``: (source probabilities q, alpha, beta) of each trained branch, alpha and beta per class."""
    margins = [np.where(noisy > 0.5, beta[None, :] - q, q - alpha[None, :]) for q, alpha, beta in corrections]
    score = np.max(margins, axis=0)
    return score, score > 0


def pseudo_label_reach(noisy: np.ndarray, corrections: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """The entries the pseudo-label rule can change at all: a given 0 in a class where some branch's alpha is on
    (below 1: q can pass it), a given 1 where some branch's beta is on (above 0). [CL]'s thresholds turn on alpha for
    head classes and beta for tail ones, so the rest of the wrong labels lie beyond its reach."""
    from noisymlt.methods.pseudo_labels import ALPHA_OFF, BETA_OFF

    can_set = np.any([alpha < ALPHA_OFF for _, alpha, _ in corrections], axis=0)
    can_clear = np.any([beta > BETA_OFF for _, _, beta in corrections], axis=0)
    return np.where(noisy > 0.5, can_clear[None, :], can_set[None, :])


def dividemix_scores(noisy: np.ndarray, nets: list[tuple[np.ndarray, np.ndarray]]):
    """``nets``: (clean probability w per image, the net's own probabilities p) of each net."""
    score = np.mean([(1 - w[:, None]) * np.abs(noisy - p) for w, p in nets], axis=0)
    return score, score > 0.5


def cleanlab_scores(noisy: np.ndarray, probs: np.ndarray):
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
    return 1.0 - quality, issues.astype(bool)


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


def train_probabilities(trainer) -> dict[str, object]:
    """What the scorers read, from one pass over the training images: the reported head's probabilities, and the
    branch probabilities (co-learning) or per-net probabilities and losses (DivideMix)."""
    import torch

    from noisymlt.inference.run_model import recorded_heads
    from noisymlt.methods.dividemix import NETS

    method, model = trainer.method, trainer.model
    family = trainer.cfg["method_cfg"]["family"]
    head = recorded_heads(trainer.out)[0]
    model.eval()
    out: dict[str, list] = {"probs": [], "branches": {}, "nets": {}}
    with torch.no_grad(), trainer.autocast():
        for _, images in trainer.iterate_train_eval():
            if family == "colearning":
                heads, branches = method.predict_with_branches(model, images)
                if method.source != "none":
                    for name, probs in branches.items():
                        out["branches"].setdefault(name, []).append(probs.cpu())
            elif family == "dividemix":
                heads, nets = method.predict_with_nets(model, images)
                for name, logits in nets.items():
                    out["nets"].setdefault(name, []).append(torch.sigmoid(logits).cpu())
            else:
                heads = method.predict(model, images)
            out["probs"].append(torch.sigmoid(heads[head].float()).cpu())
    result = {"probs": torch.cat(out["probs"]).numpy(),
              "branches": {k: torch.cat(v).numpy() for k, v in out["branches"].items()},
              "nets": {k: torch.cat(v).numpy() for k, v in out["nets"].items()}}
    if family == "dividemix":  # the co-divide of the final weights: each net's w from the other net's losses
        prob = method.co_divide(method.sample_losses(model)).cpu().numpy()
        result["clean_probability"] = dict(zip(NETS, prob))  # co_divide's rows: the nets in NETS order
    return result


def suspicion(trainer) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, np.ndarray]]:
    """(score, flagged) per scorer that applies to the run (see the module docstring), and the entries a scorer can
    flag at all where that is not every entry (the pseudo-label rule's reach)."""
    noisy = np.asarray(trainer.train_table.labels, dtype=np.float64)
    seen = train_probabilities(trainer)
    probs = seen["probs"].astype(np.float64)
    out = {"model": model_scores(noisy, probs)}
    if seen["branches"]:
        method = trainer.method
        names = list(method.specs)
        corrections = []
        for name in names:
            source = name if method.source == "self" else next(m for m in names if m != name)
            alpha, beta = method.thresholds[source]
            corrections.append((seen["branches"][source].astype(np.float64), np.asarray(alpha, dtype=np.float64),
                                np.asarray(beta, dtype=np.float64)))
        out["pseudo_labels"] = pseudo_label_scores(noisy, corrections)
        reach = {"pseudo_labels": pseudo_label_reach(noisy, corrections)}
    else:
        reach = {}
    if "clean_probability" in seen:
        w = seen["clean_probability"]
        out["dividemix"] = dividemix_scores(noisy, [(w[n].astype(np.float64), seen["nets"][n].astype(np.float64))
                                                    for n in seen["nets"]])
    out["cleanlab"] = cleanlab_scores(noisy, probs)
    return out, reach


def write_suspects(out: Path, trainer, scored: dict, wrong: np.ndarray | None) -> None:
    """The table of flagged entries at OUT (the caller's temporary name)."""
    import csv

    table = trainer.train_table
    noisy = np.asarray(table.labels) > 0.5
    natural = next(name for name in NATURAL if name in scored)
    rank = {name: ranks(score) for name, (score, _) in scored.items()}
    any_flag = np.any([flagged for _, flagged in scored.values()], axis=0)
    rows, cols = np.nonzero(any_flag)
    order = np.argsort(rank[natural][rows, cols], kind="stable")
    header = ["image", "class", "given", *(f"{n}_{k}" for n in scored for k in ("score", "rank", "flagged"))]
    if wrong is not None:
        header.append("wrong")
    with open(out, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        for r, c in zip(rows[order], cols[order]):
            cells = [table.image_ids[r], table.classes[c], int(noisy[r, c])]
            for name, (score, flagged) in scored.items():
                cells += [format(float(score[r, c]), ".6g"), int(rank[name][r, c]), int(flagged[r, c])]
            if wrong is not None:
                cells.append(int(wrong[r, c]))
            writer.writerow(cells)


def clean_truth(trainer, clean_labels: Path) -> np.ndarray:
    """(N, C) where the run's given training label differs from the clean one, row by row by image id."""
    from noisymlt.data.labels import read_labels

    clean = read_labels(clean_labels)
    table = trainer.train_table
    if list(clean.classes) != list(table.classes):
        raise NoisyMLTError(f"{clean_labels}: its classes are not the run's training labels' classes")
    where = {str(i): k for k, i in enumerate(clean.image_ids)}
    missing = [i for i in table.image_ids if str(i) not in where]
    if missing:
        raise NoisyMLTError(f"{clean_labels}: no clean labels for {len(missing)} training image(s) of the run, "
                            f"e.g. {missing[0]!r}")
    rows = [where[str(i)] for i in table.image_ids]
    return (np.asarray(clean.labels)[rows] > 0.5) != (np.asarray(table.labels) > 0.5)


def suspects_of_run(run: Path, out: Path, *, clean_labels: Path | None = None, device: str = "cpu",
                    train_images: Path | None = None) -> dict:
    import contextlib

    from noisymlt.core.files import replacing, write_json
    from noisymlt.data.labels import GROUPS
    from noisymlt.inference.run_model import load_run

    trainer = load_run(run, device=device, train_images=train_images)
    scored, reach = suspicion(trainer)
    wrong = clean_truth(trainer, clean_labels) if clean_labels else None
    record = {"run": str(run), "run_id": trainer.run_id, "method": trainer.cfg["method"],
              "dataset": trainer.cfg["dataset"], "gamma": float(trainer.cfg["gamma"]), "seed": int(trainer.cfg["seed"]),
              "noise_model": (trainer.cfg.get("noise") or {}).get("model", PAPER),  # the paper's: not in the config
              "checkpoint_sha256": trainer.checkpoint_sha256, "table": out.name, "scorers": {}}
    for name, (score, flagged) in scored.items():
        rec = {"how": HOW[name], "flagged": int(flagged.sum())}
        if wrong is not None:
            rec["detection"] = detection(score, flagged, wrong, given=trainer.train_table.labels,
                                         groups={g: trainer.split[g] for g in GROUPS}, reach=reach.get(name))
        record["scorers"][name] = rec
    if wrong is not None:
        record["clean_labels"] = str(clean_labels)
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as whole:  # both files reach their names together, once both are whole
        record_tmp = whole.enter_context(replacing(out.with_suffix(".json")))
        write_suspects(whole.enter_context(replacing(out)), trainer, scored, wrong)
        write_json(record_tmp, record)
    return record


def _cmd_suspects(args: argparse.Namespace) -> int:
    from noisymlt.inference.run_model import check_run_outputs

    if len(args.run) != len(args.out):
        raise NoisyMLTError(f"{len(args.run)} --run but {len(args.out)} --out: one table a run")
    outs = [Path(out) for out in args.out]
    for out in outs:  # every output checked before the first run is scored
        if out.suffix != ".csv":
            raise NoisyMLTError(f"--out {out}: a .csv file")
    written = {}
    for out in outs:
        written[f"--out {out}"] = out
        written[f"the record of {out}"] = out.with_suffix(".json")
    for run in args.run:
        check_run_outputs(Path(run), {"--clean-labels": args.clean_labels}, written)
    for run, out in zip(args.run, outs):
        record = suspects_of_run(Path(run), out, clean_labels=Path(args.clean_labels) if args.clean_labels else None,
                                 device=args.device, train_images=args.train_images)
        flagged = ", ".join(f"{name} {rec['flagged']}" for name, rec in record["scorers"].items())
        print(f"{run}: flagged {flagged}: {out}")
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "suspects", help="the training labels a finished run disputes, ranked, and how well it finds wrong ones",
        description="Score every (training image, class) label of a finished run by how likely it is wrong: the "
                    "model's own prediction, Ours' pseudo-label rule, DivideMix's label refinement, cleanlab's "
                    "multi-label ranking. Writes a table of the flagged labels (image, class, given, score, rank) "
                    "and a .json record; with --clean-labels, how well each finds the wrong labels.")
    p.add_argument("--run", required=True, nargs="+", help="finished run folder(s)")
    p.add_argument("--out", required=True, nargs="+", help="the .csv table to write, one a run, in order")
    p.add_argument("--clean-labels", help="the clean labels of the same training images (the benchmark's clean "
                                          "subset), to measure the rankings against")
    p.add_argument("--train-images", help="the run's training image folder, for a run without the image cache")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.set_defaults(func=_cmd_suspects)
