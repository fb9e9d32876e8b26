"""The paper's running-time table (table:time_compare): seconds to predict the whole clean test set.

Paper protocol: every test image once, batch size 1, mean over 5 trials, on a named device. The same is
measured at a realistic batch size. Two figures per setting: ``total`` (reading and decoding images,
the model, sigmoid and copy back: what a user waits for) and ``model`` (the forward passes alone,
synchronised on a GPU). Each trained run is rebuilt from its own run folder (run_config.json,
checkpoint.pt) and the labels its manifest recorded, so the timed model is the one behind the table.

Timings are measurements, not results: they differ between runs and machines, so the table names its
device and is not versioned as a pipeline output.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError

log = logging.getLogger(__name__)


def device_name(device) -> str:
    """A readable name of the device a timing ran on (GPU model, or CPU model and thread count)."""
    import torch

    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {model}, {torch.get_num_threads()} thread(s)"


def load_trained(run_dir: Path, test_labels: Path, train_images: Path, test_images: Path, device: str):
    """A Trainer holding the finished model of RUN_DIR (its recorded config, labels and weights)."""
    import torch

    from noisymlt.train import Trainer

    files = {name: run_dir / name for name in ("run_config.json", "manifest.json", "checkpoint.pt")}
    for name, path in files.items():
        if not path.is_file():
            raise NoisyMLTError(f"{path}: missing; {run_dir} is not a finished training run")
    cfg = json.loads(files["run_config.json"].read_text())
    inputs = json.loads(files["manifest.json"].read_text())["inputs"]
    for key in ("train_labels", "split"):
        if key not in inputs:
            raise NoisyMLTError(f"{files['manifest.json']}: no recorded input {key!r}")
    caches = {f"{part}_cache": Path(inputs[f"{part}_cache"]["path"]) for part in ("train", "test")
              if f"{part}_cache" in inputs}  # train.loader: cache reads the images the run read
    trainer = Trainer(cfg, train_labels=Path(inputs["train_labels"]["path"]), test_labels=test_labels,
                      split=Path(inputs["split"]["path"]), train_images=train_images, test_images=test_images,
                      out_dir=run_dir, device=device, progress=False, **caches)
    state = torch.load(files["checkpoint.pt"], map_location=trainer.device, weights_only=True)
    if state.get("epoch") != cfg["train"]["epochs"]:
        raise NoisyMLTError(f"{files['checkpoint.pt']}: training stopped at epoch {state.get('epoch')} of "
                            f"{cfg['train']['epochs']}; time a finished run")
    trainer.model.load_state_dict(state["model"])
    return trainer


def time_predictions(trainer, batch_size: int, trials: int) -> dict:
    """Mean and standard deviation over TRIALS full passes over the test set (one untimed pass first,
    so that one-off costs such as kernel selection and file caching do not land in the first trial)."""
    trainer.predict(batch_size=batch_size)
    totals, models = [], []
    for _ in range(trials):
        forward: list[float] = []
        t0 = time.perf_counter()
        trainer.predict(batch_size=batch_size, forward_seconds=forward)
        totals.append(time.perf_counter() - t0)
        models.append(sum(forward))
    n = len(trainer.test_table)
    return {"batch_size": batch_size, "trials": trials, "images": n,
            "total_s": float(np.mean(totals)), "total_std_s": float(np.std(totals)),
            "model_s": float(np.mean(models)), "model_std_s": float(np.std(models)),
            "images_per_s": n / float(np.mean(totals))}


def write_table(records: list[dict], labels: dict[str, str], paper: dict[str, float], device: str, out: Path) -> None:
    """LaTeX in the paper's layout (methods as columns), Markdown, HTML and the JSON of every figure."""
    from noisymlt.report.tables import markdown_table_html

    methods = list(dict.fromkeys(r["method"] for r in records))
    by = {(r["method"], r["batch_size"]): r for r in records}
    sizes = sorted({r["batch_size"] for r in records})
    rows = []
    for bs in sizes:
        rows.append((f"Running time, batch {bs} (s)", [by[(m, bs)]["total_s"] for m in methods]))
        rows.append((f"Model only, batch {bs} (s)", [by[(m, bs)]["model_s"] for m in methods]))
    if paper:
        rows.append(("Paper, batch 1, RTX 2080Ti (s)", [paper.get(m) for m in methods]))
    names = [labels.get(m, m) for m in methods]

    def num(v):
        return "--" if v is None else f"{v:.2f}"

    tex = ["% generated by `noisymlt inference-time`; every figure with its spread in the .json next to it",
           f"% device: {device}", "\\begin{tabular}{l|" + "c" * len(methods) + "}", "\\toprule",
           "Method & " + " & ".join(names) + " \\\\", "\\midrule",
           *[f"{title} & " + " & ".join(num(v) for v in vals) + " \\\\" for title, vals in rows],
           "\\bottomrule", "\\end{tabular}", ""]
    md = ["| Method | " + " | ".join(names) + " |", "|---|" + "---|" * len(methods),
          *[f"| {title} | " + " | ".join(num(v) for v in vals) + " |" for title, vals in rows]]
    n = records[0]["images"]
    caption = (f"Total inference time (s) on the whole clean test set ({n} images), mean over "
               f"{records[0]['trials']} trials, on {device}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(tex))
    out.with_suffix(".md").write_text(caption + "\n\n" + "\n".join(md) + "\n")
    out.with_suffix(".html").write_text(markdown_table_html(md, caption))
    out.with_suffix(".json").write_text(json.dumps({"device": device, "records": records}, indent=1) + "\n")


def _cmd_inference_time(args: argparse.Namespace) -> int:
    if args.trials < 1 or any(b < 1 for b in args.batch_sizes):
        raise NoisyMLTError("--trials and --batch-sizes must be positive")
    labels = json.loads(args.labels) if args.labels else {}
    paper = json.loads(args.paper) if args.paper else {}
    records, device = [], None
    for run in map(Path, args.runs):
        trainer = load_trained(run, Path(args.test_labels), Path(args.train_images), Path(args.test_images),
                               args.device)
        device = device_name(trainer.device)
        for bs in args.batch_sizes:
            rec = {"method": trainer.cfg["method"], "run_id": trainer.run_id, "run": str(run),
                   **time_predictions(trainer, bs, args.trials)}
            log.info("%s batch %d: %.2f s total, %.2f s model (%d images, %s)", rec["method"], bs, rec["total_s"],
                     rec["model_s"], rec["images"], device)
            records.append(rec)
    write_table(records, labels, paper, device, Path(args.out))
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "inference-time", help="time the prediction of the whole test set (the paper's running-time table)",
        description="Rebuild each finished run (RUN_DIR/run_config.json, checkpoint.pt, the labels its manifest "
                    "recorded), predict the whole test set once untimed, then TRIALS times per batch size, and "
                    "write OUT (.tex), .md, .html and .json: mean seconds, total and model-only, with the device.")
    p.add_argument("--runs", nargs="+", required=True, metavar="RUN_DIR", help="finished run folders, one per column")
    p.add_argument("--test-labels", required=True, help="clean test labels (Parquet)")
    p.add_argument("--train-images", required=True, help="folder the train label paths are relative to")
    p.add_argument("--test-images", required=True, help="folder the test label paths are relative to")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 64], help="paper: 1 (default: 1 64)")
    p.add_argument("--trials", type=int, default=5, help="timed passes per batch size (paper: 5)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda:N")
    p.add_argument("--labels", help="method display names as JSON")
    p.add_argument("--paper", help='published seconds per method as JSON, e.g. \'{"db": 77.06}\'')
    p.add_argument("--out", required=True, help="LaTeX file to write")
    p.set_defaults(func=_cmd_inference_time)
