#!/usr/bin/env bash
# On a GPU machine (V100, A100, H100): the GPU tests, the speed benches on the GPU and the real pre-training
# pipeline, then one summary against the targets. Needs the project's normal set-up (`make setup`: the
# package, DeepSpeed, transformers 5.24, cn_clip's vocab for the tests that build shards); it checks that
# first and says what is missing. On a CPU-only machine it says so and runs nothing.
#
#   bash scripts/gpu_check.sh                       # all parts; writes runs/gpu_check/{*.txt,*.json,summary.txt}
#   PARTS="bench_pretrain pipeline" bash scripts/gpu_check.sh   # a subset: tests skill_ffn generate
#                              # bench_pretrain pipeline pipeline_compile pipeline_dense (default: all),
#                              # pipeline_json (the JSON's ZeRO communication options kept on one GPU), profile,
#                              # corpus_packed corpus_unpacked (the packaged corpus, packed rows and --no-packing),
#                              # v100_fp16 (ds_configs/v100_fp16.json on the packaged corpus: the V100 arm),
#                              # bart_packed bart_unpacked (BART denoising, --arch bart at BART_PRESET, on the
#                              # packaged corpus: both sides packed, and --no-packing)
#   STEPS=60 PRESET=base SEQ=512 bash scripts/gpu_check.sh        # the pipeline arm's size (defaults shown)
#   DTYPES=bf16 bash scripts/gpu_check.sh           # the benches' dtypes (default: fp16, and bf16 where supported)
#   PART_TIMEOUT=900                                # seconds each part may run before it is stopped (default)
#
# Targets (issue "GPU speed"): pipeline padded tokens/s >= 0.85 of the dense model step alone at equal
# activated FLOPs; SkillNet step with its optimizer / dense step with fused AdamW >= 0.95; MFU >= 0.40 of the
# datasheet bf16 peak (H100, base, seq 512); fused skill FFN / dense FFN <= 1.10 at every k; SkillNet-BART
# generate and train >= 0.95 of HF at equal activated width. Packing (issue "No padding anywhere"): SkillNet-BART
# training real tokens/s >= 2x HF on the same padded batches (bench_generate's train_packed_over_dense, and the
# bart_packed / bart_unpacked arms' real tokens/s); generate >= 0.95 of HF.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${GPU_CHECK_OUT:-runs/gpu_check}
PARTS=${PARTS:-tests skill_ffn generate bench_pretrain pipeline pipeline_compile pipeline_dense corpus_packed corpus_unpacked v100_fp16 bart_packed bart_unpacked}
BART_PRESET=${BART_PRESET:-base}
STEPS=${STEPS:-60}
PRESET=${PRESET:-base}
SEQ=${SEQ:-512}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
want() { [[ " $PARTS " == *" $1 "* ]]; }
T="timeout ${PART_TIMEOUT:-900}"
# Images that ship only python3 or only python (the DeepSpeed launcher re-runs sys.executable).
PY=$(command -v python3 || command -v python)

# The set-up this script needs, each missing piece named with its fix.
"$PY" - <<'PY' 2>&1 | tee "$OUT/setup.txt"
import importlib.util, sys
missing = []
for mod, fix in (("skillnet", "make setup (or pip install the project's wheel)"),
                 ("deepspeed", "make setup (pip install 'deepspeed>=0.19,<0.20'; DS_BUILD_OPS=0 builds a pure-Python wheel)"),
                 ("crf", "pip install pytorch-crf==0.7.2"),
                 ("cn_clip", "pip install --no-deps cn_clip==1.6.0 (the tests that build shards need its vocab)")):
    if importlib.util.find_spec("torchcrf" if mod == "crf" else mod) is None:
        missing.append(f"  {mod}: {fix}")
import transformers
if not transformers.__version__.startswith("5.24"):
    missing.append(f"  transformers {transformers.__version__}: the project is tested with 5.24 (pip install transformers==5.24.0)")
