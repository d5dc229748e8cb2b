"""Host side of the Triton Interdomain core (``triton_interdomain``): launches of the chunk kernels (``kernels.py``)
between the shared state scans (``ops/common/triton``), the autograd rule and the ``torch.library`` registration.
Complex tensors cross the registered ops as planar float32 (a leading re/im axis), so those ops see real tensors only.
"""

from __future__ import annotations

import torch
import triton

from ...common.planar import Planar
from ...common.ssm import validate_chunk_size
from ...common.triton import interpreting
from ...common.triton.eager import eager_function
from ...common.triton.hooks import NO_HOOKS, LaunchHooks
from ...common.triton.ssm_scan import (
    check_packed_state,
    op_table,
    planar,
    pow2_block,
    power_table,
    state_bwd,
    states_fwd,
)
from ...common.varlen import ChunkTable, check_cu_seqlens, chunk_table
from ..naive import safe_divide, validate_interdomain_inputs
from ..readout import DEFAULT_READOUT, planar_readout_operator, readout_operators, validate_readout
from . import kernels as K
from .config import DEFAULT_CONFIG, InterdomainConfig

__all__ = ["triton_interdomain", "interdomain_fwd_planar", "kernel_chunk"]


def kernel_chunk(chunk_size: int, cfg: InterdomainConfig = DEFAULT_CONFIG) -> int:
    """Chunk length used by the kernels: chunk_size if it is a power of two in [16, 128], else 64, capped at
    ``max_chunk`` (the result does not depend on the chunk size; only speed and the boundary-state memory do)."""
    return min(chunk_size if chunk_size in (16, 32, 64, 128) else 64, cfg.max_chunk)


def _lp_dot(x: torch.Tensor) -> bool:
    """q·k products on the native bf16/fp16 tensor-core path (not for float32, nor for bf16 under the interpreter,
    whose bf16 dot is broken in triton 3.6)."""
    if x.dtype == torch.float16:
        return True
    return x.dtype == torch.bfloat16 and not interpreting()


def _vl_ptrs(q: torch.Tensor, vl: ChunkTable | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu, chunk indices) pointer arguments of the chunk kernels; dense launches pass q (never read)."""
    return (q, q) if vl is None else (vl.cu, vl.indices)


def _readout_flags(kk: torch.Tensor, readout: str) -> tuple[bool, bool]:
    """The kernels' (CONJ_P, REAL_C) for ``readout``; kk must be planar [H, 2, M, M] (K, or C for "real")."""
    validate_readout(readout)
    if kk.dim() != 4 or kk.shape[1] != 2:
        raise ValueError(f"kk must be planar [H, 2, M, M], got {tuple(kk.shape)}")
    return readout == "hermitian", readout == "real"


def _fwd_impl(
    q, k, v, ll, bb, kk, init, cu, co, ci, chunk_size: int, out_fp32: bool, need_final: bool, readout: str,
    save_states: bool = False, fp32_dots: bool = False, *, cfg: InterdomainConfig = DEFAULT_CONFIG,
    hooks: LaunchHooks = NO_HOOKS,
):
    Bsz, T, H, R = q.shape
    D = v.shape[-1]
    M = ll.shape[-1]
    conj_p, real_c = _readout_flags(kk, readout)
    BT = kernel_chunk(chunk_size, cfg)
    vl = op_table(T, cu, co, ci, BT)
    out_dtype = torch.float32 if out_fp32 else q.dtype
    o = cfg.empty(Bsz, T, H, D, device=q.device, dtype=out_dtype)

    def none() -> torch.Tensor:  # an output not produced: a fresh empty tensor (the op's outputs may not alias)
        return q.new_empty(0, dtype=torch.float32)

    if T == 0:
        fin = init.clone() if init is not None else q.new_zeros(Bsz, H, 2, M, R + D, dtype=torch.float32)
        return o, (fin if need_final else none()), none(), none()
    with hooks.stage("host_prep"):
        P = power_table(ll, BT)
    states, final = states_fwd(k, v, P, bb, init, BT, True, need_final, cfg, hooks, vl)
    NT = triton.cdiv(T, BT) if vl is None else vl.n_rows
    BC = min(cfg.BC, BT)
    cu_p, ci_p = _vl_ptrs(q, vl)
    with hooks.stage("chunk_fwd"):
        h = K._chunk_fwd[(NT, Bsz * H)](
            q,
            k,
            v,
            o,
            P,
            bb,
            kk,
            states,
            cu_p,
            ci_p,
            T,
            H,
            M,
            R,
            D,
            NT,
            IS_VARLEN=vl is not None,
            BT=BT,
            BC=BC,
            BR=pow2_block(R),
            BD=pow2_block(D),
            BM=pow2_block(M),
            DOT_PREC=cfg.chunk_prec(q.dtype, fp32_dots),
            LP_DOT=_lp_dot(q),
            CONJ_P=conj_p,
            REAL_C=real_c,
            REAL_PREC=cfg.real_prec(q.dtype, fp32_dots),
            num_warps=cfg.warps_chunk_fwd,
            num_stages=cfg.stages,
        )
    hooks.record("chunk_fwd", h)
    n_seq = Bsz if vl is None else vl.n_docs
    fin = final.view(n_seq, H, 2, M, R + D) if need_final else none()
    if not save_states:
        states, P = none(), none()
    return o, fin, states, P


