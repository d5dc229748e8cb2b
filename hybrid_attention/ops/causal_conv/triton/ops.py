"""Host side of the causal-convolution Triton op (``triton_causal_conv1d``): the launches of ``kernels.py``, the
autograd rule and the ``torch.library`` registration (opaque to ``torch.compile``, with fake implementations)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

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


def _state_block(K_: int) -> int:
    """Rows of the per-sequence state kernels' tiles: the K-1 state slots, padded to a power of two >= 2."""
    return max(2, triton.next_power_of_2(K_ - 1))


def _parts(sizes: list[int]) -> list[tuple[int, int]]:
    """(first channel, width) of each output part."""
    return list(zip([0, *itertools.accumulate(sizes[:-1])], sizes))


def _fwd_impl(x, weight, init, cu, co, ci, silu: bool, need_final: bool, sizes: list[int], *,
              cfg: CausalConvConfig = DEFAULT_CONFIG, hooks: LaunchHooks = NO_HOOKS):
    B, T, C = x.shape
    Kw = weight.shape[1]
    cfg = cfg.for_width(Kw)
    vl = op_table(T, cu, co, ci, cfg.BT)
    n_seq = B if vl is None else vl.n_docs
    walk = cfg.fwd_form == "walk"
    ys = [cfg.empty(B, T, w, device=x.device, dtype=x.dtype) for w in sizes] if walk else []
    y = None if walk else cfg.empty(B, T, C, device=x.device, dtype=x.dtype)
    fin = cfg.empty(n_seq, C, Kw - 1, device=x.device, dtype=x.dtype) if need_final else x.new_empty(0)
    if T == 0:  # dense only (documents are non-empty): the final state is the initial one
        if need_final:
            fin = init.to(x.dtype, copy=True) if init is not None else torch.zeros_like(fin)
        return (ys if walk else _split(y, sizes)), fin
    cu_p, ci_p = (x, x) if vl is None else (vl.cu, vl.indices)
    NT = triton.cdiv(T, cfg.BT) if vl is None else vl.n_rows
    init_t = init.mT.contiguous() if init is not None else x  # [N, K-1, C]: channels contiguous, as x
    flags = dict(K=Kw, BT=cfg.BT, BC=cfg.BC, SILU=silu, HAS_INIT=init is not None, IS_VARLEN=vl is not None,
                 num_warps=cfg.warps_fwd)
    with hooks.stage("conv_fwd"):
        if walk:  # one launch per part, each writing its own tensor
            for (c0, w), y_p in zip(_parts(sizes), ys):
                h = K._conv_fwd_walk_kernel[(NT, triton.cdiv(w, cfg.BC), B)](
                    x[..., c0:], weight[c0:], init_t[..., c0:], cu_p, ci_p, y_p, T, x.stride(1), C, w, **flags)
                hooks.record("conv_fwd", h)
        else:
            h = K._conv_fwd_kernel[(NT, triton.cdiv(C, cfg.BC), B)](
                x, weight, init_t, cu_p, ci_p, y, T, x.stride(1), C, **flags)
            hooks.record("conv_fwd", h)
            ys = _split(y, sizes)
    if need_final and Kw > 1:
        with hooks.stage("conv_final"):
            h = K._conv_final_kernel[(n_seq, triton.cdiv(C, cfg.BC_STATE))](
                x, init_t, cu_p, fin, T, x.stride(1), C,
                K=Kw, KP=_state_block(Kw), BC=cfg.BC_STATE, HAS_INIT=init is not None, IS_VARLEN=vl is not None,
            )
        hooks.record("conv_final", h)
    return ys, fin


