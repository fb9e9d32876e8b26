"""`noisymlt trace`: from a table cell to every run behind it, checking files, values and code.

The table files a reader sees (.tex, .md, .html) must show each cell as it was rendered from its runs; a cell's
runs must be the runs the table used; every file their training and evaluation manifests record must
still hash as recorded; the runs' metrics must still give the cell's value; and each result must be the work
of the code its manifest names: the predictions' weights trained by that code, and the source on disk still
giving it (noisymlt.core.codedeps).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from noisymlt.core.files import read_json
from noisymlt.core.manifest import file_sha256
from noisymlt.data.noise_models import PAPER
from noisymlt.pipeline import layout as L

GROUPS_AND_TOTAL = ("total", "head", "medium", "tail")


def check_file(record: dict) -> str:
    """``ok``, ``CHANGED`` or ``MISSING``: a recorded file against its recorded sha256."""
    path = Path(record["path"])
    if not path.is_file():
        return "MISSING"
    return "ok" if file_sha256(path) == record["sha256"] else "CHANGED"


def recorded_files(step: str, manifest: dict) -> tuple[list[tuple], list[str]]:
    """Each input and output a step's manifest records, checked: (step, in / out, name, record, status) lines and
    the problems."""
    lines, problems = [], []
    for direction in ("inputs", "outputs"):
        for name, rec in manifest.get(direction, {}).items():
            status = check_file(rec)
            lines.append((step, direction[:-4] if direction == "outputs" else "in", name, rec, status))
            if status != "ok":
                problems.append(f"{status} {rec['path']} ({step} {direction[:-1]} {name})")
    return lines, problems


def _cell_metric(key: str) -> tuple[str, str]:
    """(head, mAP group) of a sidecar key: METHOD/HEAD/DATASET/GAMMA (total table; METHOD/HEAD/DATASET/MODEL/GAMMA
    with several noise models) or METHOD/HEAD/GAMMA/GROUP (ablation tables)."""
    parts = key.split("/")
    return parts[1], parts[3] if len(parts) > 3 and parts[3] in GROUPS_AND_TOTAL else "total"


def predictions_origin(path: Path) -> dict[str, str | None]:
    """What a predictions.npz says it was made from (noisymlt.training.trainer): ``checkpoint`` (the content hash of the
    weights) and ``code`` (the digest of the code that trained them); None for what it does not record
    (written by an older version) or when it cannot be read."""
    import numpy as np

    out: dict[str, str | None] = {"checkpoint": None, "code": None}
    try:
        with np.load(path, allow_pickle=False) as npz:
            for key, name in (("checkpoint", "checkpoint_sha256"), ("code", "code_digest")):
                out[key] = (str(npz[name]) if name in npz.files else "") or None
    except Exception:  # noqa: BLE001 (the file's own sha256 check reports a damaged file)
        pass
    return out


def current_code(manifest: dict) -> str | None:
    """The digest the package source on disk now gives for the code a manifest records (its entry modules:
    a training run's trainer, family and losses; a step's CLI and command module); None if it records none
    (an older version) or names a module that is gone."""
    from noisymlt.core import codedeps

    try:
        return codedeps.fresh_digest(*manifest["code_entries"])
    except (KeyError, ValueError, TypeError):
        return None


def code_problems(step: str, manifest: dict, predictions: Path | None = None) -> list[str]:
    """A result is the work of the code its manifest names: the predictions' weights were trained by that
    code, and that code is still what the source gives (else the result is stale: the workflow reruns it)."""
    problems = []
    recorded = manifest.get("code_digest")
    if predictions is not None and predictions.is_file():
        trained_by = predictions_origin(predictions)["code"]
        if trained_by is None:
            problems.append(f"CODE: {predictions} does not record the code that trained its weights (written by "
                            "an older version): retrain the run")
        elif trained_by != recorded:
            problems.append(f"CODE: {predictions} came from a checkpoint trained by code {trained_by}; the "
                            f"manifest records code {recorded}")
    now = current_code(manifest)
    if now is not None and recorded != now:
        problems.append(f"CODE: the {step} step ran code {recorded}; the source now gives {now} (edited since: "
                        "rerun the workflow)")
    return problems


def trace(sidecar: Path, cell: str) -> list[dict]:
    """Check every run behind one table cell: the manifest named in the sidecar must be of the run the
    table used, every file it (and its evaluation's manifest) records must still hash as recorded, and
    the runs' current metrics must still give the cell's value. One dict per run: its lines and problems."""
    from noisymlt.errors import NoisyMLTError

    try:
        cells = json.loads(Path(sidecar).read_text())["cells"]
    except (OSError, ValueError, KeyError) as exc:
        raise NoisyMLTError(f"{sidecar}: cannot read the table's cell sidecar ({exc})") from exc
    if cell not in cells:
        sample = ", ".join(list(cells)[:4])
        raise NoisyMLTError(f"{sidecar}: no cell {cell!r} (cells look like: {sample}, ...; --list shows all)")
    head, group = _cell_metric(cell)
    report, values = [], []
    for entry in cells[cell]["runs"]:
        manifest_path = Path(entry["manifest"])
        run = {"run_id": entry["run_id"], "seed": entry.get("seed"), "manifest": str(manifest_path), "lines": [],
               "problems": []}
        report.append(run)
        if not manifest_path.is_file():
            run["problems"].append(f"MISSING run: {manifest_path} does not exist (run folder {manifest_path.parent} "
                                   "deleted or never finished; rerun the workflow to rebuild it)")
            continue
        m = read_json(manifest_path, "the run's manifest", require_object=True)
        if m.get("run_id") != entry["run_id"]:
            run["problems"].append(f"RUN ID: the table used run {entry['run_id']}, {manifest_path} is of run "
                                   f"{m.get('run_id')} (retrained since the table was made)")
        run["summary"] = m
        run["selection"], problems = selection_report(m.get("run", {}))
        run["problems"] += problems
        evaluation = manifest_path.with_name("metrics.manifest.json")
        steps = [("train", m)] + ([("evaluate", read_json(evaluation))] if evaluation.is_file() else [])
        if len(steps) == 1:
            run["problems"].append(f"MISSING evaluation manifest {evaluation}")
        for step, man in steps:
            lines, problems = recorded_files(step, man)
            run["lines"] += lines
            run["problems"] += problems
        train_labels = m.get("inputs", {}).get("train_labels")
        if train_labels:  # a cleaned run: the cleaning's inputs, and the fold runs behind its flags
            lines, problems = cleaning_trace(Path(train_labels["path"]))
            run["lines"] += lines
            run["problems"] += problems
        recorded, predictions = m.get("checkpoint_content_sha256"), m.get("outputs", {}).get("predictions")
        made_from = predictions_origin(Path(predictions["path"]))["checkpoint"] if recorded and predictions else None
        if made_from and made_from != recorded:
            run["problems"].append(f"CHECKPOINT: {predictions['path']} was made from checkpoint {made_from[:16]}, "
                                   f"the manifest records checkpoint {recorded[:16]}")
        for step, man in steps:
            run["problems"] += code_problems(step, man, Path(predictions["path"]) if predictions and step == "train"
                                             else None)
        metrics = manifest_path.with_name("metrics.json")
        if metrics.is_file():
            try:
                values.append(100 * json.loads(metrics.read_text())["heads"][head]["map"][group])
            except (KeyError, ValueError):
                run["problems"].append(f"{metrics}: no mAP {group} for head {head}")
    mean = cells[cell].get("mean")
    if values and len(values) == len(report) and mean is not None and abs(sum(values) / len(values) - mean) > 1e-6:
        report[-1]["problems"].append(f"STALE: the table shows {mean:.4f}, the runs' metrics now give "
                                      f"{sum(values) / len(values):.4f}")
    return report


def cleaning_trace(table: Path) -> tuple[list[tuple], list[str]]:
    """A cleaned training table's inputs, from its record beside it (noisymlt.pipeline.cleaning), and where it
    acted on cross-fitted probabilities, the fold runs they came from (noisymlt.pipeline.crossfit): each must be
    the run the gathered file names, with its files and code as recorded. Nothing for a table no cleaning wrote."""
    import numpy as np

    record_path = table.with_suffix(".json")
    record = read_json(record_path) if record_path.is_file() else {}
    if not isinstance(record, dict) or "flags" not in record or not isinstance(record.get("inputs"), dict):
        return [], []
    lines, problems = recorded_files("clean", record)  # its inputs, hashed as a manifest's
    gathered = record["inputs"].get("out_of_sample")
    if not gathered or problems:
        return lines, problems
    with np.load(gathered["path"], allow_pickle=False) as npz:
        folds = list(zip(npz["runs"].tolist(), npz["run_ids"].tolist()))
    for k, (folder, run_id) in enumerate(folds):
        step, manifest_path = f"fold {k}", Path(folder) / "manifest.json"
        if not manifest_path.is_file():
            problems.append(f"MISSING fold run: {manifest_path} (its probabilities are in {gathered['path']})")
            continue
        manifest = read_json(manifest_path, "a fold run's manifest", require_object=True)
        if manifest.get("run_id") != run_id:
            problems.append(f"RUN ID: {gathered['path']} holds run {run_id}'s probabilities, {manifest_path} is of "
                            f"run {manifest.get('run_id')} (retrained since)")
        files, failed = recorded_files(step, manifest)
        lines += files
        problems += failed + code_problems(step, manifest)
    return lines, problems


def table_grid(style: str, text: str) -> list[list[str]]:
    """The body rows of a rendered table as cells (the row title first), as noisymlt.report.tables writes them."""
    import re

    if style == "md":
        rows = [line for line in text.splitlines() if line.startswith("|")][2:]  # past the header and |---|
        return [[c.strip() for c in line.strip().strip("|").split("|")] for line in rows]
    if style == "tex":
        body = text.split("\\bottomrule", 1)[0].rsplit("\\midrule", 1)[-1]  # the header has rules of its own
        rows = [line.strip().removeprefix("\\rowcolor{Gray}").strip() for line in body.split("\\\\")]
        return [[c.strip() for c in row.split(" & ")] for row in rows if row]
    body = text.split("<tbody>", 1)[-1]
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def rendered_problems(sidecar: str | Path) -> list[str]:
    """The table files a reader sees (.tex, .md, .html) against the cells they were rendered from, by the record
    the renderer wrote beside them (``<table>.rendered.json``): each cell's text where it put it, then the whole
    file's hash."""
    from noisymlt.report.tables import rendered_path

    path = rendered_path(sidecar)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return [f"MISSING {path} (the record of the rendered tables, written with them; rerun the workflow)"]
    except (OSError, ValueError) as exc:
        return [f"UNREADABLE {path} ({exc}); rerun the workflow"]
    problems = []
    for style, rec in record.get("rendered", {}).items():
        path = Path(rec["path"])
        if not path.is_file():
            problems.append(f"MISSING table {path} (rendered from these cells; rerun the workflow)")
            continue
        grid = table_grid(style, path.read_text())
        wrong = []
        for key, at in record.get("shown", {}).items():
            row = grid[at["row"]] if at["row"] < len(grid) else []
            got = row[at["col"]] if at["col"] < len(row) else None
            if got != at[style]:
                wrong.append(f"TABLE: {path} cell {key} (row {at['title']}, column {at['col']}) shows {got!r}; "
                             f"its runs gave {at[style]!r} (edited by hand? rerun the workflow to render it again)")
        if not wrong and file_sha256(path) != rec["sha256"]:
            wrong.append(f"TABLE: {path} changed since it was rendered (sha256 {rec['sha256'][:16]} recorded), "
                         "outside its value cells")
        problems += wrong
    return problems


def selection_report(cfg: dict) -> tuple[list[str], list[str]]:
    """What model selection chose for a run (its config's `selected` record) and how: each stage's candidates
    with their validation mAP, from the stage file beside the choice file the run read. Problems: the scores
    are gone, or the selection chose otherwise since the run trained."""
    selected = cfg.get("selected")
    if not selected:
        return [], []
    values = " ".join(f"{k}={v:g}" for k, v in selected["values"].items())
    lines = [f"selected {values}  (choice {selected['by']})"]
    stage_path = Path(L.stage_file_of(selected["by"]))
    try:
        record = json.loads(stage_path.read_text())
    except (OSError, ValueError):
        return lines, [f"MISSING {stage_path}: the scores of the selection behind the run's values"]
    problems = []
    if any(record["chosen"].get(k) != v for k, v in selected["values"].items()):
        problems.append(f"SELECTION: {stage_path} now chooses {record['chosen']}, the run trained with "
                        f"{selected['values']} (rerun the workflow)")
    for stage in [*record.get("earlier_stages", []), record]:
        scores = ", ".join(f"{c['tag']} {c['mean']:.2f}{'*' if c['tag'] == stage['winner'] else ''}"
                           for c in stage["candidates"])
        lines.append(f"  stage {stage['stage']} ({'+'.join(stage['keys'])}): {scores}")
    lines.append(f"  scored by {record.get('metric')}; * = chosen ({stage_path})")
    return lines, problems


def _cmd_trace(args: argparse.Namespace) -> int:
    from noisymlt.errors import NoisyMLTError
    from noisymlt.report.sentinels import describe

    if args.list:
        try:
            print("\n".join(json.loads(Path(args.sidecar).read_text())["cells"]))
        except (OSError, ValueError, KeyError) as exc:
            raise NoisyMLTError(f"{args.sidecar}: cannot read the table's cell sidecar ({exc})") from exc
        return 0
    if not args.cell:
        raise NoisyMLTError("name a cell (METHOD/HEAD/DATASET/GAMMA, e.g. erm/main/voc/0.5) or pass --list")
    problems = 0
    report = trace(Path(args.sidecar), args.cell)  # reads the sidecar first, naming it when it cannot
    for problem in rendered_problems(args.sidecar):
        print(f"PROBLEM  {problem}")
        problems += 1
    for run in report:
        m = run.get("summary")
        if m is None:  # the run's manifest is gone: name the run from the sidecar
            print(f"run {run['run_id']}  seed={run['seed']}  MISSING (the table used {run['manifest']})")
        else:
            cfg = m.get("run", {})
            noise = (cfg.get("noise") or {}).get("model", PAPER)
            print(f"run {run['run_id']}  {cfg.get('method')}  noise={noise} gamma={cfg.get('gamma')} "
                  f"seed={cfg.get('seed')}  "
                  f"git={m.get('git', {}).get('commit')}{' (dirty)' if m.get('git', {}).get('dirty') else ''}  "
                  f"manifest {run['manifest']}")
            print(f"    code {m.get('code_digest')}  ({len(m.get('code_modules', []))} package modules)"
                  + (f"  checkpoint content {m['checkpoint_content_sha256'][:16]}"
                     if m.get("checkpoint_content_sha256") else ""))
            print(f"    numerics {describe(m.get('numerics'))}")
            for line in run.get("selection", []):
                print(f"    {line}")
        for step, direction, name, rec, status in run["lines"]:
            print(f"    {status:<8} {step:<8} {direction:<3} {name:<14} {rec['sha256'][:16]}  {rec['path']}")
        for problem in run["problems"]:
            print(f"    PROBLEM  {problem}")
        problems += len(run["problems"])
    print(f"{args.cell}: {'all recorded files and values check out' if not problems else f'{problems} problem(s)'}")
    return 0 if not problems else 1


def add_cli(sub) -> None:
    p = sub.add_parser("trace", help="check the runs, files and hashes behind one table cell",
                       description="Walk from a table cell to every run behind it and check it: the manifest must "
                                   "be of the run the table used, every input and output recorded by the training "
                                   "and evaluation manifests must still have its recorded sha256 (ok / CHANGED / "
                                   "MISSING), and the runs' metrics must still give the cell's value. Exit status 1 "
                                   "on any mismatch.")
    p.add_argument("cell", nargs="?",
                   help="cell key as in the sidecar: METHOD/HEAD/DATASET/GAMMA for table_total (e.g. erm/main/voc/0.5, "
                        "ours/ensemble/coco/0.9; METHOD/HEAD/DATASET/MODEL/GAMMA when it compares noise models, e.g. "
                        "erm/main/voc/uniform/0.5), METHOD/HEAD/GAMMA/GROUP for ablation and head/medium/tail tables (e.g. "
                        "ours/ensemble/0.5/tail)")
    p.add_argument("--sidecar", default="reports/table_total.cells.json", help="the table's .cells.json sidecar")
    p.add_argument("--list", action="store_true", help="list the sidecar's cell keys")
    p.set_defaults(func=_cmd_trace)