def _bwd_impl(
    q, k, v, ll, bb, kk, init, cu, co, ci, do, dfinal, states, P, chunk_size: int, readout: str,
    fp32_dots: bool = False, *, cfg: InterdomainConfig = DEFAULT_CONFIG, hooks: LaunchHooks = NO_HOOKS,
):
    """Gradients of ``_fwd_impl``'s inputs. states / P: the forward's chunk states and power table when it kept them
    (``save_states``), else empty (rescanned here)."""
    Bsz, T, H, R = q.shape
    D = v.shape[-1]
    M = ll.shape[-1]
    NC = R + D
    conj_p, real_c = _readout_flags(kk, readout)
    BT = kernel_chunk(chunk_size, cfg)
    dev = q.device
    f32 = torch.float32
    if T == 0:
        dinit = dfinal.clone() if (init is not None and dfinal is not None) else None
        if init is not None and dinit is None:
            dinit = torch.zeros_like(init)
        return (
            torch.zeros_like(q),
            torch.zeros_like(k),
            torch.zeros_like(v),
            torch.zeros_like(ll),
            torch.zeros_like(bb),
            torch.zeros_like(kk),
            dinit if dinit is not None else q.new_empty(0, dtype=f32),
        )
    vl = op_table(T, cu, co, ci, BT)
    NT = triton.cdiv(T, BT) if vl is None else vl.n_rows
    n_seq = Bsz if vl is None else vl.n_docs
    cu_p, ci_p = _vl_ptrs(q, vl)
    if states.numel() == 0:
        with hooks.stage("host_prep"):
            P = power_table(ll, BT)
        states, _ = states_fwd(k, v, P, bb, init, BT, True, False, cfg, hooks, vl)
    # dq and the final dk / dv in the activations' dtype where the kernels round on store (bf16, float32); the
    # chunk-local dk / dv partials stay float32 (the reverse scan adds the carry part to them)
    g_dtype = q.dtype if q.dtype in (torch.bfloat16, f32) else f32
    buf = cfg.buffers(q.dtype)
    dq = cfg.empty(Bsz, T, H, R, device=dev, dtype=g_dtype)
    dk = cfg.empty(Bsz, T, H, R, device=dev)
    dv = cfg.empty(Bsz, T, H, D, device=dev)
    dx = cfg.empty(Bsz * H, NT, 2, M, NC, device=dev, dtype=buf)
    gk_part = cfg.empty(Bsz * H, NT, 2, M, M, device=dev, dtype=buf)  # per-chunk dK (dC for "real"), planar
    gbl_part = cfg.empty(2, Bsz * H, NT, 2, M, device=dev)  # per-chunk dB, d log λ partials: one buffer, one reduction
    gb_part, gl_part = gbl_part[0], gbl_part[1]
    BC = min(cfg.BC, BT)
    do = do.contiguous()
    parts = (1, 2) if cfg.bwd_split else (0,)
    gbl = {part: (gb_part, gl_part) for part in parts}
    for part in parts:
        if part == 1:  # the value side writes its own dB / d log λ partials
            val_part = cfg.empty(2, Bsz * H, NT, 2, M, device=dev)
            gbl[part] = (val_part[0], val_part[1])
        with hooks.stage("chunk_bwd"):
            h = K._chunk_bwd[(NT, Bsz * H)](
                q,
                k,
                v,
                do,
                dq,
                dk,
                dv,
                P,
                bb,
                kk,
                states,
                dx,
                gk_part,
                gbl[part][0],
                gbl[part][1],
                cu_p,
                ci_p,
                T,
                H,
                M,
                R,
                D,
                NT,
                IS_VARLEN=vl is not None,
                PART=part,
                BT=BT,
                BC=BC,
                BR=pow2_block(R),
                BD=pow2_block(D),
                BM=pow2_block(M),
                DOT_PREC=cfg.chunk_prec(q.dtype, fp32_dots),
                LP_DOT=_lp_dot(q),
                CONJ_P=conj_p,
                REAL_C=real_c,
                REAL_PREC=cfg.real_prec(q.dtype, fp32_dots),
                num_warps=cfg.warps_chunk_bwd,
                num_stages=cfg.stages,
            )
        hooks.record(f"chunk_bwd{part}", h)
    dinit = cfg.empty(n_seq * H, 2, M, NC, device=dev) if init is not None else q.new_empty(1, dtype=f32)
    out = None
    if g_dtype != f32:
        out = (cfg.empty(Bsz, T, H, R, device=dev, dtype=g_dtype), cfg.empty(Bsz, T, H, D, device=dev, dtype=g_dtype))
    gb_carry, gl_carry = state_bwd(
        k, v, dk, dv, P, bb, states, dx, dfinal, dinit, init is not None, BT, cfg, hooks, vl, out
    )
    del states
    if out is not None:
        dk, dv = out
    with hooks.stage("host_reduce"):
        dkk = gk_part.view(Bsz, H, NT, 2, M, M).sum(dim=(0, 2), dtype=f32)
        chunk_sum = gbl_part.view(2, Bsz, H, NT, 2, M).sum(dim=(1, 3))
        if 1 in gbl:  # split backward: the value side wrote its own partials
            chunk_sum = chunk_sum + val_part.view(2, Bsz, H, NT, 2, M).sum(dim=(1, 3))
        dbb = chunk_sum[0] + gb_carry
        dll = chunk_sum[1] + gl_carry
    dinit_out = dinit.view(n_seq, H, 2, M, NC) if init is not None else q.new_empty(0, dtype=f32)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dll, dbb, dkk, dinit_out


