"""Host side of the chunked complex state scans shared by the Interdomain and bilinear S4D Triton ops: launches, the
power table, the planar layout. Both carry X_t = λ ⊙ X_{t-1} + B z_tᵀ across chunks (z = [k | v] or [a | b]) and
differ only in their chunk-local readout kernels (``ssm_scan_kernels.py``). Launchers take the launch configuration
``cfg`` (``config.ScanConfig``) and ``hooks`` (``hooks.LaunchHooks``) as arguments: no mutable module state."""

from __future__ import annotations

import torch
import triton

from ..planar import Planar
from ..varlen import ChunkTable, check_initial_state, max_chunks
from . import interpreting
from . import ssm_scan_kernels as K
from .config import ScanConfig
from .hooks import LaunchHooks

__all__ = ["planar", "power_table", "states_fwd", "state_bwd", "pow2_block", "op_table", "check_packed_state"]


def pow2_block(x: int) -> int:
    """The block size covering a dimension of size ``x`` in one tile: the next power of two, at least 16 (the
    smallest ``tl.dot`` operand side)."""
    return max(16, triton.next_power_of_2(x))


def power_table(ll: torch.Tensor, BT: int) -> torch.Tensor:
    """P[h, :, n, m] = (re, im) of λ^n = exp(n log λ), n = 0..BT, computed in float64 then rounded: [H, 2, BT+1, M].

    ll: planar log λ [H, 2, M] (float32). Four device ops (cast, multiply, exp, rounding copy into the planar layout)
    instead of a chain of conversions; float64 keeps n·Im log λ exact enough for |Im log λ| up to ~1e3 (float32 would
    lose ~1e-3 rad of phase at n·Im = 3e4)."""
    H, _, M = ll.shape
    lam = torch.empty(H, M, 2, device=ll.device, dtype=torch.float64)
    lam.copy_(ll.transpose(1, 2))  # [H, M, (re, im)]: the layout torch.view_as_complex reads
    # made fresh each call, never cached in a module global: under CUDA graphs (torch.compile mode reduce-overhead)
    # a cached tensor first made inside the graph's warm-up lives in its memory pool untracked and the capture fails
    # (H200: "Detected 1 tensor(s) in the cudagraph pool not tracked as outputs", Interdomain recall)
    n = torch.arange(BT + 1, device=ll.device, dtype=torch.float64)
    P = torch.exp(n[None, :, None] * torch.view_as_complex(lam)[:, None, :])  # [H, BT+1, M] complex128
    out = torch.empty(H, 2, BT + 1, M, device=ll.device, dtype=torch.float32)
    out.copy_(torch.view_as_real(P).permute(0, 3, 1, 2))
    return out


# DECISION: packed documents (``vl``, a ``varlen.ChunkTable``; B == 1), one design for every varlen kernel of these
# scans and of the ops' chunk kernels.
# - Sequential scans (``_state_fwd``, ``_state_bwd``, ``_state_bwd_dz``): one program per (tile, document · head); it
#   reads its document's token range from ``vl.cu`` and its first chunk row from ``vl.offsets``, starts from zero or
#   ``initial_state[n]``, runs ceil(len_n / BT) chunks (the last one partial) and writes the final state (or
#   d initial_state) of row n. Init / final / their gradients are ``[N, H, 2, M, NC]``, the dense ``[B, H, ...]``
#   layout with B -> N.
# - Chunk-parallel kernels (``_chunk_dz`` and the ops' chunk kernels): one program per (chunk row, head[, tile]); the
#   row's (document, chunk in the document) from ``vl.indices`` gives its true start and length (``chunk_info``). The
#   grid is the static bound ``vl.n_rows`` (no host sync): rows past the real chunks have no tokens, read no state and
#   write zero partials.
# - The chunk-state buffers (``states``, ``dx``, per-chunk partials) are ``[H, vl.n_rows, ...]``: the dense
#   ``[B·H, NT, ...]`` with B = 1; every sum over their chunk axis stays as it is.
def _layout(k: torch.Tensor, BT: int, vl: ChunkTable | None) -> tuple[int, int]:
    """(sequences, chunk rows) of one call: (B, cdiv(T, BT)) dense, (N, vl.n_rows) packed (B == 1)."""
    if vl is None:
        return k.shape[0], triton.cdiv(k.shape[1], BT)
    if vl.chunk_size != BT:
        raise ValueError(f"vl was built for chunks of {vl.chunk_size} tokens, the kernels run {BT}")
    return vl.n_docs, vl.n_rows


