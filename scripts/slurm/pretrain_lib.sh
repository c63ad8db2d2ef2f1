# Sourced by scripts/slurm/pretrain_multinode.sbatch and pretrain_v100x32.sbatch (not a job of its own): the
# stop signal before the time limit, and the requeue rule. docs/training.md, "Running on Slurm", explains both.
#
# Environment (defaults):
#   SIGNAL_LEAD (600)     seconds between the stop signal and the time limit: the ranks save in this window.
#                         A job whose --time is under 2 x SIGNAL_LEAD gets half its time limit instead.
#   MIN_SIGNAL_LEAD (60)  the shortest window accepted (a save must fit): a --time under twice it is refused
#                         before training starts.
#   MAX_REQUEUES (20)     the job requeues itself at most this many times (SLURM_RESTART_COUNT), then ends.

# "[D-]HH:MM:SS", "MM:SS" or "M" (squeue's %L / %l) in seconds; nothing for UNLIMITED/NOT_SET.
slurm_seconds() {
  local t=$1 d=0 h=0 m=0 s=0
  case $t in '' | UNLIMITED | NOT_SET | INVALID | Partition_Limit) return 0 ;; esac
  if [[ $t == *-* ]]; then d=${t%%-*}; t=${t#*-}; fi
  IFS=: read -r -a f <<<"$t"
  case ${#f[@]} in
    1) m=${f[0]} ;;
    2) m=${f[0]}; s=${f[1]} ;;
    3) h=${f[0]}; m=${f[1]}; s=${f[2]} ;;
  esac
  echo $(((10#$d * 24 + 10#$h) * 3600 + 10#$m * 60 + 10#$s))
}

# The job's time left, in seconds (nothing when it has no limit).
job_seconds_left() {
  slurm_seconds "$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null | head -n 1)"
}

# Decide the stop signal's lead time from this attempt's time limit, or refuse (exit 2: no requeue).
# Sets STOP_LEAD (empty: no time limit, no timer).
plan_stop_signal() {
  local left want=${SIGNAL_LEAD:-600} floor=${MIN_SIGNAL_LEAD:-60}
  left=$(job_seconds_left)
  STOP_LEAD=
  [ -n "$left" ] || return 0
  STOP_LEAD=$want
  if [ $((2 * want)) -gt "$left" ]; then STOP_LEAD=$((left / 2)); fi
  if [ "$STOP_LEAD" -lt "$floor" ]; then
    echo "[sbatch] error: ${left} s left of the time limit: too short to train and still save ${floor} s" \
      "(MIN_SIGNAL_LEAD) before it; submit with a longer --time (at least $((2 * floor)) s)" >&2
    exit 2
  fi
  echo "[sbatch] time limit: ${left} s left; the ranks are told to save and stop ${STOP_LEAD} s before it" \
    "(SIGNAL_LEAD ${want} s$([ "$STOP_LEAD" != "$want" ] && echo ", capped at half the time left"))"
}

# In the background: SIGTERM to the job's steps STOP_LEAD seconds before the time limit (what sbatch
# --signal=TERM@N does, minus Slurm's up-to-60-s early delivery, and fitted to --time by plan_stop_signal).
# slurmstepd logs it as "STEP ... CANCELLED": the training's own log says it saved and stopped.
start_stop_timer() {
  STOP_TIMER=
  [ -n "${STOP_LEAD:-}" ] || return 0
  (
    while :; do
      left=$(job_seconds_left)
      [ -n "$left" ] || exit 0
      if [ "$left" -le "$STOP_LEAD" ]; then
        echo "[sbatch] ${left} s before the time limit: SIGTERM to the training (it saves, then stops)"
        scancel --signal=TERM "$SLURM_JOB_ID"
        exit 0
      fi
      sleep $((left - STOP_LEAD > 30 ? 30 : left - STOP_LEAD))  # re-read: an extended --time moves it
    done
  ) &
  STOP_TIMER=$!
}

# A plain scancel (or Slurm's own preemption) signals this shell too: that job is not requeued by this script.
CANCELLED=
trap 'CANCELLED=1' TERM

latest_checkpoint() {
  cat "$OUT/checkpoints/latest" 2>/dev/null || echo none
}

# After the training step: requeue only what a requeue can fix, else end with the training's status.
#   $1: the training's exit status, $2: the latest checkpoint when this attempt began.
finish_or_requeue() {
  local status=$1 before=$2 last restarts=${SLURM_RESTART_COUNT:-0} cap=${MAX_REQUEUES:-20}
  [ -z "${STOP_TIMER:-}" ] || kill "$STOP_TIMER" 2>/dev/null || true
  last=$(latest_checkpoint)
  echo "[sbatch] training exited with $status; latest checkpoint: $last (this attempt began at $before)"
  if [ "$last" = "$(printf 'step_%08d' "$MAX_STEPS")" ]; then
    if [ "$status" = 143 ] && [ -z "$CANCELLED" ]; then
      # A stop signal (the timer's, or a preemption's) that reached the launcher as the training ended,
      # after its last save: the run is done, not failed.
      echo "[sbatch] the stop signal came as the training ended: its final checkpoint $last is complete"
      exit 0
    fi
    exit "$status"
  fi
  if [ -n "$CANCELLED" ]; then
    echo "[sbatch] the job was cancelled: not requeued (resubmit to continue from $last)"
    exit "$([ "$status" = 0 ] && echo 1 || echo "$status")"
  fi
  if [ "$last" = none ] || [ "$last" = "$before" ]; then
    # Nothing saved since this attempt began: a requeue would start from the same point and, for any
    # deterministic error (bad option, missing data, a crash before the first save), fail the same way.
    echo "[sbatch] error: training stopped (exit $status) without saving a checkpoint in this attempt:" \
      "not requeued (the error is above; a signal before the first step also ends here)" >&2
    exit "$([ "$status" = 0 ] && echo 1 || echo "$status")"
  fi
  if [ "$restarts" -ge "$cap" ]; then
    echo "[sbatch] error: not finished after $restarts requeues (MAX_REQUEUES=$cap): not requeued again;" \
      "resubmit to continue from $last" >&2
    exit 1
  fi
  echo "[sbatch] not finished: requeueing job $SLURM_JOB_ID (requeue $((restarts + 1)) of at most $cap;" \
    "it resumes from $last)"
  scontrol requeue "$SLURM_JOB_ID"
  exit 0
}
