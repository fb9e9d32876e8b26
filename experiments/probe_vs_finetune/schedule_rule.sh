#!/usr/bin/env bash
# The demo's epoch counts per recipe, by one rule for every recipe: the shortest of the paper's 8 epochs x {1, 2,
# 3} at which the recipe's representative, trained on the demo subset's clean labels, scores above the probe of the
# frozen pretrained trunk on all five seeds (experiment_probe.py; clean labels, the test set read for this check
# only, never for the paper's comparisons). ERM for the uniform recipes (db_random, and cl alike), DB-Focal and RS
# for the class-aware one (db). lr steps at 5/8 and 7/8 of the run, warm-ups at [CL]'s 100 of 280 iterations of a
# uniform run (9 iterations an epoch on the demo's 302 images). Writes schedule.json; about 3 minutes on 2 cores.
# Run from the project folder after building the demo's data (see experiment_probe.py).
set -euo pipefail
OUT=${OUT:-experiments/probe_vs_finetune/schedule.json}
run() { python experiments/probe_vs_finetune/experiment_probe.py --root . --seeds 0 1 2 3 4 --json "$OUT" "$@"; }
run --tag erm_8_epochs --method erm --set epochs=8 "lr_steps=[5,7]" warmup_iters=26
run --tag erm_16_epochs --method erm --set epochs=16 "lr_steps=[10,14]" warmup_iters=51
run --tag erm_24_epochs --method erm --set epochs=24 "lr_steps=[15,21]" warmup_iters=77
run --tag db_focal_8_epochs --method db_focal --set epochs=8 "lr_steps=[5,7]"
run --tag rs_8_epochs --method rs --set epochs=8 "lr_steps=[5,7]"
