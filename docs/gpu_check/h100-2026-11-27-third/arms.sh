#!/usr/bin/env bash
# One-off GPU experiment: the real pipeline under several ZeRO settings on one GPU, against the dense step.
set -u
cd "$(dirname "$0")/.."
[ -d /tmp/site/skillnet ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
rm -rf skillnet
G=/tmp/gc; mkdir -p "$G" "${OUT:=/tmp/out}"
[ -f .whl/bench_pretrain_prev.json ] && cp .whl/bench_pretrain_prev.json "$G/bench_pretrain.json"
pack() { cp "$G/arms_summary.txt" "$OUT/" 2>/dev/null; for a in $ARMS; do [ -f "$G/$a.txt" ] && grep -v "launch.py:145" "$G/$a.txt" | tail -n 40 > "$OUT/$a.txt"; done; rm -rf "$G"/*/checkpoints; }
ARMS=${ARMS:-asis lean nooverlap z1 z0 dense_asis dense_lean}
STEPS=${STEPS:-60}
if [ -n "${BENCH:-1}" ] && [ "${BENCH:-1}" != 0 ]; then
  GPU_CHECK_OUT=$G DTYPES=bf16 PARTS="bench_pretrain" PART_TIMEOUT=130 bash scripts/gpu_check.sh > "$G/gc_bench.txt" 2>&1
  tail -n 8 "$G/gc_bench.txt"; pack
fi
python3 - "$G" <<'PY'
import json, sys
from skillnet.model import SkillNetBertConfig as C
g = sys.argv[1]
base = json.load(open("ds_configs/a100_bf16.json"))
def v(name, **zo):
    d = json.loads(json.dumps(base)); d["zero_optimization"].update(zo); json.dump(d, open(f"{g}/{name}.json", "w"))
v("asis"); v("lean", overlap_comm=False, contiguous_gradients=False); v("nooverlap", overlap_comm=False)
v("z1", stage=1, overlap_comm=False); v("z0", stage=0)
c = C.preset("base"); ks = [len(c.task_skill_names(o)) for o in ("mlm", "nsp")]
json.dump({"intermediate_size": round(sum(ks) / len(ks) * c.intermediate_size)}, open(f"{g}/dense_width.json", "w"))
PY
for arm in $ARMS; do
  js=${arm#dense_}; extra=()
  [ "$arm" != "$js" ] && extra=(--dense --model_config "$G/dense_width.json")
  port=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  rm -rf "$G/$arm"
  timeout "${ARM_TIMEOUT:-110}" deepspeed --num_gpus 1 --master_port "$port" pretrain/run.py --ds_config "$G/$js.json" \
    --synthetic 20000 --preset base --max_seq_len 512 --log_every 10 --no_progress --no_tensorboard --resume none \
    --max_steps "$STEPS" --output_dir "$G/$arm" "${extra[@]}" > "$G/$arm.txt" 2>&1
  echo "$arm exit $?" >> "$G/$arm.txt"
  python3 - "$G" "$arm" <<'PY'
import json, statistics, sys
from pathlib import Path
g, arm = Path(sys.argv[1]), sys.argv[2]
log = g / arm / "log.jsonl"
recs = [json.loads(x) for x in log.read_text().splitlines() if '"train"' in x] if log.is_file() else []
later = recs[2:]
try:
    dense = json.loads((g / "bench_pretrain.json").read_text())
    dense_tps = dense["dense_step_tokens_per_s"]
except Exception:
    dense_tps = None
if not later:
    print(f"{arm}: no windows after warm-up ({len(recs)} logged)"); sys.exit()
tps = statistics.mean(r["tokens_per_s"] for r in later); ms = statistics.mean(r["seconds_per_step"] for r in later) * 1e3
padded = 64 * 512 / (ms / 1e3)
ratio = f" = {padded / dense_tps:.3f} of the dense step alone ({dense_tps:,.0f})" if dense_tps else ""
line = f"{arm}: {padded:,.0f} padded tokens/s{ratio}; {tps:,.0f} non-padding; {ms:.1f} ms/step over {len(later)} windows; windows ms " + \
    " ".join(f"{r['seconds_per_step']*1e3:.0f}" for r in recs)
print(line); open(g / "arms_summary.txt", "a").write(line + "\n")
PY
  pack
done
cat "$G/arms_summary.txt"
