"""Triton backend of the causal depthwise short convolution (forward, backward, packed documents, decode state).

Importable without triton: ``HAS_TRITON`` says whether the kernels are available, ``supported(x, weight)``
(``support.py``) whether they handle these inputs, and without triton ``triton_causal_conv1d`` raises a clear
``RuntimeError``. ``kernels.py`` holds the kernels' design, ``ops.py`` the autograd / torch.library side,
``config.py`` the frozen launch configuration (``CausalConvConfig``, passed as ``config=``).
"""

from __future__ import annotations

from ...common.triton import HAS_TRITON, missing
from .config import DEFAULT_CONFIG, CausalConvConfig
from .support import MAX_KERNEL_SIZE, supported

if HAS_TRITON:
    from .ops import triton_causal_conv1d
else:  # pragma: no cover - CPU-only installs without triton
    triton_causal_conv1d = missing("triton_causal_conv1d")

__all__ = ["HAS_TRITON", "MAX_KERNEL_SIZE", "supported", "triton_causal_conv1d", "CausalConvConfig", "DEFAULT_CONFIG"]
