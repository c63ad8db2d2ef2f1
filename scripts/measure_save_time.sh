#!/usr/bin/env bash
# How long the stop-signal checkpoint of a pre-training run takes to write: one step of BERT `base` (7 skills,
# 443 M parameters) on one DeepSpeed ZeRO-2 rank, then SIGTERM (tests/faults.py SigtermAt), and the trainer's
# own line "checkpoint ... saved in X s" (weights + Adam moments + fp32 master: 6.6 GB). Compare X with the
# kill window (docs/training.md, "Running on Slurm"): SIGNAL_LEAD, Slurm's KillWait, a launcher's grace.
#
#   scripts/measure_save_time.sh [OUT_DIR] [PRESET]     # ~1 min and ~10 GB of memory on 2 cores; OUT_DIR is removed
#
# Run it where the real runs write (a shared file system is often several times slower than a local disk).
set -euo pipefail
out=${1:-${TMPDIR:-/tmp}/skillnet-save-time}
preset=${2:-base}
cd "$(dirname "$0")/.."
[ ! -e "$out" ] || { echo "$0: $out exists: pass a folder that does not" >&2; exit 2; }
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
python - "$out/micro1.json" <<'PY'
import json, sys
d = json.load(open("ds_configs/zero2.json"))
d["train_micro_batch_size_per_gpu"] = 1  # one tiny batch: the step is not what is measured
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
# The SIGTERM at step 1 comes from the tests' fault injection (a wrapper of pretrain/run.py): the production
# command has no flag for it.
python tests/fixtures/pretrain/sigterm_run.py --sigterm-at-step 1 \
  --ds-config "$out/micro1.json" --synthetic 64 --preset "$preset" --max-steps 2 \
  --max-seq-len 32 --output-dir "$out/run" --no-progress --no-tensorboard 2>&1 \
  | grep -E '"params"|saved in' | sed -E 's/.*"params": ([0-9]+).*/params: \1/'
du -sh "$out/run/checkpoints/step_00000001" | sed 's/^/checkpoint size: /'
