# Sourced by the GPU check scripts: when the optional fla wheels are in .wheels/ (flash-linear-attention,
# fla-core, einops; a comparison baseline, never a runtime dependency), install them into a private folder and set
# FLA_PATH=":/tmp/fla_site" for PYTHONPATH; otherwise FLA_PATH="".
FLA_PATH=""
if compgen -G ".wheels/*.whl" > /dev/null; then
  python -m pip install -q --no-deps --no-index --target /tmp/fla_site .wheels/*.whl 2>&1 | tail -2 || true
  FLA_PATH=":/tmp/fla_site"
fi