print("set-up: complete" if not missing else "set-up: missing (the parts that need them fail or are skipped):\n" + "\n".join(missing))
PY
echo "parts: $PARTS (pipeline arms: $STEPS steps of preset $PRESET at sequence $SEQ, deepspeed --num_gpus 1 pretrain/run.py)"
"$PY" - <<'PY' || { echo "no CUDA device: stopping here; every part above needs one (the gpu tests are skipped on CPU)"; exit 1; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PY
"$PY" -c "import torch; p = torch.cuda.get_device_properties(0); print(f'GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16: {torch.cuda.is_bf16_supported()}, torch {torch.__version__}')" | tee "$OUT/summary.txt"
tests_rc=0
if want tests; then
  $T "$PY" -m pytest -m gpu -rA -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$OUT/pytest.txt"
  tests_rc=${PIPESTATUS[0]}
fi
dtypes="fp16"
"$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_bf16_supported() else 1)" && dtypes="fp16 bf16"
main_dt=${dtypes##* }  # bf16 where supported, else fp16
dtypes=${DTYPES:-$dtypes}
last_json() { tail -n 1 "$1" > "$2"; }
for dt in $dtypes; do
  if want skill_ffn; then
    $T "$PY" bench/skill_ffn.py --device cuda --dtype "$dt" --json | tee "$OUT/bench_skill_ffn_$dt.txt"
    last_json "$OUT/bench_skill_ffn_$dt.txt" "$OUT/bench_skill_ffn_$dt.json"
  fi
  if want generate; then
    $T "$PY" bench/generate.py --device cuda --dtype "$dt" --sizes small,base --json | tee "$OUT/bench_generate_$dt.txt"
    last_json "$OUT/bench_generate_$dt.txt" "$OUT/bench_generate_$dt.json"
  fi
done
if want bench_pretrain; then
  $T "$PY" bench/pretrain.py --device cuda --dtype "$main_dt" --preset "$PRESET" --seq "$SEQ" --batch 32 --reps 6 --json \
    | tee "$OUT/bench_pretrain.txt"
  last_json "$OUT/bench_pretrain.txt" "$OUT/bench_pretrain.json"
fi
ds_json=ds_configs/a100_bf16.json
[ "$main_dt" = fp16 ] && ds_json=ds_configs/v100_fp16.json
pipeline_args=(--ds_config "$ds_json" --synthetic 20000 --preset "$PRESET" --max_seq_len "$SEQ" --log_every 10
               --no_progress --no_tensorboard --resume none)
# Dense BERT through the same pipeline at SkillNet's mean activated FFN width over the MLM/NSP mix.
dense_width=$("$PY" -c "
from skillnet.model import SkillNetBertConfig as C
c = C.preset('$PRESET'); ks = [len(c.task_skill_names(o)) for o in ('mlm', 'nsp')]
print(round(sum(ks) / len(ks) * c.intermediate_size))" 2>/dev/null)
echo "{\"intermediate_size\": ${dense_width:-3072}}" > "$OUT/dense_width.json"
# The profiled steps are the run's last five: the profiler's overhead and its trace export then fall in the
# last logged window, which the summary leaves out (steps are 1-based).
prof_first=$(( STEPS - 4 )); prof_last=$STEPS
run_pipeline() {  # NAME ARGS...: the real pipeline, as a user launches it (launcher, trainer, loader workers)
  local name=$1; shift
  rm -rf "${OUT:?}/$name"
  port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  $T deepspeed --num_gpus 1 --master_port "$port" pretrain/run.py "${pipeline_args[@]}" --max_steps "$STEPS" \
    --output_dir "$OUT/$name" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name exit $?" >> "$OUT/$name.txt"
  tail -n 2 "$OUT/$name.txt"
}
want pipeline && run_pipeline pipeline --profile_steps "$prof_first:$prof_last"
want pipeline_compile && run_pipeline pipeline_compile --compile
# The JSON's overlap_comm / contiguous_gradients kept on one GPU (the default turns them off there).
want pipeline_json && run_pipeline pipeline_json --zero_comm json
want pipeline_dense && run_pipeline pipeline_dense --dense --model_config "$OUT/dense_width.json"
# The packaged corpus (not --synthetic): real documents, most far shorter than a row. Packed rows (the default)
# against one sample per row; the summary reports MFU on real tokens for both.
if want corpus_packed || want corpus_unpacked || want v100_fp16 || want bart_packed || want bart_unpacked; then
  "$PY" -m skillnet.data_prep sample-corpus --out "$OUT/corpus.txt" --overwrite > "$OUT/corpus_build.txt" 2>&1 &&
    "$PY" -m skillnet.data_prep build "$OUT/corpus.txt" --out "$OUT/shards" --overwrite --no-progress >> "$OUT/corpus_build.txt" 2>&1 ||
    echo "packaged corpus: build failed (see $OUT/corpus_build.txt)"
  # These arms read the shards in place of the synthetic corpus.
  pipeline_args=(--ds_config "$ds_json" --shards "$OUT/shards" --preset "$PRESET" --max_seq_len "$SEQ" --log_every 10
                 --no_progress --no_tensorboard --resume none)
  want corpus_packed && run_pipeline corpus_packed
  want corpus_unpacked && run_pipeline corpus_unpacked --no_packing
  # V100's config (fp16, loss scaling, no bf16) on any card: it must run; its speed is a V100's business.
  want v100_fp16 && run_pipeline v100_fp16 --ds_config ds_configs/v100_fp16.json --max_steps 20
  # BART denoising on the same shards (later flags win): packed on both sides, and one sample per row.
  want bart_packed && run_pipeline bart_packed --arch bart --preset "$BART_PRESET"
  want bart_unpacked && run_pipeline bart_unpacked --arch bart --preset "$BART_PRESET" --no_packing
fi
if want profile; then
  # The same run's host side under cProfile (one process, no launcher): where the host spends a step.
  rm -rf "$OUT/profile"
  port=$("$PY" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    $T "$PY" -m cProfile -o "$OUT/profile.pstats" pretrain/run.py "${pipeline_args[@]}" --max_steps 30 \
    --output_dir "$OUT/profile" > "$OUT/profile_run.txt" 2>&1
  "$PY" -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(40)" \
    "$OUT/profile.pstats" > "$OUT/profile.txt" 2>&1
  head -n 60 "$OUT/profile.txt"
fi
"$PY" scripts/gpu_summary.py "$OUT" --steps "$STEPS" --seq "$SEQ" --preset "$PRESET" --ds-config "$ds_json" \
  | tee -a "$OUT/summary.txt"
exit "$tests_rc"
