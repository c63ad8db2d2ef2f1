#!/usr/bin/env bash
# On a GPU machine (V100 or A100): the GPU tests, then the skill-FFN and SkillNet-BART generate/train
# benches on the GPU in fp16 (and bf16 where supported), then one summary. CPU-only machines: the tests
# report "needs CUDA" and nothing runs.
#   bash scripts/gpu_check.sh            # writes runs/gpu_check/{pytest.txt,bench_*.json,summary.txt}
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu_check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python - <<'PY' || { echo "no CUDA device: nothing to check here (the gpu tests are skipped on CPU)"; exit 1; }
import sys, torch
sys.exit(0 if torch.cuda.is_available() else 1)
PY
python -c "import torch; p = torch.cuda.get_device_properties(0); print(f'GPU: {p.name}, {p.total_memory / 2**30:.0f} GiB, bf16: {torch.cuda.is_bf16_supported()}')" | tee "$OUT/summary.txt"
python -m pytest -m gpu -rA -q tests/test_gpu.py 2>&1 | tee "$OUT/pytest.txt"
tests_rc=${PIPESTATUS[0]}
dtypes="fp16"
python -c "import sys, torch; sys.exit(0 if torch.cuda.is_bf16_supported() else 1)" && dtypes="fp16 bf16"
for dt in $dtypes; do
  python bench/skill_ffn.py --device cuda --dtype "$dt" --json | tee "$OUT/bench_skill_ffn_$dt.txt"
  tail -n 1 "$OUT/bench_skill_ffn_$dt.txt" > "$OUT/bench_skill_ffn_$dt.json"
  python bench/generate.py --device cuda --dtype "$dt" --sizes small,base --json | tee "$OUT/bench_generate_$dt.txt"
  tail -n 1 "$OUT/bench_generate_$dt.txt" > "$OUT/bench_generate_$dt.json"
done
{
  echo "== summary"
  echo "gpu tests: $(tail -n 1 "$OUT/pytest.txt") (exit $tests_rc)"
  # -rA lists every outcome by test id (a skip, e.g. bf16 on a V100, is listed by file:line instead).
  bart=$(grep -E '^(PASSED|FAILED|ERROR) .*test_skill_sparse_bart_beam_search' "$OUT/pytest.txt" | cut -d' ' -f1 | sort | uniq -c | xargs)
  echo "  SkillNet-BART beam search under autocast: ${bart:-not run}"
  for dt in $dtypes; do
    python -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"skill FFN {sys.argv[2]}: fused/dense {d['fused_over_dense']:.3f}, loop/dense {d['loop_over_dense']:.3f} (target <= 1.10)\")" \
      "$OUT/bench_skill_ffn_$dt.json" "$dt"
    python -c "import json,sys; d=json.load(open(sys.argv[1])); print(f\"SkillNet-BART {sys.argv[2]}: generate/dense {d['generate_over_dense']:.3f} ({d['worst_generate']}, target >= 0.9), train/dense {d['train_over_dense']:.3f} ({d['worst_train']}, target >= 0.95)\")" \
      "$OUT/bench_generate_$dt.json" "$dt"
  done
} | tee -a "$OUT/summary.txt"
exit "$tests_rc"