def _split(y: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """The parts of a full-width output as tensors of their own (copies when there are several)."""
    return [y] if len(sizes) == 1 else [p.contiguous() for p in y.split(sizes, -1)]


def _bwd_impl(x, weight, init, cu, co, ci, dys, dfinal, silu: bool, *,
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
    dys = [d.contiguous() for d in dys]
    walk = cfg.bwd_form == "walk"
    full_dy = not walk or init is not None  # the tile forms and the initial-state kernel read dy at full width
    dy = (dys[0] if len(dys) == 1 else torch.cat(dys, -1)) if full_dy else None
    cu_p, ci_p = (x, x) if vl is None else (vl.cu, vl.indices)
    NT = triton.cdiv(T, cfg.BT) if vl is None else vl.n_rows
    dx = cfg.empty(B, T, C, device=x.device, dtype=x.dtype)
    dw_part = cfg.empty(B * NT, Kw, C, device=x.device)
    init_t = init.mT.contiguous() if init is not None else x
    flags = dict(K=Kw, BT=cfg.BT, BC=cfg.BC_BWD, SILU=silu, HAS_INIT=init is not None, HAS_DFINAL=has_dfinal,
                 IS_VARLEN=vl is not None, num_warps=cfg.warps_bwd)
    with hooks.stage("conv_bwd"):
        if walk:  # one launch per part, each reading its own dy
            for (c0, w), dy_p in zip(_parts([d.shape[-1] for d in dys]), dys):
                h = K._conv_bwd_walk_kernel[(NT, triton.cdiv(w, cfg.BC_BWD), B)](
                    x[..., c0:], weight[c0:], init_t[..., c0:], cu_p, ci_p, dy_p, dfin_t[..., c0:], dx[..., c0:],
                    dw_part[..., c0:], T, x.stride(1), C, w, **flags)
                hooks.record("conv_bwd", h)
        else:
            tile_kernel = K._conv_bwd_shifted_kernel if cfg.bwd_form == "shifted" else K._conv_bwd_kernel
            h = tile_kernel[(NT, triton.cdiv(C, cfg.BC_BWD), B)](
                x, weight, init_t, cu_p, ci_p, dy, dfin_t, dx, dw_part, T, x.stride(1), C, **flags)
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
    sizes: list[int],
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``hybrid_attention::causal_conv1d_fwd`` (opaque to ``torch.compile``) -> (y as parts [B, T, sizes[i]], final
    [N, C, K-1] in x's dtype, or an empty tensor without ``need_final``); ``causal_conv1d_bwd`` takes the parts'
    gradients and returns (dx, dweight, dinit). It runs ``DEFAULT_CONFIG``. x [B, T, C] with contiguous channels and
    its rows ``x.stride(1)`` apart (``_rows_apart``), weight [C, K] contiguous, init [N, C, K-1] or None; (cu, co, ci)
    the ``ChunkTable`` of packed documents for chunks of ``DEFAULT_CONFIG.BT`` tokens (all None for dense inputs);
    sizes: the parts' widths, summing to C."""
    return _fwd_impl(x, weight, init, cu, co, ci, silu, need_final, sizes)


@causal_conv1d_fwd_op.register_fake
def _(x, weight, init, cu, co, ci, silu, need_final, sizes):
    n_seq = x.shape[0] if cu is None else cu.shape[0] - 1
    fin = x.new_empty(n_seq, x.shape[2], weight.shape[1] - 1) if need_final else x.new_empty(0)
    return [x.new_empty(*x.shape[:2], w) for w in sizes], fin


@torch.library.custom_op("hybrid_attention::causal_conv1d_bwd", mutates_args=())
def causal_conv1d_bwd_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    init: torch.Tensor | None,
    cu: torch.Tensor | None,
    co: torch.Tensor | None,
    ci: torch.Tensor | None,
    dys: list[torch.Tensor],
    dfinal: torch.Tensor | None,
    silu: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(x, weight, init, cu, co, ci, dys, dfinal, silu)


@causal_conv1d_bwd_op.register_fake
def _(x, weight, init, cu, co, ci, dys, dfinal, silu):
    dinit = torch.empty_like(init) if init is not None else x.new_empty(0, dtype=torch.float32)
    return x.new_empty(x.shape), torch.empty_like(weight), dinit


def _setup_context(ctx, inputs, output):
    x, weight, init, cu, co, ci, silu, need_final, sizes = inputs
    ctx.save_for_backward(x, weight, init, cu, co, ci)
    ctx.silu, ctx.need_final, ctx.has_init, ctx.sizes = silu, need_final, init is not None, sizes


def _grads(ctx, dys, dfinal, bwd):
    """Gradients of the forward op's inputs from (the parts' dy, dfinal), computed by ``bwd`` (the registered
    backward op, or the eager path's ``_bwd_impl`` with its config)."""
    x, weight, init, cu, co, ci = ctx.saved_tensors
    dys = [d if d is not None else x.new_zeros(*x.shape[:2], w) for d, w in zip(dys, ctx.sizes)]
    if not ctx.need_final or (dfinal is not None and dfinal.numel() == 0):
        dfinal = None
    dx, dw, dinit = bwd(x, weight, init if ctx.has_init else None, cu, co, ci, dys, dfinal, ctx.silu)
    return dx, dw, (dinit if ctx.has_init else None), None, None, None, None, None, None


def _backward(ctx, dys, dfinal):
    return _grads(ctx, dys, dfinal, causal_conv1d_bwd_op)


def _eager_grads(ctx, *grad_outputs, bwd):
    """``_grads`` for the eager Function, whose outputs are the parts then the final state."""
    return _grads(ctx, list(grad_outputs[:-1]), grad_outputs[-1], bwd)


def _eager_fwd(*inputs, cfg: CausalConvConfig, hooks: LaunchHooks):
    """``_fwd_impl`` with the parts spread out: an autograd Function returns tensors only."""
    ys, fin = _fwd_impl(*inputs, cfg=cfg, hooks=hooks)
    return (*ys, fin)


causal_conv1d_fwd_op.register_autograd(_backward, setup_context=_setup_context)
_EagerCausalConv = eager_function(_eager_fwd, _bwd_impl, _setup_context, _eager_grads)


def _run_eager(cfg: CausalConvConfig, hooks: LaunchHooks, *args) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The eager path, returning as the registered op does: (the parts, the final state)."""
    *ys, fin = _EagerCausalConv.apply(cfg, hooks, *args)
    return ys, fin


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
    split_sizes: Sequence[int] | None = None,
    config: CausalConvConfig | None = None,
    hooks: LaunchHooks | None = None,
) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor | None]:
    """Causal depthwise convolution on Triton kernels (same contract as ``causal_conv1d``).

    Float32 products and sums whatever the input dtype (bf16 / fp16 / fp32; float64 is refused: use the reference
    backend); y and the final state in x's dtype, the gradients in their inputs' dtypes. Kernel width K up to
    ``MAX_KERNEL_SIZE``. ``cu_seqlens``: packed documents (B == 1), no host sync (a device ``cu_seqlens`` is checked
    for dtype and shape only). ``config`` / ``hooks``: for benchmarks and tests (another launch configuration, NaN
    poisoning, launch hooks): given either, the kernels run eagerly instead of through the registered op (which runs
    ``DEFAULT_CONFIG``). ``split_sizes``: the walking kernels write each part to its own contiguous tensor and read
    the parts' gradients in place (the tile forms split and concatenate around one full-width launch)."""
    validate_conv_inputs(x, weight, activation, initial_state, cu_seqlens, split_sizes)
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
    sizes = [x.shape[2]] if split_sizes is None else list(split_sizes)
    args = (_rows_apart(x), weight.contiguous(), init, cu, co, ci, activation == "silu", output_final_state, sizes)
    if config is None and hooks is None:
        ys, fin = causal_conv1d_fwd_op(*args)
    else:
        ys, fin = _run_eager(cfg, hooks or NO_HOOKS, *args)
    return (ys[0] if split_sizes is None else tuple(ys)), (fin if output_final_state else None)
