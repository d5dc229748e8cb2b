"""Host side of the causal-convolution Triton op (``triton_causal_conv1d``): the launches of ``kernels.py``, the
autograd rule and the ``torch.library`` registration (opaque to ``torch.compile``, with fake implementations)."""

from __future__ import annotations

import torch
import triton

from ...common.triton.eager import eager_function
from ...common.triton.hooks import NO_HOOKS, LaunchHooks
from ...common.triton.ssm_scan import op_table
from ...common.varlen import chunk_table
from ..naive import validate_conv_inputs
from . import kernels as K
from .config import DEFAULT_CONFIG, CausalConvConfig
from .support import MAX_KERNEL_SIZE

__all__ = ["triton_causal_conv1d"]


def _rows_apart(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels read it: channels contiguous and every token's row the same stride apart (``x.stride(1)``,
    the kernels' SX; a column slice of a wider [B, T, W] tensor, such as a fused projection's output, is read in
    place), else a contiguous copy."""
    B, T, _ = x.shape
    if x.stride(2) == 1 and (B == 1 or x.stride(0) == T * x.stride(1)):
        return x
    return x.contiguous()


_BWD_KERNELS = {"reload": K._conv_bwd_kernel, "shifted": K._conv_bwd_shifted_kernel, "walk": K._conv_bwd_walk_kernel}


def _state_block(K_: int) -> int:
    """Rows of the per-sequence state kernels' tiles: the K-1 state slots, padded to a power of two >= 2."""
    return max(2, triton.next_power_of_2(K_ - 1))


def _fwd_impl(x, weight, init, cu, co, ci, silu: bool, need_final: bool, *,
              cfg: CausalConvConfig = DEFAULT_CONFIG, hooks: LaunchHooks = NO_HOOKS):
    B, T, C = x.shape
    Kw = weight.shape[1]
    cfg = cfg.for_width(Kw)
    vl = op_table(T, cu, co, ci, cfg.BT)
    n_seq = B if vl is None else vl.n_docs
    y = cfg.empty_like(x)
    fin = cfg.empty(n_seq, C, Kw - 1, device=x.device, dtype=x.dtype) if need_final else x.new_empty(0)
    if T == 0:  # dense only (documents are non-empty): the final state is the initial one
        if need_final:
            fin = init.to(x.dtype, copy=True) if init is not None else torch.zeros_like(fin)
        return y, fin
    cu_p, ci_p = (x, x) if vl is None else (vl.cu, vl.indices)
    NT = triton.cdiv(T, cfg.BT) if vl is None else vl.n_rows
    init_t = init.mT.contiguous() if init is not None else x  # [N, K-1, C]: channels contiguous, as x
    fwd_kernel = K._conv_fwd_walk_kernel if cfg.fwd_form == "walk" else K._conv_fwd_kernel
    with hooks.stage("conv_fwd"):
        h = fwd_kernel[(NT, triton.cdiv(C, cfg.BC), B)](
            x, weight, init_t, cu_p, ci_p, y, T, x.stride(1), C,
            K=Kw, BT=cfg.BT, BC=cfg.BC, SILU=silu, HAS_INIT=init is not None, IS_VARLEN=vl is not None,
            num_warps=cfg.warps_fwd,
        )
    hooks.record("conv_fwd", h)
    if need_final and Kw > 1:
        with hooks.stage("conv_final"):
            h = K._conv_final_kernel[(n_seq, triton.cdiv(C, cfg.BC_STATE))](
                x, init_t, cu_p, fin, T, x.stride(1), C,
                K=Kw, KP=_state_block(Kw), BC=cfg.BC_STATE, HAS_INIT=init is not None, IS_VARLEN=vl is not None,
            )
        hooks.record("conv_final", h)
    return y, fin


