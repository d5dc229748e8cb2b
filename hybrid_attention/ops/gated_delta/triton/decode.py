"""Fused single-token gated-delta step for decoding (one launch, state updated in place, CUDA-graph capturable).

Per (b, h): S ← e^{g} S;  u = β (v - Sᵀ k̂);  S ← S + k̂ uᵀ;  o = scale · Sᵀ q̂   (k̂, q̂ l2-normalised).
One program per (V tile, b·h) holds its [K, BV] slice of the fp32 state in registers. The NAtS-L chunk-end commit /
rollback stays a ``torch.where`` on the state in the layer; ``gated_delta_step_op`` is the registered custom op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.triton import interpreting

__all__ = ["gated_delta_step_op", "triton_gated_delta_step"]


@triton.jit
def _step_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, S_ptr, o_ptr, H, sqb, sqh, skb, skh, svb, svh,
                 K: tl.constexpr, V: tl.constexpr, BKF: tl.constexpr, BV: tl.constexpr,
                 USE_L2: tl.constexpr, EPS: tl.constexpr, SCALE: tl.constexpr):
    pv = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    kr = tl.arange(0, BKF)
    km = kr < K
    vc = pv * BV + tl.arange(0, BV)
    vm = vc < V
    # q, k, v through their (batch, head) strides: the slices of one fused projection need no copy
    q = tl.load(q_ptr + b * sqb + h * sqh + kr, mask=km, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b * skb + h * skh + kr, mask=km, other=0.0).to(tl.float32)
    if USE_L2:
        q = q / tl.sqrt(tl.sum(q * q, 0) + EPS)
        k = k / tl.sqrt(tl.sum(k * k, 0) + EPS)
    v = tl.load(v_ptr + b * svb + h * svh + vc, mask=vm, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + bh).to(tl.float32)
    beta = tl.load(beta_ptr + bh).to(tl.float32)
    offs = bh * K * V + kr[:, None] * V + vc[None, :]
    msk = km[:, None] & vm[None, :]
    S = tl.load(S_ptr + offs, mask=msk, other=0.0) * tl.exp(g)
    u = beta * (v - tl.sum(S * k[:, None], 0))
    S = S + k[:, None] * u[None, :]
    o = tl.sum(S * q[:, None], 0) * SCALE
    tl.store(S_ptr + offs, S, mask=msk)
    tl.store(o_ptr + bh * V + vc, o.to(o_ptr.dtype.element_ty), mask=vm)


def triton_gated_delta_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoding step. q, k ``[B, H, K]``; v ``[B, H, V]``; g, beta ``[B, H]``; state ``[B, H, K, V]`` float32,
    contiguous, **updated in place**. Returns ``(o [B, H, V] in v.dtype (or ``out``), state)``. Same math as
    ``naive_gated_delta`` on a length-1 sequence with ``initial_state=state``. Inference only (no autograd)."""
    B, H, K = q.shape
    V = v.shape[-1]
    if tuple(k.shape) != (B, H, K) or tuple(v.shape[:2]) != (B, H) or tuple(g.shape) != (B, H) \
            or tuple(beta.shape) != (B, H) or tuple(state.shape) != (B, H, K, V):
        raise ValueError("triton_gated_delta_step: q, k [B, H, K], v [B, H, V], g, beta [B, H], state [B, H, K, V]")
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError("triton_gated_delta_step: state must be a contiguous float32 tensor (updated in place)")
    interp = interpreting()
    if not (q.is_cuda or interp):
        raise ValueError("triton_gated_delta_step needs CUDA tensors (or TRITON_INTERPRET=1)")
    scale = K**-0.5 if scale is None else float(scale)
    # the last dim must be dense; (batch, head) strides are free (slices of the fused projection at B > 1)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    g, beta = g.contiguous(), beta.contiguous()
    if out is None:
        out = torch.empty(B, H, V, device=v.device, dtype=v.dtype)
    BKF = max(16, triton.next_power_of_2(K))
    BV = max(16, min(32 if BKF <= 128 else 16, triton.next_power_of_2(V)))
    _step_kernel[(triton.cdiv(V, BV), B * H)](
        q, k, v, g, beta, state, out, H, *q.stride()[:2], *k.stride()[:2], *v.stride()[:2],
        K=K, V=V, BKF=BKF, BV=BV, USE_L2=use_qk_l2norm, EPS=1e-6, SCALE=scale, num_warps=4,
    )
    return out, state


@torch.library.custom_op("hybrid_attention::gated_delta_step", mutates_args=("state",))
def gated_delta_step_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        state: torch.Tensor) -> torch.Tensor:
    """`triton_gated_delta_step` (default scale, q/k ℓ2-normalised) as a registered op: state [B, H, K, V] float32 is
    updated in place; returns o [B, H, V] in v.dtype. What `torch.compile` sees of the kernel (fake kernel below)."""
    return triton_gated_delta_step(q, k, v, g, beta, state)[0]


@gated_delta_step_op.register_fake
def _(q, k, v, g, beta, state):
    return v.new_empty(v.shape)
