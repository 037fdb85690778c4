#!/usr/bin/env bash
# One-GPU check of the GPU backends (issue 9); under 8 minutes on one H200 (every phase has a
# hard timeout, 470 s in all, plus 300 s for the Qwen2.5-VL phases when its weights are cached). Needs `pip install -e '.[gpu]'` and one CUDA GPU; downloads
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
# Qwen2.5-VL-3B on Geometry3K (images through rollout and training, issue 10): two GRPO steps
# on rendered test diagrams with the hf engine, then the same with vLLM rollout (its image slot);
# skipped unless the weights are already in the local Hugging Face cache (nothing downloads).
VL=Qwen/Qwen2.5-VL-3B-Instruct
if $PY -c "import sys, huggingface_hub as h; sys.exit(not isinstance(h.try_to_load_from_cache('$VL', 'config.json'), str))" 2>/dev/null; then
  VL_ARGS=(algorithm=grpo task=geometry3k model=qwen2p5_vl_3b_instruct trainer.steps=2
           data.prompts_per_step=2 rollout.n=4 rollout.max_new_tokens=128 trainer.eval_every=0
           trainer.micro_batch_size=4 tracking.enabled=false seed=0)
  phase qwen2p5_vl_geometry3k_hf 150 env HF_HUB_OFFLINE=1 $PY -m harness.cli train "${VL_ARGS[@]}" backend=hf backend.dtype=bfloat16 trainer.output_dir="$OUT/vl_hf"
  phase qwen2p5_vl_geometry3k_vllm 150 env HF_HUB_OFFLINE=1 $PY -m harness.cli train "${VL_ARGS[@]}" backend=vllm_hf backend.vllm.gpu_memory_utilization=0.35 trainer.output_dir="$OUT/vl_vllm"
else
  echo "[gpu_check] qwen2p5_vl_geometry3k: skipped ($VL not in the local Hugging Face cache)"
fi
grep -E "passed|failed|skipped" "$OUT/gpu_tests.log" | tail -n 1
$PY benchmarks/gpu_check.py summary "$OUT" || status=1
exit $status
