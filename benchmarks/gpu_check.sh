#!/usr/bin/env bash
# One-GPU check of the GPU backends (issue 9); under 8 minutes on one H200 (every phase has a
# hard timeout, 470 s in all). Needs `pip install -e '.[gpu]'` and one CUDA GPU; downloads
# nothing (the model is random). Prints rollout tokens/s vs standalone vLLM, training MFU and
# the vLLM-vs-trainer log-prob mismatch; exits non-zero if a phase failed or the log-probs
# disagree. Logs and JSON results: $OUT (default /tmp/rlbench_gpu_check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/rlbench_gpu_check}
rm -rf "$OUT" && mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python}
status=0
phase() {  # phase NAME SECONDS CMD...: run with a hard timeout, log to $OUT/NAME.log
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "[gpu_check] $name: rc=$rc in $((SECONDS - t0))s (log $OUT/$name.log)"
  [ $rc -eq 0 ] || { status=1; tail -n 15 "$OUT/$name.log"; }
}
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader || true
phase gpu_tests 100 $PY -m pytest -q -m gpu -rs tests/test_gpu_engines.py
phase build 30 $PY benchmarks/gpu_check.py build "$OUT/model"
phase standalone 70 $PY benchmarks/gpu_check.py standalone "$OUT/model" "$OUT/standalone.json"
phase train_vllm_megatron 130 $PY benchmarks/gpu_check.py train vllm_megatron "$OUT/model" "$OUT/train_vllm_megatron.json"
phase train_vllm_hf 90 $PY benchmarks/gpu_check.py train vllm_hf "$OUT/model" "$OUT/train_vllm_hf.json"
phase train_hf 50 $PY benchmarks/gpu_check.py train hf "$OUT/model" "$OUT/train_hf.json"
grep -E "passed|failed|skipped" "$OUT/gpu_tests.log" | tail -n 1
$PY benchmarks/gpu_check.py summary "$OUT" || status=1
exit $status
