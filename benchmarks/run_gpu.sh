#!/usr/bin/env bash
# One device call of the GPU benchmarks (see benchmarks/NOTES.md). Run from the repository root on the GPU machine:
#   bash benchmarks/run_gpu.sh ops      # op level: interdomain, natsl, s4d sections (each prints its table)
#   bash benchmarks/run_gpu.sh models   # model level: prefill, decode (CUDA graphs), training step, Table 12
# Optional: fla wheels in .wheels/ (flash-linear-attention, fla-core, einops; carried, never a runtime dependency)
# are installed into a private folder so the sections can time fla's GDN beside ours.
set -euo pipefail
target="${1:?usage: run_gpu.sh ops|models [extra args]}"
shift
export PYTHONUNBUFFERED=1 OUT="${OUT:-.}"
source benchmarks/fla_wheels.sh
export PYTHONPATH=".${FLA_PATH}${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python -m hybrid_attention.cli bench "$target" "$@"
