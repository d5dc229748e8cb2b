#!/usr/bin/env bash
# The Interdomain / S4D round on a GPU, from the repository root (logs in $OUT):
#   OUT=/some/dir bash benchmarks/interdomain_gpu.sh
# 1. the Interdomain kernels' CUDA tests (dense and packed, every readout, the kept-forward configurations) and the
#    state scan's;
# 2. the float64 check of the op at T 63 / 1000 / 4096 / 16384, every readout, poisoned buffers, with the
#    InterdomainConfig overrides in $CHECK_SET (e.g. "save_states=0 warps_chunk_bwd=8");
# 3. the launch table (benchmarks.interdomain_launch) of $LAUNCH_VARIANTS at $LAUNCH_SHAPES, SDPA beside;
# 4. with S4D_LONG=1, the S4D-only forms above 4096 tokens (benchmarks.s4d_conv --long-only).
# Each part has a time limit; a part that fails or times out leaves the others' output.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-.}" PYTHONPATH=.
nvidia-smi --query-gpu=name --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_LIMIT:-200}" python -m pytest -q -p no:cacheprovider -n "${TEST_WORKERS:-8}" \
    tests/ops/test_interdomain_triton.py tests/ops/test_interdomain_varlen_triton.py tests/ops/test_state_scan_triton.py 2>&1 | tee "$OUT/tests.log" | tail -n 8
  echo "interdomain tests exit ${PIPESTATUS[0]}"
fi
if [ -n "${CHECK_SET:-}" ]; then
  sets=()
  for kv in $CHECK_SET; do sets+=(--set "$kv"); done
  timeout "${CHECK_LIMIT:-150}" python -m benchmarks.interdomain_ops --correctness-only "${sets[@]}" \
    2>&1 | tee "$OUT/checks.log" | grep -E "check|PASS|FAIL|ERROR" | tail -n 12
  echo "float64 checks exit ${PIPESTATUS[0]}"
fi
# shellcheck disable=SC2086
timeout "${LAUNCH_LIMIT:-240}" python -m benchmarks.interdomain_launch --shapes ${LAUNCH_SHAPES:-16x2048x8 1x4096x16 1x32768x16} \
  --variants ${LAUNCH_VARIANTS:-default fp32_states bf16_dots} 2>&1 | tee "$OUT/launch.log" | grep "^|"
echo "launch exit ${PIPESTATUS[0]}"
if [ "${S4D_LONG:-0}" = 1 ]; then
  timeout "${S4D_LIMIT:-150}" python -m benchmarks.s4d_conv --long-only --chunk-sweep 2>&1 | tee "$OUT/s4d_long.log" | grep "^|"
  echo "s4d long exit ${PIPESTATUS[0]}"
fi