def op_table(T: int, cu, co, ci, BT: int) -> ChunkTable | None:
    """The ``ChunkTable`` of a registered op's (cu, co, ci) tensor arguments (all None: dense inputs), its row count
    checked against T and the kernel chunk length BT."""
    if cu is None:
        return None
    n_rows = max_chunks(T, cu.numel() - 1, BT)
    if ci is None or co is None or tuple(ci.shape) != (n_rows, 2):
        raise ValueError(f"chunk table must be [{n_rows}, 2] for chunks of {BT} tokens, got "
                         f"{None if ci is None else tuple(ci.shape)}")
    return ChunkTable(cu, co, ci, BT)


def check_packed_state(initial_state, n_docs: int) -> None:
    """With cu_seqlens the initial state holds one state per document: ``[N, ...]`` (ValueError naming it; the
    check every Triton form shares, ``varlen.check_packed``)."""
    check_initial_state(initial_state, n_docs)


def _vl_args(k: torch.Tensor, vl: ChunkTable | None, table: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (cu, offsets) or (cu, indices) pointer arguments of a launch; dense calls pass ``k`` (never read)."""
    if vl is None:
        return k, k
    return vl.cu, (vl.offsets if table == "offsets" else vl.indices)


def states_fwd(
    k, v, P, bb, init, BT, store_states: bool, store_final: bool, cfg: ScanConfig, hooks: LaunchHooks,
    vl: ChunkTable | None = None,
):
    """Forward state scan over k [B, T, H, R], v [B, T, H, D] (channels z = [k | v], NC = R + D), the power table
    P [H, 2, BT+1, M] (``power_table``), the planar input gain bb [H, 2, M] and the optional planar initial state
    init [B, H, 2, M, NC] (None: zero), chunk length BT: (states [B·H, NT, 2, M, NC] (the chunk-entering states;
    with ``store_states``), final [B·H, 2, M, NC] (with ``store_final``); the ones not stored are 1-element
    placeholders); packed (``vl``): states [H, vl.n_rows, ...], final [N·H, ...] (init, when given,
    [N, H, 2, M, NC] planar); the states buffer's dtype is ``cfg.state_torch_dtype(k.dtype)``."""
    Bsz, T, H, R = k.shape
    D = v.shape[-1]
    M = bb.shape[-1]
    NC = R + D
    n_seq, NT = _layout(k, BT, vl)
    dev = k.device
    if store_states:
        states = cfg.empty(Bsz * H, NT, 2, M, NC, device=dev, dtype=cfg.state_torch_dtype(k.dtype))
    else:
        states = k.new_empty(1)
    final = cfg.empty(n_seq * H, 2, M, NC, device=dev) if store_final else k.new_empty(1)
    BMS = min(cfg.BMS, pow2_block(M))
    BCH = min(cfg.BCH, pow2_block(NC))
    grid = (triton.cdiv(NC, BCH), triton.cdiv(M, BMS), n_seq * H)
    with hooks.stage("state_fwd"):
        h = _launch_state_fwd(
            grid, k, v, P, bb, init, states, final, T, H, M, R, D, NT, store_states, store_final, BT, BMS, BCH, cfg,
            vl,
        )
    hooks.record("state_fwd", h)
    return states, final


def _launch_state_fwd(
    grid, k, v, P, bb, init, states, final, T, H, M, R, D, NT, store_states, store_final, BT, BMS, BCH, cfg,
    vl: ChunkTable | None = None,
):
    cu, co = _vl_args(k, vl, "offsets")
    return K._state_fwd[grid](
        k,
        v,
        P,
        bb,
        init if init is not None else k,
        states,
        final,
        cu,
        co,
        T,
        H,
        M,
        R,
        D,
        NT,
        IS_VARLEN=vl is not None,
        HAS_INIT=init is not None,
        STORE_STATES=store_states,
        STORE_FINAL=store_final,
        USE_WHILE=interpreting(),
        BT=BT,
        BMS=BMS,
        BCH=BCH,
        DOT_PREC=cfg.prec(),
        num_warps=cfg.warps_state,
        num_stages=cfg.stages_state,
    )


def _state_bwd_unfused(
    k, v, dk, dv, P, bb, states, dx, dfinal, dinit, has_init: bool, BT: int, cfg: ScanConfig, hooks: LaunchHooks,
    vl: ChunkTable | None = None,
):
    """Reverse adjoint scan (_state_bwd, writes dXe into dx in place) then the state-carry gradient (_chunk_dz).
    Adds the carry part to dk / dv in place; returns the carry parts of (dB, d log λ), each [H, 2, M]."""
    Bsz, T, H, R = k.shape
    D = v.shape[-1]
    M = bb.shape[-1]
    NC = R + D
    n_seq, NT = _layout(k, BT, vl)
    dev = k.device
    BMS = min(cfg.BMS, pow2_block(M))
    BCH = min(cfg.BCH, pow2_block(NC))
    n_cb = triton.cdiv(NC, BCH)
    gl_part2 = cfg.empty(n_seq * H, n_cb, 2, M, device=dev)
    has_df = dfinal is not None
    cu, co = _vl_args(k, vl, "offsets")
    with hooks.stage("state_bwd"):
        h = K._state_bwd[(n_cb, triton.cdiv(M, BMS), n_seq * H)](
            P,
            states,
            dx,
            dfinal.contiguous() if has_df else dx,
            dinit,
            gl_part2,
            cu,
            co,
            T,
            H,
            M,
            R,
            D,
            NT,
            IS_VARLEN=vl is not None,
            HAS_DFINAL=has_df,
            STORE_DINIT=has_init,
            USE_WHILE=interpreting(),
            BT=BT,
            BMS=BMS,
            BCH=BCH,
            num_warps=cfg.warps_state,
            num_stages=cfg.stages_state,
        )
    hooks.record("state_bwd", h)
    BCHZ = min(cfg.BCH_DZ, pow2_block(NC))
    n_cbz = triton.cdiv(NC, BCHZ)
    gb_part3 = cfg.empty(Bsz * H, NT, n_cbz, 2, M, device=dev)
    gl_part3 = cfg.empty(Bsz * H, NT, n_cbz, 2, M, device=dev)
    cu, ci = _vl_args(k, vl, "indices")
    with hooks.stage("chunk_dz"):
        h = K._chunk_dz[(NT, Bsz * H, n_cbz)](
            k,
            v,
            dk,
            dv,
            P,
            bb,
            dx,
            gb_part3,
            gl_part3,
            cu,
            ci,
            T,
            H,
            M,
            R,
            D,
            NT,
            IS_VARLEN=vl is not None,
            BT=BT,
            BM=pow2_block(M),
            BCH=BCHZ,
            DOT_PREC=cfg.prec(),
            num_warps=cfg.warps_dz,
            num_stages=cfg.stages,
        )
    hooks.record("chunk_dz", h)
    with hooks.stage("host_reduce"):
        dbb = gb_part3.view(Bsz, H, NT * n_cbz, 2, M).sum(dim=(0, 2))
        dll = gl_part2.view(n_seq, H, n_cb, 2, M).sum(dim=(0, 2)) + gl_part3.view(Bsz, H, NT * n_cbz, 2, M).sum(
            dim=(0, 2)
        )
    return dbb, dll


def _state_bwd_dz(
    k, v, dk, dv, P, bb, states, dx, dfinal, dinit, has_init: bool, BT: int, cfg: ScanConfig, hooks: LaunchHooks,
    vl: ChunkTable | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """Fused reverse adjoint scan + state-carry gradient (one launch of K._state_bwd_dz; dx, float32 or bf16, is only
    read). Same contract as ``_state_bwd_unfused``: adds the carry part to dk / dv (in place, or into ``out`` = (dk',
    dv') of any float dtype), writes dX0 into ``dinit`` when ``has_init``, returns the carry parts of (dB, d log λ),
    each [H, 2, M]."""
    Bsz, T, H, R = k.shape
    D = v.shape[-1]
    M = bb.shape[-1]
    NC = R + D
    n_seq, NT = _layout(k, BT, vl)
    BCH = min(cfg.BCH_FZ, pow2_block(NC))
    n_cb = triton.cdiv(NC, BCH)
    part = cfg.empty(2, n_seq * H, n_cb, 2, M, device=k.device)  # (dB, d log λ) partials per (seq·h, channel block)
    gb_part, gl_part = part[0], part[1]
    has_df = dfinal is not None
    cu, co = _vl_args(k, vl, "offsets")
    with hooks.stage("state_bwd_dz"):
        dko, dvo = out if out is not None else (dk, dv)
        h = K._state_bwd_dz[(n_cb, n_seq * H)](
            k,
            v,
            dk,
            dv,
            dko,
            dvo,
            P,
            bb,
            states,
            dx,
            dfinal.contiguous() if has_df else dx,
            dinit,
            gb_part,
            gl_part,
            cu,
            co,
            T,
            H,
            M,
            R,
            D,
            NT,
            IS_VARLEN=vl is not None,
            HAS_DFINAL=has_df,
            STORE_DINIT=has_init,
            USE_WHILE=interpreting(),
            BT=BT,
            BM=pow2_block(M),
            BCH=BCH,
            DOT_PREC=cfg.prec(),
            num_warps=cfg.warps_fz,
            num_stages=cfg.stages_state,
        )
    hooks.record("state_bwd_dz", h)
    with hooks.stage("host_reduce"):
        red = part.view(2, n_seq, H, n_cb, 2, M).sum(dim=(1, 3))
    return red[0], red[1]


def planar(x: torch.Tensor | Planar, dim: int) -> torch.Tensor:
    """complex -> contiguous float32 with a new re/im axis at ``dim`` (differentiable); real input gets a zero
    imaginary plane; a ``Planar`` pair is stacked (real ops only: no complex op in a compiled graph). A complex64
    input costs one copy forward and one backward (view_as_real + movedim), where stacking .real / .imag cost one
    forward and three backward."""
    if isinstance(x, Planar):
        return torch.stack([x.re.float(), x.im.float()], dim=dim)
    if x.is_complex():
        return torch.view_as_real(x.to(torch.complex64)).movedim(-1, dim).contiguous()
    x = x.float()
    return torch.stack([x, torch.zeros_like(x)], dim=dim)


def state_bwd(
    k, v, dk, dv, P, bb, states, dx, dfinal, dinit, has_init: bool, BT: int, cfg: ScanConfig, hooks: LaunchHooks,
    vl: ChunkTable | None = None, out: tuple[torch.Tensor, torch.Tensor] | None = None,
):
    """The backward state path of both ops: ``_state_bwd_dz`` (one fused launch) when ``cfg.fuse_dz``, else
    ``_state_bwd_unfused`` (two launches, float32 dx only: it writes the total adjoints into dx); same contract as
    either (packed documents: ``vl``, dfinal / dinit [N·H, 2, M, NC]). ``out`` = (dk', dv'): where dk / dv plus the
    carry part go (default: dk / dv in place)."""
    if cfg.fuse_dz:
        return _state_bwd_dz(k, v, dk, dv, P, bb, states, dx, dfinal, dinit, has_init, BT, cfg, hooks, vl, out)
    if dx.dtype != torch.float32:
        raise ValueError(f"the unfused state backward (fuse_dz=False) needs float32 local adjoints, got {dx.dtype}")
    carry = _state_bwd_unfused(k, v, dk, dv, P, bb, states, dx, dfinal, dinit, has_init, BT, cfg, hooks, vl)
    if out is not None:
        out[0].copy_(dk)
        out[1].copy_(dv)
    return carry
