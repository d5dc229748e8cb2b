"""Launches and the autograd Function of the chunk-attention Triton kernels (``kernels.py`` has the algorithm and
the packed-document (``cu_seqlens``) design: one-chunk query tiles over the rows of a ``ChunkTable`` built once per
call on the device, no host sync, and saved for the backward)."""

from __future__ import annotations

import math

import torch
import triton

from ...common.order import selected_first
from ...common.triton import interpreting
from ...common.varlen import ChunkTable, check_packed, chunk_table
from ..naive import validate_chunk_attention_inputs
from .config import DEFAULT_CONFIG, ChunkAttentionConfig
from .kernels import _bwd_kernel, _dkv_kernel, _dq_kernel, _fwd_kernel
from .support import supported

__all__ = ["triton_chunk_attention"]

LOG2E = 1.4426950408889634


@torch.library.custom_op("hybrid_attention::chunk_routing_lists", mutates_args=())
def _routing_lists_op(routing: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r = (routing if routing.dtype == torch.bool else routing > 0.5).transpose(1, 2)
    idx = selected_first(r).to(torch.int32)
    cnt = torch.nn.functional.pad(r.to(torch.int32).cumsum(-1), (1, 0)).to(torch.int32).contiguous()
    return r.to(torch.int32).contiguous(), idx, cnt


@_routing_lists_op.register_fake
def _(routing):
    B, N, Hn = routing.shape
    r = routing.new_empty(B, Hn, N, dtype=torch.int32)
    return r, torch.empty_like(r), routing.new_empty(B, Hn, N + 1, dtype=torch.int32)


def _routing_lists(routing: torch.Tensor):
    """routing [B, N, Hn] -> (r [B, Hn, N] int32, idx [B, Hn, N] int32 routed chunks first (ascending),
    cnt [B, Hn, N + 1] int32: number of routed chunks before chunk n). All on the device, no host sync.

    A custom op, so opaque to the compiler. DECISION: inductor otherwise fuses these index ops with the router's
    softmax into one split-scan Triton kernel that fails to compile at 512 chunks (natsl-hybrid-340m at 1×32768 and
    2×16384 under ``bench train``, torch 2.11 / triton 3.6, H200)."""
    return _routing_lists_op(routing.detach())


def _p2(x: int) -> int:
    return max(16, triton.next_power_of_2(int(x)))


def _qc(C: int, qc: int) -> int:
    """Chunks per query tile: the configured ``qc`` capped at 128 // C (1 for C > 64)."""
    return max(1, min(qc, 128 // C)) if C <= 64 else 1


def _vl_ptrs(vl: ChunkTable | None, unused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cu [N + 1], indices [NT, 2], offsets [N + 1]) of the table; ``unused`` three times when not packed."""
    return (vl.cu, vl.indices, vl.offsets) if vl is not None else (unused, unused, unused)


def _launch_fwd(q, k, v, r, idx, cnt, bias, scale, C, G, config, store_o32=False, vl: ChunkTable | None = None):
    """vl: the ``ChunkTable`` of packed documents (None when not packed); r, idx, cnt: ``_routing_lists``."""
    B, T, HS, DK = q.shape
    DV = v.shape[-1]
    N = r.shape[-1]  # chunks of the routing: ceil(T / C), or the true Nc when packed
    QC = _qc(C, config.fwd_qc) if vl is None else 1  # packed: one-chunk query tiles (chunk starts are not aligned)
    o = config.empty(B, T, HS, DV, device=q.device, dtype=q.dtype)
    lse = config.empty(B, HS, T, device=q.device, dtype=torch.float32)
    o32 = config.empty(B, T, HS, DV, device=q.device, dtype=torch.float32) if store_o32 else lse
    interp = interpreting()
    _fwd_kernel[(vl.n_rows if vl is not None else triton.cdiv(T, QC * C), B * HS)](
        q, k, v, o, o32, lse, idx, cnt, r, bias if bias is not None else lse, *_vl_ptrs(vl, idx),
        scale * LOG2E, T, N, HS, G,
        DK=DK, DV=DV, BDK=_p2(DK), BDV=_p2(DV), C=C, QC=QC, HAS_BIAS=bias is not None, WHILE_LOOP=interp, UPCAST=interp,
        STORE_O32=store_o32, VARLEN=vl is not None, num_warps=config.fwd_warps, num_stages=config.fwd_stages,
    )
    return o, (o32 if store_o32 else o), lse


def _launch_bwd(q, k, v, o, lse, do, r, idx, cnt, bias, scale, C, G, config, vl: ChunkTable | None = None):
    """dq, dk, dv ``[B, T, HS, D*]`` (q / k / v's dtypes) and Σ dS per (b, head, key chunk) ``[B, HS, N]`` fp32,
    by ``config.bwd_mode``: "two_pass" (dq kernel, then dk/dv kernel) or "one_pass" (``_bwd_kernel``)."""
    B, T, HS, DK = q.shape
    DV = v.shape[-1]
    varlen = vl is not None
    N = r.shape[-1]
    n_rows = vl.n_rows if varlen else math.ceil(T / C)  # the dk/dv grid: one program per key chunk (row)
    cu, ci, co = _vl_ptrs(vl, idx)
    interp = interpreting()
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()  # [B, HS, T]; o is the fp32 copy
    dk = config.empty(*k.shape, device=k.device, dtype=k.dtype)
    dv = config.empty(*v.shape, device=v.device, dtype=v.dtype)
    dbias = config.empty(B, HS, N, device=q.device, dtype=torch.float32)
    bias_arg = bias if bias is not None else lse
    common = dict(DK=DK, DV=DV, BDK=_p2(DK), BDV=_p2(DV), C=C, HAS_BIAS=bias is not None, WHILE_LOOP=interp,
                  UPCAST=interp, VARLEN=varlen)
    if config.bwd_mode == "one_pass":
        # The atomics add into dq, so its buffer starts at zero whatever config.poison says (every real token
        # gets its own chunk's share, so nothing is left unwritten there; dk, dv, Σ dS stay poisoned).
        dq32 = torch.zeros(*q.shape, device=q.device, dtype=torch.float32)
        _bwd_kernel[(n_rows, B * HS)](
            q, k, v, do, lse, delta, dq32, dk, dv, dbias, r, bias_arg, cu, ci, scale, scale * LOG2E, T, N, HS, G,
            QB=min(config.onepass_qb, C), **common, num_warps=config.onepass_warps, num_stages=config.onepass_stages,
        )
        return (dq32 if q.dtype == torch.float32 else dq32.to(q.dtype)), dk, dv, dbias
    dq = config.empty(*q.shape, device=q.device, dtype=q.dtype)
    QC = _qc(C, config.dq_qc) if not varlen else 1
    _dq_kernel[(n_rows if varlen else triton.cdiv(T, QC * C), B * HS)](
        q, k, v, do, lse, delta, dq, idx, cnt, r, bias_arg, cu, ci, co, scale, scale * LOG2E, T, N, HS, G,
        QC=QC, **common, num_warps=config.dq_warps, num_stages=config.dq_stages,
    )
    _dkv_kernel[(n_rows, B * HS)](
        q, k, v, do, lse, delta, dk, dv, dbias, r, bias_arg, cu, ci, scale, scale * LOG2E, T, N, HS, G,
        QB=min(config.dkv_qb, C), **common, num_warps=config.dkv_warps, num_stages=config.dkv_stages,
    )
    return dq, dk, dv, dbias


class _TritonChunkAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, routing, bias, scale, C, G, config, cu, co, ci):
        vl = ChunkTable(cu, co, ci, C) if cu is not None else None  # the three tensors of the call's chunk table
        r, idx, cnt = _routing_lists(routing)
        o, o32, lse = _launch_fwd(q, k, v, r, idx, cnt, bias, scale, C, G, config, store_o32=True, vl=vl)
        ctx.save_for_backward(q, k, v, o32, lse, r, idx, cnt, bias, cu, co, ci)
        ctx.cfg = (scale, C, G, bias.dtype if bias is not None else None, config)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, r, idx, cnt, bias, cu, co, ci = ctx.saved_tensors
        scale, C, G, bias_dtype, config = ctx.cfg
        vl = ChunkTable(cu, co, ci, C) if cu is not None else None
        dq, dk, dv, dbias = _launch_bwd(q, k, v, o, lse, do.contiguous(), r, idx, cnt, bias, scale, C, G, config, vl)
        d_bias = None
        if bias_dtype is not None:
            B, HS, N = dbias.shape
            d_bias = dbias.view(B, HS // G, G, N).sum(2).to(bias_dtype)  # [B, Hn, N] like the saved bias
        return dq, dk, dv, None, d_bias, None, None, None, None, None, None, None


def triton_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: torch.Tensor,
    *,
    chunk_size: int = 64,
    group_size: int = 1,
    scale: float | None = None,
    routing_bias: torch.Tensor | None = None,
    config: ChunkAttentionConfig = DEFAULT_CONFIG,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Chunk attention on Triton kernels; same contract as ``naive_chunk_attention``.

    Shapes: q, k ``[B, T, Hs, Dk]``; v ``[B, T, Hs, Dv]``; routing, routing_bias ``[B, ceil(T / C), Hs // G]``.
    Returns ``o [B, T, Hs, Dv]`` in ``v.dtype``. Differentiable in q, k, v and ``routing_bias`` (d bias = Σ dS over
    the cross-chunk pairs of the bias's chunk and decision head). q, k, v are computed in a common dtype (q's).
    ``config``: the launch settings (``config.py``). ``cu_seqlens [N + 1]``: packed documents (B == 1,
    ``ops/common/varlen.py``): routing, routing_bias ``[1, Nc, Hs // G]`` with ``Nc = Σ ceil(len_i / C)``. No host
    sync: the ``ChunkTable`` is built on the device (``varlen.chunk_table``); a device ``cu_seqlens`` is checked for
    dtype and shape only and the routing for Nc within its bounds (``varlen.check_packed``), a CPU one fully.
    """
    if cu_seqlens is None:
        validate_chunk_attention_inputs(q, k, v, routing, chunk_size, group_size, routing_bias)
    else:  # routing's Nc checked here (exactly, or within bounds for device offsets); the rest below
        check_packed(cu_seqlens, q, chunk_size, {"routing": routing, "routing_bias": routing_bias})
        validate_chunk_attention_inputs(q, k, v, routing, chunk_size, group_size, routing_bias,
                                        n_chunks=routing.shape[1])
    if not supported(q, v, chunk_size):
        raise ValueError("triton_chunk_attention: unsupported inputs (need CUDA or TRITON_INTERPRET=1, not float64, "
                         "chunk_size in {16, 32, 64, 128}, head dims <= 256)")
    B, T, HS, DK = q.shape
    scale = DK**-0.5 if scale is None else float(scale)
    if T == 0:
        return v.new_zeros(B, 0, HS, v.shape[-1])
    dt = q.dtype
    q, k, v = (x.to(dt).contiguous() for x in (q, k, v))
    bias = routing_bias.float().transpose(1, 2).contiguous() if routing_bias is not None else None  # [B, Hn, N]
    vl = chunk_table(cu_seqlens, T, chunk_size, q.device) if cu_seqlens is not None else None  # device ops only
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, routing_bias)):
        tabs = (vl.cu, vl.offsets, vl.indices) if vl is not None else (None, None, None)
        o = _TritonChunkAttention.apply(q, k, v, routing, bias, scale, chunk_size, group_size, config, *tabs)
    else:
        r, idx, cnt = _routing_lists(routing)
        o, _, _ = _launch_fwd(q, k, v, r, idx, cnt, bias, scale, chunk_size, group_size, config, vl=vl)
    return o.to(v.dtype) if o.dtype != v.dtype else o
