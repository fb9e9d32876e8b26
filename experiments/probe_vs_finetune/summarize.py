#!/usr/bin/env python
"""The table of README.md from result.json: per variant, the probe's and the fine-tuned model's test mAP per seed
(clean labels), and whether fine-tuning is above the probe on every seed.

    python experiments/probe_vs_finetune/summarize.py            # prints the Markdown table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def table(result: dict) -> str:
    lines = ["| variant | source held-out acc. | probe mAP per seed | fine-tuned mAP per seed | fine-tuned above probe, every seed | s per fine-tune |",
             "|---|---|---|---|---|---|"]
    for tag, variant in result.items():
        runs = variant["runs"]
        probe = [runs[s]["probe_map"] for s in sorted(runs)]
        tuned = [next(iter(runs[s]["finetuned_map"].values())) for s in sorted(runs)]
        seconds = sum(runs[s]["finetune_seconds"] for s in runs) / len(runs)
        acc = variant.get("pretrain_held_out_accuracy")
        lines.append(f"| `{tag}` | {'the demo' if acc is None else f'{acc:.3f}'} | "
                     f"{' / '.join(f'{v:.1f}' for v in probe)} | {' / '.join(f'{v:.1f}' for v in tuned)} | "
                     f"{'yes' if all(t > p for t, p in zip(tuned, probe)) else 'no'} | {seconds:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "result.json"
    print(table(json.loads(path.read_text())))