def _bwd_impl(x, weight, init, cu, co, ci, dy, dfinal, silu: bool, *,
              cfg: CausalConvConfig = DEFAULT_CONFIG, hooks: LaunchHooks = NO_HOOKS):
    B, T, C = x.shape
    Kw = weight.shape[1]
    cfg = cfg.for_width(Kw)
    vl = op_table(T, cu, co, ci, cfg.BT)
    n_seq = B if vl is None else vl.n_docs
    has_dfinal = dfinal is not None and Kw > 1
    dfin_t = dfinal.mT.contiguous() if has_dfinal else x  # [N, K-1, C], as the initial state
    dinit = x.new_empty(0, dtype=torch.float32)
    if init is not None:  # written by the state kernel when K > 1 and T > 0
        dinit = cfg.empty(n_seq, C, Kw - 1, device=x.device) if Kw > 1 and T > 0 else torch.zeros_like(init).float()
    if T == 0:  # dense only: the final state is the initial one
        if init is not None and has_dfinal:
            dinit = dfinal.to(torch.float32, copy=True)
        return torch.zeros_like(x), torch.zeros_like(weight), dinit.to(init.dtype) if init is not None else dinit
    dy = dy.contiguous()
    cu_p, ci_p = (x, x) if vl is None else (vl.cu, vl.indices)
    NT = triton.cdiv(T, cfg.BT) if vl is None else vl.n_rows
    dx = cfg.empty_like(x)
    dw_part = cfg.empty(B * NT, Kw, C, device=x.device)
    init_t = init.mT.contiguous() if init is not None else x
    bwd_kernel = _BWD_KERNELS[cfg.bwd_form]
    with hooks.stage("conv_bwd"):
        h = bwd_kernel[(NT, triton.cdiv(C, cfg.BC_BWD), B)](
            x, weight, init_t, cu_p, ci_p, dy, dfin_t, dx, dw_part, T, x.stride(1), C,
            K=Kw, BT=cfg.BT, BC=cfg.BC_BWD, SILU=silu, HAS_INIT=init is not None, HAS_DFINAL=has_dfinal,
            IS_VARLEN=vl is not None, num_warps=cfg.warps_bwd,
        )
    hooks.record("conv_bwd", h)
    if init is not None and Kw > 1:
        with hooks.stage("conv_dinit"):
            h = K._conv_dinit_kernel[(n_seq, triton.cdiv(C, cfg.BC_STATE))](
                x, weight, init_t, cu_p, dy, dfin_t, dinit, T, x.stride(1), C,
                K=Kw, KP=_state_block(Kw), BC=cfg.BC_STATE, SILU=silu, HAS_DFINAL=has_dfinal,
                IS_VARLEN=vl is not None,
            )
        hooks.record("conv_dinit", h)
    with hooks.stage("host_reduce"):
        dw = dw_part.sum(0).t().contiguous().to(weight.dtype)
    return dx, dw, dinit.to(init.dtype) if init is not None else dinit


# ----------------------------------------------------------------------------------------------------------------------
# torch.library registration


