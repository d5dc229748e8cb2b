"""Host side of the gated-RMSNorm Triton op (``triton_gated_rms_norm``): the launches of ``kernels.py``, the autograd
rule and the ``torch.library`` registration (opaque to ``torch.compile``, with fake implementations)."""

from __future__ import annotations

import torch
import triton

from ..naive import validate_gated_norm_inputs
from . import kernels as K
from .support import MAX_DIM

__all__ = ["triton_gated_rms_norm"]

ELEMENTS = 4096  # values of one [rows, D] tile per program: BR = ELEMENTS / D rows
BWD_PROGRAMS = 1024  # backward programs at most: each writes one partial dw row


def _tiles(R: int, D: int) -> tuple[int, int]:
    """(BR, BD): rows per tile and the padded width."""
    BD = max(16, triton.next_power_of_2(D))
    return max(1, min(ELEMENTS // BD, triton.next_power_of_2(max(R, 1)))), BD


@torch.library.custom_op("hybrid_attention::gated_rms_norm_fwd", mutates_args=())
def gated_rms_norm_fwd_op(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``hybrid_attention::gated_rms_norm_fwd`` (opaque to ``torch.compile``): x, gate [R, D] contiguous, weight [D]
    -> (y [R, D] in x's dtype, r [R] float32, the rows' reciprocal RMS)."""
    R, D = x.shape
    y = torch.empty_like(x)
    r = torch.empty(R, device=x.device, dtype=torch.float32)
    if R:
        BR, BD = _tiles(R, D)
        K._gated_norm_fwd_kernel[(triton.cdiv(R, BR),)](x, gate, weight, y, r, R, D, EPS=eps, BR=BR, BD=BD)
    return y, r


@gated_rms_norm_fwd_op.register_fake
def _(x, gate, weight, eps):
    return torch.empty_like(x), x.new_empty(x.shape[0], dtype=torch.float32)


@torch.library.custom_op("hybrid_attention::gated_rms_norm_bwd", mutates_args=())
def gated_rms_norm_bwd_op(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, r: torch.Tensor,
                          dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dgate, dweight) of ``gated_rms_norm_fwd`` from dy [R, D]; dx, dgate in their inputs' dtypes."""
    R, D = x.shape
    dx, dg = torch.empty_like(x), torch.empty_like(gate)
    if not R:
        return dx, dg, torch.zeros_like(weight)
    BR, BD = _tiles(R, D)
    blocks = triton.cdiv(R, BR)
    iters = triton.cdiv(blocks, min(blocks, BWD_PROGRAMS))
    programs = triton.cdiv(blocks, iters)
    dw = torch.empty(programs, D, device=x.device, dtype=torch.float32)
    K._gated_norm_bwd_kernel[(programs,)](x, gate, weight, r, dy, dx, dg, dw, R, D, iters, BR=BR, BD=BD)
    return dx, dg, dw.sum(0).to(weight.dtype)


@gated_rms_norm_bwd_op.register_fake
def _(x, gate, weight, r, dy):
    return torch.empty_like(x), torch.empty_like(gate), torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, gate, weight, _ = inputs
    ctx.save_for_backward(x, gate, weight, output[1])


def _backward(ctx, dy, _dr):
    x, gate, weight, r = ctx.saved_tensors
    dx, dg, dw = gated_rms_norm_bwd_op(x, gate, weight, r, dy.contiguous())
    return dx, dg, dw, None


gated_rms_norm_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def triton_gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Gated RMSNorm on Triton kernels (same contract as ``gated_rms_norm``): every product and sum in float32, y
    rounded once to x's dtype; D <= ``MAX_DIM``, no float64 (use the reference backend)."""
    validate_gated_norm_inputs(x, gate, weight)
    if x.shape[-1] > MAX_DIM:
        raise ValueError(f"the triton backend takes D <= {MAX_DIM}, got D = {x.shape[-1]}; use backend='reference'")
    if torch.float64 in (x.dtype, weight.dtype):
        raise ValueError("the triton backend computes in float32; use backend='reference' for float64 inputs")
    D = x.shape[-1]
    y, _ = gated_rms_norm_fwd_op(x.reshape(-1, D).contiguous(), gate.reshape(-1, D).to(x.dtype).contiguous(),
                                 weight.contiguous(), float(eps))
    return y.view(x.shape)
