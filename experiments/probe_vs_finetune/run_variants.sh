#!/usr/bin/env bash
# Every variant of result.json, on the layered demo's data (see experiment_probe.py's docstring), three seeds each.
# Ran at commit e66d040, whose demo profile and layer voc_structure.yaml it reads: check that commit out to rerun it
# (the demo has since moved to the same structure at a quarter of the scale; schedule_rule.sh sweeps it there).
# Run from the project folder after building that data; about 6 minutes on 2 cores.
set -euo pipefail
run() { python experiments/probe_vs_finetune/experiment_probe.py --root . \
          --layers workflow/profiles/demo/voc_structure.yaml --seeds 0 1 2 --json "$OUT" "$@"; }
OUT=${OUT:-experiments/probe_vs_finetune/result.json}
run --tag demo_recipe
run --tag no_channel_swap --drop-photometric-ops swap
run --tag no_hue_saturation --drop-photometric-ops hue_saturation
run --tag photometric_off --set photometric=false
run --tag photometric_off_24_epochs --set photometric=false epochs=24 "lr_steps=[15,21]"
run --tag source_photometric_off --pretrain-set photometric=false --set photometric=false
run --tag source_photometric_off_32_epochs --pretrain-set photometric=false --set photometric=false epochs=32 "lr_steps=[20,28]"
run --tag source_photometric_off_24_epochs_no_dropout --pretrain-set photometric=false \
    --set photometric=false epochs=24 "lr_steps=[15,21]" neck_dropout=0.0
# half the widths (resnet_tiny_half: a [DB] step 2.6x faster), source task and fine-tuning without photometric ops
run --tag half_width_source_photometric_off --pretrain-set backbone=resnet_tiny_half photometric=false \
    --set backbone=resnet_tiny_half photometric=false
run --tag half_width_source_photometric_off_32_epochs --pretrain-set backbone=resnet_tiny_half photometric=false \
    --set backbone=resnet_tiny_half photometric=false epochs=32 "lr_steps=[20,28]"
