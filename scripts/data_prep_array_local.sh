#!/usr/bin/env bash
# Run scripts/slurm/data_prep_array.sbatch on this machine as Slurm runs it: JOBS array tasks at once, each
# with the environment an array task gets, then (when every task succeeded) its merge stage.
#
#   JOBS=3 scripts/data_prep_array_local.sh 'corpus/*.txt' shards/
#   JOBS=4 BUILD_ARGS="--unit-bytes 65536 --vocab my_vocab/" scripts/data_prep_array_local.sh corpus.txt shards/
#
# Environment (defaults): JOBS (4), CPUS_PER_TASK (1), and the sbatch file's BUILD_ARGS and PYTHON.
set -euo pipefail
JOBS=${JOBS:-4}
[ $# -eq 2 ] || { echo "usage: $0 INPUT_GLOB OUT_DIR" >&2; exit 2; }
job=$(dirname "$0")/slurm/data_prep_array.sbatch
pids=()
for ((i = 0; i < JOBS; i++)); do
  SLURM_ARRAY_TASK_ID=$i SLURM_ARRAY_TASK_COUNT=$JOBS SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_MAX=$((JOBS - 1)) \
    SLURM_CPUS_PER_TASK=${CPUS_PER_TASK:-1} bash "$job" "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
if [ "$status" != 0 ]; then
  echo "$0: an array task failed: no merge (rerun that task, then the merge stage)" >&2
  exit 1
fi
STAGE=merge bash "$job" "$@"