# ----------------------------------------------------------------------------------------------------------------------
# torch.library registration


@torch.library.custom_op("hybrid_attention::interdomain_fwd", mutates_args=())
def interdomain_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ll: torch.Tensor,
    bb: torch.Tensor,
    kk: torch.Tensor,
    init: torch.Tensor | None,
    cu: torch.Tensor | None,
    co: torch.Tensor | None,
    ci: torch.Tensor | None,
    chunk_size: int,
    out_fp32: bool,
    need_final: bool,
    readout: str,
    save_states: bool = False,
    fp32_dots: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``hybrid_attention::interdomain_fwd`` (opaque to ``torch.compile``, with a fake implementation) -> (o, final,
    states, P); ``interdomain_bwd`` returns (dq, dk, dv, dll, dbb, dkk, dinit). It runs ``DEFAULT_CONFIG``.

    ll = log λ [H, 2, M], bb = B [H, 2, M], kk [H, 2, M, M] planar complex, init [B, H, 2, M, R+D] (planar). readout
    (ops/interdomain/readout.py) says what kk is and how the kernels read it: "transpose" K = Cᵀ C, r = K p;
    "hermitian" K = Cᵀ conj(C), r = K conj(p) (the kernels' CONJ_P); "real" kk = C itself, r = Cᵀ Re(C p)
    = ½ (K₁ p + K₂ conj p) in one pass (the kernels' REAL_C, the cost of one transpose call; dkk is then dC).
    Packed documents: (cu, co, ci) is the ``ChunkTable`` (int32 cu_seqlens [N+1], chunk offsets [N+1], per-chunk
    (document, chunk in the document) [NT, 2], NT = ``max_chunks(T, N, L)``), built once per call on the device and
    shared by the forward, the backward and both passes of the two-pass "real" readout; all three None for dense
    inputs; init / final / dinit are then [N, H, 2, M, R+D].

    ``save_states`` (``InterdomainConfig.save_states``, asked for only when a gradient is needed): the forward also
    returns its chunk-entering states [B·H, NT, 2, M, R+D] and power table P [H, 2, L+1, M] (empty tensors
    otherwise), outputs of the op so that autograd keeps them for the backward. ``fp32_dots``: float32 operands in
    the chunk kernels whatever ``InterdomainConfig.chunk_dots`` says (the denominator ablation).
    """
    return _fwd_impl(q, k, v, ll, bb, kk, init, cu, co, ci, chunk_size, out_fp32, need_final, readout, save_states,
                     fp32_dots)


@interdomain_fwd_op.register_fake
def _(q, k, v, ll, bb, kk, init, cu, co, ci, chunk_size, out_fp32, need_final, readout, save_states=False,
      fp32_dots=False):
    Bsz, T, H, R = q.shape
    D = v.shape[-1]
    M = ll.shape[-1]
    n_seq = Bsz if cu is None else cu.shape[0] - 1
    f32 = torch.float32
    o = q.new_empty(Bsz, T, H, D, dtype=f32 if out_fp32 else q.dtype)
    fin = q.new_empty(n_seq, H, 2, M, R + D, dtype=f32) if need_final else q.new_empty(0, dtype=f32)
    BT = kernel_chunk(chunk_size)
    NT = triton.cdiv(T, BT) if cu is None else ci.shape[0]
    kept = T > 0 and save_states
    states = (q.new_empty(Bsz * H, NT, 2, M, R + D, dtype=DEFAULT_CONFIG.state_torch_dtype(q.dtype)) if kept
              else q.new_empty(0, dtype=f32))
    P = q.new_empty(H, 2, BT + 1, M, dtype=f32) if kept else q.new_empty(0, dtype=f32)
    return o, fin, states, P


@torch.library.custom_op("hybrid_attention::interdomain_bwd", mutates_args=())
def interdomain_bwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ll: torch.Tensor,
    bb: torch.Tensor,
    kk: torch.Tensor,
    init: torch.Tensor | None,
    cu: torch.Tensor | None,
    co: torch.Tensor | None,
    ci: torch.Tensor | None,
    do: torch.Tensor,
    dfinal: torch.Tensor | None,
    states: torch.Tensor,
    P: torch.Tensor,
    chunk_size: int,
    readout: str,
    fp32_dots: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _bwd_impl(q, k, v, ll, bb, kk, init, cu, co, ci, do, dfinal, states, P, chunk_size, readout, fp32_dots)


@interdomain_bwd_op.register_fake
def _(q, k, v, ll, bb, kk, init, cu, co, ci, do, dfinal, states, P, chunk_size, readout, fp32_dots):
    dinit = torch.empty_like(init) if init is not None else q.new_empty(0, dtype=torch.float32)
    return (
        torch.empty_like(q),
        torch.empty_like(k),
        torch.empty_like(v),
        torch.empty_like(ll),
        torch.empty_like(bb),
        torch.empty_like(kk),
        dinit,
    )


def _setup_context(ctx, inputs, output):
    q, k, v, ll, bb, kk, init, cu, co, ci, chunk_size, out_fp32, need_final, readout = inputs[:14]
    ctx.save_for_backward(q, k, v, ll, bb, kk, init, cu, co, ci, *output[2:])
    ctx.chunk_size = chunk_size
    ctx.readout = readout
    ctx.fp32_dots = len(inputs) > 15 and inputs[15]  # a direct eager call may leave the trailing defaults out
    ctx.need_final = need_final
    ctx.has_init = init is not None


def _grads(ctx, do, dfinal, *_kept, bwd):
    """Gradients of the forward op's inputs from (do, dfinal) (the kept tensors get none), computed by ``bwd`` (the
    registered backward op, or the eager path's ``_bwd_impl`` with its config)."""
    q, k, v, ll, bb, kk, init, cu, co, ci, states, P = ctx.saved_tensors
    if do is None:
        do = torch.zeros(q.shape[:3] + (v.shape[-1],), device=q.device, dtype=q.dtype)
    if not ctx.need_final or (dfinal is not None and dfinal.numel() == 0):
        dfinal = None
    dq, dk, dv, dll, dbb, dkk, dinit = bwd(
        q, k, v, ll, bb, kk, init if ctx.has_init else None, cu, co, ci, do, dfinal, states, P, ctx.chunk_size,
        ctx.readout, ctx.fp32_dots,
    )
    return (dq, dk, dv, dll, dbb, dkk, (dinit if ctx.has_init else None), *([None] * 9))


def _backward(ctx, do, dfinal, *kept):
    return _grads(ctx, do, dfinal, *kept, bwd=interdomain_bwd_op)


interdomain_fwd_op.register_autograd(_backward, setup_context=_setup_context)
_EagerInterdomain = eager_function(_fwd_impl, _bwd_impl, _setup_context, _grads)


# ----------------------------------------------------------------------------------------------------------------------
# public function


def _readout_table(C: torch.Tensor | Planar, readout: str) -> torch.Tensor | Planar:
    """What the kernels read as kk (before ``_planar``): C itself for "real" (REAL_C: dkk is dC), else the readout's
    operator K (autograd carries dK to dC). A ``Planar`` C stays planar (real matmuls: no complex op in a compiled
    graph); a complex or real tensor C goes through the complex ``readout_operators``."""
    if isinstance(C, Planar):
        return C.to(torch.float32) if readout == "real" else planar_readout_operator(C.to(torch.float32), readout)
    Cc = C.to(torch.complex64) if C.is_complex() else C.float().to(torch.complex64)
    if readout == "real":
        return Cc
    k1, k2 = readout_operators(Cc, readout)
    return k1 if k1 is not None else k2


def interdomain_fwd_planar(
    q, k, v, log_lam, B, C, initial_state, chunk_size: int, out_fp32: bool, need_final: bool,
    readout: str = DEFAULT_READOUT, config: InterdomainConfig | None = None, hooks: LaunchHooks | None = None,
    vl: ChunkTable | None = None, fp32_dots: bool = False,
):
    """Differentiable call of the registered op (one kernel pass) from complex (log_lam, B, C, initial_state) for any
    readout ("transpose" / "hermitian" with the planar complex K, "real" with the planar C itself); log_lam, B, C may
    be ``Planar`` pairs instead (no complex op before the op then). Returns (o, final complex64 or None). With a
    ``config`` or ``hooks`` it runs the eager path (``common.triton.eager``) with them instead of the registered op.
    ``vl``: packed documents (the ``ChunkTable`` for the kernel chunk length, initial_state ``[N, H, M, NC]``)."""
    validate_readout(readout)
    ll = planar(log_lam, 1).contiguous()
    bb = planar(B, 1).contiguous()
    kk = planar(_readout_table(C, readout), 1).contiguous()
    init = planar(initial_state, 2).contiguous() if initial_state is not None else None
    cu, co, ci = (None, None, None) if vl is None else (vl.cu, vl.offsets, vl.indices)
    cfg = config or DEFAULT_CONFIG
    grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, k, v, ll, bb, kk, init) if isinstance(t, torch.Tensor)
    )
    args = (q, k, v, ll, bb, kk, init, cu, co, ci, chunk_size, out_fp32, need_final, readout, grad and cfg.save_states,
            fp32_dots)
    if config is None and hooks is None:
        o, fin, *_kept = interdomain_fwd_op(*args)
    else:
        o, fin, *_kept = _EagerInterdomain.apply(cfg, hooks or NO_HOOKS, *args)
    # planar [B, H, 2, M, NC] -> complex: one copy; its backward hands the op a strided view of the incoming gradient
    # (made contiguous once inside), where torch.complex(fin[:, :, 0], fin[:, :, 1]) cost zero-fills and copies
    final = torch.view_as_complex(fin.movedim(2, -1).contiguous()) if need_final else None
    return o, final


