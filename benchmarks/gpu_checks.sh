#!/usr/bin/env bash
# Correctness only, no timings (~3-5 minutes on an H200), from the repository root:
#   OUT=/some/dir bash benchmarks/gpu_checks.sh
# 1. NAtS-L op vs float64 (T 63/1000/4096/16384, softmax fractions 0/0.3/1, gradients, poisoned buffers), the NAtS-L
#    layer (auto vs reference) and our GDN forward vs fla's (when fla is importable or its wheels are in .wheels/);
# 2. the bilinear S4D Triton op vs float64 (s4d_bilinear_ops.correctness: T 63/1000/4096, poisoned buffers; the
#    linear S4D-only op is an FFT convolution without Triton kernels, covered by tests/ops);
# 3. the test suites whose kernels run on the GPU when there is one (ops, serving incl. CUDA-graph replay vs eager).
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-.}"
source benchmarks/fla_wheels.sh
nvidia-smi --query-gpu=name --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
PYTHONPATH=".${FLA_PATH}" timeout 300 python -m benchmarks.natsl_ops --checks-only
echo "natsl checks exit $?"
PYTHONPATH=. timeout 150 python - <<'EOF'
import json, os
from benchmarks import s4d_bilinear_ops
from benchmarks.common import BenchSettings
settings = BenchSettings(out=os.environ["OUT"])
results = {"s4d_bilinear": [], "errors": []}
s4d_bilinear_ops.correctness(settings, results, quick=False)
json.dump(results, open(settings.out_path("s4d_bilinear_checks.json"), "w"), indent=1)
EOF
echo "s4d_bilinear checks exit $?"
PYTHONPATH=. timeout "${TEST_LIMIT:-240}" python -m pytest -q -p no:cacheprovider -n 4 tests/ops tests/serving \
  2>&1 | tail -n 25
echo "pytest exit ${PIPESTATUS[0]}"