@torch.library.custom_op("hybrid_attention::causal_conv1d_fwd", mutates_args=())
def causal_conv1d_fwd_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    init: torch.Tensor | None,
    cu: torch.Tensor | None,
    co: torch.Tensor | None,
    ci: torch.Tensor | None,
    silu: bool,
    need_final: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``hybrid_attention::causal_conv1d_fwd`` (opaque to ``torch.compile``) -> (y [B, T, C], final [N, C, K-1] in
    x's dtype, or an empty tensor without ``need_final``); ``causal_conv1d_bwd`` returns (dx, dweight, dinit). It runs
    ``DEFAULT_CONFIG``. x [B, T, C] with contiguous channels and its rows ``x.stride(1)`` apart (``_rows_apart``),
    weight [C, K] contiguous, init [N, C, K-1] or None; (cu, co, ci) the
    ``ChunkTable`` of packed documents for chunks of ``DEFAULT_CONFIG.BT`` tokens (all None for dense inputs)."""
    return _fwd_impl(x, weight, init, cu, co, ci, silu, need_final)


@causal_conv1d_fwd_op.register_fake
def _(x, weight, init, cu, co, ci, silu, need_final):
    n_seq = x.shape[0] if cu is None else cu.shape[0] - 1
    fin = x.new_empty(n_seq, x.shape[2], weight.shape[1] - 1) if need_final else x.new_empty(0)
    return x.new_empty(x.shape), fin


@torch.library.custom_op("hybrid_attention::causal_conv1d_bwd", mutates_args=())
def causal_conv1d_bwd_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    init: torch.Tensor | None,
    cu: torch.Tensor | None,
    co: torch.Tensor | None,
    ci: torch.Tensor | None,
    dy: torch.Tensor,
    dfinal: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(x, weight, init, cu, co, ci, dy, dfinal, silu)


@causal_conv1d_bwd_op.register_fake
def _(x, weight, init, cu, co, ci, dy, dfinal, silu):
    dinit = torch.empty_like(init) if init is not None else x.new_empty(0, dtype=torch.float32)
    return x.new_empty(x.shape), torch.empty_like(weight), dinit


def _setup_context(ctx, inputs, output):
    x, weight, init, cu, co, ci, silu, need_final = inputs
    ctx.save_for_backward(x, weight, init, cu, co, ci)
    ctx.silu, ctx.need_final, ctx.has_init = silu, need_final, init is not None


def _grads(ctx, dy, dfinal, bwd):
    """Gradients of the forward op's inputs from (dy, dfinal), computed by ``bwd`` (the registered backward op, or
    the eager path's ``_bwd_impl`` with its config)."""
    x, weight, init, cu, co, ci = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(x)
    if not ctx.need_final or (dfinal is not None and dfinal.numel() == 0):
        dfinal = None
    dx, dw, dinit = bwd(x, weight, init if ctx.has_init else None, cu, co, ci, dy, dfinal, ctx.silu)
    return dx, dw, (dinit if ctx.has_init else None), None, None, None, None, None


def _backward(ctx, dy, dfinal):
    return _grads(ctx, dy, dfinal, causal_conv1d_bwd_op)


causal_conv1d_fwd_op.register_autograd(_backward, setup_context=_setup_context)
_EagerCausalConv = eager_function(_fwd_impl, _bwd_impl, _setup_context, _grads)


# ----------------------------------------------------------------------------------------------------------------------
# public function


def triton_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    activation: str | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    config: CausalConvConfig | None = None,
    hooks: LaunchHooks | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Causal depthwise convolution on Triton kernels (same contract as ``causal_conv1d``).

    Float32 products and sums whatever the input dtype (bf16 / fp16 / fp32; float64 is refused: use the reference
    backend); y and the final state in x's dtype, the gradients in their inputs' dtypes. Kernel width K up to
    ``MAX_KERNEL_SIZE``. ``cu_seqlens``: packed documents (B == 1), no host sync (a device ``cu_seqlens`` is checked
    for dtype and shape only). ``config`` / ``hooks``: for benchmarks and tests (another launch configuration, NaN
    poisoning, launch hooks): given either, the kernels run eagerly instead of through the registered op (which runs
    ``DEFAULT_CONFIG``)."""
    validate_conv_inputs(x, weight, activation, initial_state, cu_seqlens)
    if weight.shape[1] > MAX_KERNEL_SIZE:
        raise ValueError(f"the triton backend takes kernel widths K <= {MAX_KERNEL_SIZE}, got K = {weight.shape[1]}; "
                         "use backend='reference'")
    if torch.float64 in (x.dtype, weight.dtype):
        raise ValueError("the triton backend computes in float32; use backend='reference' for float64 inputs")
    cfg = config or DEFAULT_CONFIG
    cu = co = ci = None
    if cu_seqlens is not None:
        vl = chunk_table(cu_seqlens, x.shape[1], cfg.BT, x.device)
        cu, co, ci = vl.cu, vl.offsets, vl.indices
    init = initial_state.contiguous() if initial_state is not None else None
    args = (_rows_apart(x), weight.contiguous(), init, cu, co, ci, activation == "silu", output_final_state)
    if config is None and hooks is None:
        y, fin = causal_conv1d_fwd_op(*args)
    else:
        y, fin = _EagerCausalConv.apply(cfg, hooks or NO_HOOKS, *args)
    return y, (fin if output_final_state else None)
