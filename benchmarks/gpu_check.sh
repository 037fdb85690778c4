#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py; docs/gpu.md) on the GPU machine this project can use:
# its own Python 3.12 image (torch 2.11, transformers 5.17; no vLLM, megatron-core, omegaconf or
# hydra-core) and no package registry, so the few wheels it lacks are carried in ./.whl.
#
#   bash benchmarks/gpu_check.sh wheels   here, once: download/build the cp312 wheels into .whl
#                                         (about 3 MB) and mark .whl ignored by git
#   bash benchmarks/gpu_check.sh          there (device `run`, carry [".whl"]): install the
#                                         wheels into /tmp/site, run the check, write
#                                         $OUT/summary.json and $OUT/gpu_check.log
#
# GPU_CHECK_SMOKE=1 runs the same phases at toy sizes on a CPU (CI: tests/backends/test_gpu_check.py).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl
if [ "${1:-}" = "wheels" ]; then
  set -e
  exclude="$(git rev-parse --git-common-dir)/info/exclude"
  grep -qx "/$WHEELS/" "$exclude" 2>/dev/null || echo "/$WHEELS/" >>"$exclude"
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  PIP="${PIP:-python3 -m pip}"
  # megatron-core has compiled parts: the cp312 manylinux wheel; the others are pure Python
  $PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
    megatron-core==0.16.1 "omegaconf==2.3.*" "hydra-core==1.3.*"
  # omegaconf 2.3 pins antlr4-python3-runtime 4.9.*, published as a source archive only
  $PIP wheel --no-deps -w "$WHEELS" antlr4-python3-runtime==4.9.3
  ls -l "$WHEELS" && du -sh "$WHEELS"
  exit 0
fi
if ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$WHEELS"/*.whl || exit 3
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD:$PYTHONPATH" OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
exec python3 benchmarks/gpu_check.py run --out "${OUT:-/tmp/gpu_check}" \
  --work "${GPU_CHECK_WORK:-/tmp/rlbench_gpu_check_work}"
