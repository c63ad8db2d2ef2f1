#!/usr/bin/env bash
# docs/comparison.md: every multi-task method on the packaged real Chinese tasks (sentiment, NER,
# insurance domain, QA matching), the same pre-trained initial weights, budget and seeds for each.
#   stages 1-4 of the demo (shared, restartable) -> python -m skillnet.finetune.compare -> docs/comparison.md
# Resumable: rerun the same command and finished runs are kept. Knobs: OUT (demo data, default
# runs/demo), CMP (runs, default runs/comparison), SEEDS (default "0 1 2"), METHODS (default all),
# FT_STEPS (per run, default from finetune/configs/comparison.json), REPORT (default docs/comparison.md).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/demo}
CMP=${CMP:-runs/comparison}
SEEDS=${SEEDS:-"0 1 2"}
METHODS=${METHODS:-all}
REPORT=${REPORT:-docs/comparison.md}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
t0=$SECONDS
OUT="$OUT" bash scripts/demo_data.sh
steps=()
[ -n "${FT_STEPS:-}" ] && steps=(--max-steps "$FT_STEPS")
# shellcheck disable=SC2086
python -m skillnet.finetune.compare --config finetune/configs/comparison.json --init "$OUT/pretrain/hf" \
    --methods $METHODS --seeds $SEEDS --output-dir "$CMP" --report "$REPORT" "${steps[@]}" \
    --title "Multi-task methods on packaged Chinese tasks (CPU, small model)"
printf '\n==== done in %d s: %s\n' "$((SECONDS - t0))" "$REPORT"
