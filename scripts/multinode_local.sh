#!/usr/bin/env bash
# Simulate a multi-node DeepSpeed job on this machine: NODES launcher processes, one per "node", each
# started as a real node would start it (DeepSpeed's launcher with --no_ssh and its own --node_rank, a
# shared hostfile, one master address and port). scripts/slurm/pretrain_multinode.sbatch runs the very
# same command once per allocated node.
#
#   scripts/multinode_local.sh pretrain/run.py --ds-config ds_configs/cpu_fp32.json --synthetic 512 \
#       --max-steps 20 --output-dir runs/two_nodes
#   NODES=2 RANKS_PER_NODE=2 MASTER_PORT=29611 scripts/multinode_local.sh pretrain/run.py ...
#
# Environment (defaults): NODES (2), RANKS_PER_NODE (1), MASTER_ADDR (127.0.0.1), MASTER_PORT (29600).
# Exits non-zero if any node's launcher does, and then ends the other launchers.
set -euo pipefail
NODES=${NODES:-2}
RANKS_PER_NODE=${RANKS_PER_NODE:-1}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29600}
[ $# -ge 1 ] || { echo "usage: $0 SCRIPT [ARGS...]   (e.g. pretrain/run.py --ds-config ...)" >&2; exit 2; }

hostfile=$(mktemp "${TMPDIR:-/tmp}/skillnet_hostfile.XXXXXX")
trap 'rm -f "$hostfile"' EXIT
for ((n = 0; n < NODES; n++)); do echo "node$n slots=$RANKS_PER_NODE"; done > "$hostfile"

pids=()
for ((n = 0; n < NODES; n++)); do
  deepspeed --hostfile "$hostfile" --no_ssh --node_rank "$n" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "$@" &
  pids+=($!)
done
# The first launcher to fail takes the others down (a real node that loses its peers fails in its next
# collective; one that never met them would wait for the rendezvous timeout).
status=0
for _ in "${pids[@]}"; do
  if ! wait -n; then
    status=1
    kill "${pids[@]}" 2>/dev/null || true
  fi
done
exit "$status"