def triton_interdomain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    denominator: bool = False,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    readout: str = DEFAULT_READOUT,
    config: InterdomainConfig | None = None,
    hooks: LaunchHooks | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Interdomain Attention core on Triton kernels (same contract as ``chunk_interdomain``).

    Float32 state and decay math whatever the activation dtype (bf16 / fp16 / fp32); float64 inputs are refused
    (use the reference backend for float64). ``chunk_size`` selects the kernel chunk length when it is a power of two
    in [16, 128] (else 64); the result does not depend on it beyond rounding.

    ``denominator=True`` appends the constant-1 value channel (v' = [v ; 1]) and runs the same kernels with D + 1
    value channels in float32, then divides num / safe(den) exactly like the reference (see chunk.py).

    ``readout`` "transpose" / "hermitian" is one kernel pass; "real" = ½ (transpose + hermitian) is one pass
    (r = Cᵀ Re(C p), the kernels' REAL_C) when the config's ``real_one_pass`` is set (``config`` or, without one,
    ``DEFAULT_CONFIG``: the registered op's path follows it too), else it runs both (the readout is linear in r, so
    the average is exact), at twice the cost.

    ``config`` (an ``InterdomainConfig``) and ``hooks`` (``LaunchHooks``) are for benchmarks and tests: given either,
    the kernels run eagerly with them instead of through the registered op (which always runs ``DEFAULT_CONFIG``).

    ``cu_seqlens [N + 1]`` (int32 / int64): packed documents, q / k / v ``[1, T, H, *]`` (``ops/common/varlen.py``):
    every document starts from zero or ``initial_state[n]`` (``[N, H, M, R + D(+1)]``), the final state is
    ``[N, H, M, R + D(+1)]``, chunks restart at each document start. No host sync: a CUDA ``cu_seqlens`` is checked
    for dtype and shape only (its values are trusted); a CPU one is fully checked, then copied to the device.

    Memory: the forward writes the chunk-entering states into one [B, H, T/L, 2, M, R+D] buffer (bf16 for bf16 /
    fp16 activations, else float32: ``InterdomainConfig.state_dtype``). With ``InterdomainConfig.save_states`` (the
    default) autograd keeps it for the backward; without, it is freed when the op returns, autograd saves the inputs
    only and the backward recomputes the chunk states. No per-token state is materialised.
    """
    validate_readout(readout)
    if cu_seqlens is None:
        validate_interdomain_inputs(q, k, v, log_lam, B, C, initial_state, denominator)
    else:  # initial_state is per document: [N, ...] against inputs of batch one
        validate_interdomain_inputs(q, k, v, log_lam, B, C, None, denominator)
        n_docs = check_cu_seqlens(cu_seqlens, q.shape[1], q.shape[0])
        check_packed_state(initial_state, n_docs)
        if initial_state is not None:
            validate_interdomain_inputs(
                q.expand(n_docs, *q.shape[1:]), k.expand(n_docs, *k.shape[1:]), v.expand(n_docs, *v.shape[1:]),
                log_lam, B, C, initial_state, denominator,
            )
    validate_chunk_size(chunk_size)
    if any(t.dtype == torch.float64 for t in (q, k, v)):
        raise ValueError("the triton backend computes in float32; use backend='reference' for float64 inputs")
    D = v.shape[-1]
    dt = q.dtype
    q = q.contiguous()
    k = k.to(dt).contiguous()
    v = v.to(dt).contiguous()
    if denominator:
        v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1).contiguous()
    one_pass = readout != "real" or (config or DEFAULT_CONFIG).real_one_pass
    passes = (readout,) if one_pass else ("transpose", "hermitian")
    out_fp32 = denominator or len(passes) > 1  # sums and ratios of the passes in float32
    vl = None
    if cu_seqlens is not None:  # one chunk table per call, shared by the passes and the backward
        vl = chunk_table(cu_seqlens, q.shape[1], kernel_chunk(chunk_size, config or DEFAULT_CONFIG), q.device)
    o, final = 0.0, None
    for i, ro in enumerate(passes):
        o_i, f_i = interdomain_fwd_planar(
            q, k, v, log_lam, B, C, initial_state, chunk_size, out_fp32, output_final_state and i == 0, ro,
            config=config, hooks=hooks, vl=vl, fp32_dots=denominator,  # the quotient amplifies bf16 rounding
        )
        o, final = o + o_i / len(passes), (f_i if i == 0 else final)
    if denominator:
        o = safe_divide(o[..., :D], o[..., D:])
    return o.to(dt), final
