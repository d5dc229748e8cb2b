#!/usr/bin/env bash
# Create (or reuse) the local virtualenv .venv and install hybrid_attention into it.
#
# torch is installed *before* the package so that pip never resolves a plain "torch" requirement to a multi-GB CUDA
# build on a CPU-only machine:
#   * torch already importable in .venv            -> keep it;
#   * an NVIDIA GPU is visible (nvidia-smi works)   -> the default PyPI build (CUDA);
#   * CPU only, a local wheel on pip's find-links   -> that wheel (offline, fast);
#   * CPU only, otherwise                           -> the CPU build from the PyTorch CPU index.
# Usage: scripts/bootstrap.sh [extras]   e.g. scripts/bootstrap.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
py="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$py" -m venv .venv
pip=".venv/bin/python -m pip"
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        $pip install "torch>=2.6"
    elif $pip install -q --no-index --no-deps "torch>=2.6" 2>/dev/null; then
        v=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('torch'))")
        $pip install -q "torch==$v"   # its dependencies, from the usual index
    else
        $pip install "torch>=2.6" --index-url https://download.pytorch.org/whl/cpu
    fi
fi
stamp=".venv/.installed-${extras:-base}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    if [ -n "$extras" ]; then $pip install -q -e ".[$extras]"; else $pip install -q -e .; fi
    touch "$stamp"
fi
