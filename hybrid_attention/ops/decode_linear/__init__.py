"""Decode-time GEMVs with their neighbours fused in (Triton): the RMSNorm before a projection, the SwiGLU after it, the
residual add after the output projections. Inference only; naive.py defines the results, ``triton/kernel.py`` holds the
kernels' design.

    y = norm_linear(x, norm_weight, W, eps)                 # RMSNorm(x) Wᵀ                  x [B, K] -> [B, N]
    h, a = add_norm_linear(y, h, norm_weight, W_gate_up, eps, "swiglu")   # silu(g) * u of RMSNorm(h + y), and h + y
    h = linear_residual(a, W_down, h)                       # h + a Wᵀ                        [B, K] -> [B, N]
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.triton import HAS_TRITON
from .naive import add_norm_linear_reference, linear_residual_reference, norm_linear_reference
from .triton import MAX_ROWS, supported
from .triton import add_norm_linear as _add_norm_linear_triton
from .triton import linear_residual as _linear_residual_triton
from .triton import norm_linear as _norm_linear_triton

__all__ = ["HAS_TRITON", "MAX_ROWS", "add_norm_linear", "add_norm_linear_reference", "linear_residual",
           "linear_residual_reference", "norm_linear",
           "norm_linear_reference", "supported"]  # MAX_ROWS and supported: re-exported from triton/support.py


def _check(op: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"{op}: x must be [B, K] and weight [N, K], got x {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)}")


def _check_norm_linear(op: str, x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                       act: str | None) -> None:
    _check(op, x, weight)
    if norm_weight.shape != (x.shape[1],):
        raise ValueError(f"{op}: norm_weight must be [K={x.shape[1]}], got {tuple(norm_weight.shape)}")
    if act not in (None, "swiglu"):
        raise ValueError(f"{op}: act must be None or 'swiglu', got {act!r}")
    if act == "swiglu" and weight.shape[0] % 2:
        raise ValueError(f"{op}: act='swiglu' needs an even N (gate | up), got N={weight.shape[0]}")


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, eps: float,
                act: str | None = None, backend: str = "auto", block_n: int | None = None) -> torch.Tensor:
    """RMSNorm(x) Wᵀ with an optional SwiGLU: x [B, K], norm_weight [K], weight [N, K] -> [B, N] (act None) or
    [B, N // 2] (act "swiglu": silu(y[:, :N/2]) * y[:, N/2:]). backend: "reference" | "triton" | "auto" (triton
    on supported CUDA inputs). block_n: the kernel's column block (default: a heuristic, ``triton/kernel.py``)."""
    _check_norm_linear("norm_linear", x, norm_weight, weight, act)
    name = resolve_backend(backend, "norm_linear", lambda: supported(x, weight))
    if name == "reference":
        return norm_linear_reference(x, norm_weight, weight, eps, act)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"norm_linear: the triton backend takes B <= {MAX_ROWS} rows, got {x.shape[0]}")
    return _norm_linear_triton(x, norm_weight, weight.contiguous(), float(eps), act, block_n)


def add_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                    eps: float, act: str | None = None, backend: str = "auto",
                    block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h = x + residual and `norm_linear(h, ...)` in one launch: x, residual [B, K] -> (h [B, K], y)."""
    if residual.shape != x.shape:
        raise ValueError(f"add_norm_linear: residual must be x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    _check_norm_linear("add_norm_linear", x, norm_weight, weight, act)
    name = resolve_backend(backend, "add_norm_linear", lambda: supported(x, residual, weight))
    if name == "reference":
        return add_norm_linear_reference(x, residual, norm_weight, weight, eps, act)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"add_norm_linear: the triton backend takes B <= {MAX_ROWS} rows, got {x.shape[0]}")
    return _add_norm_linear_triton(x, residual, norm_weight, weight.contiguous(), float(eps), act, block_n)


def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, backend: str = "auto",
                    block_n: int | None = None) -> torch.Tensor:
    """residual + x Wᵀ: x [B, K], weight [N, K], residual [B, N] -> [B, N]. backend as `norm_linear`."""
    _check("linear_residual", x, weight)
    if residual.shape != (x.shape[0], weight.shape[0]):
        raise ValueError(f"linear_residual: residual must be [B, N] = {(x.shape[0], weight.shape[0])}, got "
                         f"{tuple(residual.shape)}")
    name = resolve_backend(backend, "linear_residual", lambda: supported(x, weight))
    if name == "reference":
        return linear_residual_reference(x, weight, residual)
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"linear_residual: the triton backend takes B <= {MAX_ROWS} rows, got {x.shape[0]}")
    return _linear_residual_triton(x, weight.contiguous(), residual, block_n)
