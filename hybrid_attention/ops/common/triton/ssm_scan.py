"""Host side of the shared chunked state scans (``ssm_scan_kernels.py``): launches, the power table, the planar
complex layout, the launch configuration and the launch records / profiling hooks.

Shared by the Interdomain Attention op (``hybrid_attention.ops.interdomain.triton.ops``, channels z = [k | v]) and
the bilinear S4D op (``hybrid_attention.ops.s4d_bilinear.triton.ops``, z = [a | b]): both carry the same complex
diagonal state X_t = λ ⊙ X_{t-1} + B z_tᵀ across chunk boundaries and differ only in their chunk-local readout
kernels. The linear S4D op (``hybrid_attention.ops.s4d``) is an FFT convolution and does not use this module.

Entry points (all take planar float32 tables: a leading re/im axis of size 2):
  ``_planar``             complex -> planar float32 (differentiable).
  ``_power_table``        P = λ^n, n = 0..BT, [H, 2, BT+1, M], computed in float64.
  ``_states_fwd``         forward scan: the chunk-entering states [B·H, NT, 2, M, NC] and / or the final state.
  ``_state_bwd_unfused``  reverse adjoint scan (``_state_bwd``) then the state-carry gradient (``_chunk_dz``).
  ``_state_bwd_dz``       the same in one fused launch (``_state_bwd_dz``; selected by the ``fuse_dz`` setting).
The launch configuration (``kernel_config`` / ``set_kernel_config``), ``LAST_KERNELS`` and ``profiling`` /
``profile_summary`` are re-exported by the Interdomain op's ``ops`` module, its public tuning interface.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
import triton

from . import ssm_scan_kernels as K

__all__ = ["kernel_config", "set_kernel_config", "profiling", "profile_summary", "LAST_KERNELS"]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Fixed launch configuration (no autotuning: the interpreter needs one config, and the GPU benchmark compares the
# variants explicitly). ``set_kernel_config`` lets the benchmark script try alternatives.
# One dict for the Interdomain op's whole launch sequence: the state-scan keys (BMS, BCH, BCH_DZ, warps_state,
# stages_state, warps_dz, fuse_dz, BCH_FZ, warps_fz), read here and so also by the bilinear S4D op, whose scans these
# are too; the Interdomain chunk-kernel keys (BC, warps_chunk_*, max_chunk, bwd_split), read by
# ``hybrid_attention.ops.interdomain.triton.ops``; and dot_prec, stages, poison, read by both. The bilinear S4D op
# keeps its readout kernels' own configuration in ``hybrid_attention.ops.s4d_bilinear.triton.ops``.
_CFG = {
    "BC": 32,  # sub-chunk rows (>= 16: tl.dot minimum); BC >= L means one band-matmul block per chunk
    "BMS": 32,  # mode block of the sequential state kernels
    "BCH": 32,  # channel block of the sequential state kernels
    "BCH_DZ": 64,  # channel block of the dz kernel
    "warps_chunk_fwd": 4,
    "warps_chunk_bwd": 8,
    "warps_state": 4,
    "stages": 1,  # software pipelining depth of the parallel chunk kernels
    "stages_state": 2,  # ... and of the sequential state scans (their loads do not depend on the carried state)
    "dot_prec": "tf32",  # input precision of float32 matmuls on the GPU ("tf32", "tf32x3", "ieee")
    "max_chunk": 32,  # kernel chunk length cap (run 2 on the H200: L=32 beat L=64, see benchmarks/NOTES.md)
    "bwd_split": False,  # backward chunk kernel as two launches (value side, key side): measured slower (run 3)
    "warps_dz": 8,
    # reverse scan and state-carry gradient in one launch (_state_bwd_dz): H200 session 2, T=32K forward+backward
    # 9.78 -> 8.52 ms (state_bwd 1.12 + chunk_dz 1.75 -> 1.64 ms), correctness unchanged (benchmarks/NOTES.md)
    "fuse_dz": True,
    "BCH_FZ": 16,  # channel block of the fused kernel (it holds all M modes; >= 16 for tl.dot)
    "warps_fz": 8,  # sm_90 AOT: 4 warps spill 584 B, 8 warps 16 B (benchmarks/aot_regs.py)
    "poison": False,  # fill every kernel-written buffer with NaN before the launch (tests / benchmark check)
}

# Compiled kernel handles of the last launches (GPU only): registers / spills / shared memory for the notes.
LAST_KERNELS: dict = {}
# Per-stage CUDA-event timings, collected only while ``profiling(True)`` (benchmark breakdown).
_PROFILE: dict = {"on": False, "events": {}}


def profiling(on: bool) -> None:
    """Start (clearing earlier records) or stop recording per-stage CUDA events."""
    _PROFILE["on"] = bool(on) and torch.cuda.is_available()
    if on:
        _PROFILE["events"] = {}


def profile_summary() -> dict:
    """{stage: total milliseconds} over the recorded launches (synchronises)."""
    torch.cuda.synchronize()
    return {k: sum(s.elapsed_time(e) for s, e in v) for k, v in _PROFILE["events"].items()}


@contextmanager
def _stage(name: str):
    if not _PROFILE["on"]:
        yield
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    yield
    end.record()
    _PROFILE["events"].setdefault(name, []).append((start, end))


def update_config(cfg: dict, **kw) -> None:
    """Change keys of a launch-configuration dict in place; unknown keys raise ``KeyError`` (shared by every op's
    ``set_kernel_config``)."""
    for key, val in kw.items():
        if key not in cfg:
            raise KeyError(f"unknown kernel config key {key!r}")
        cfg[key] = val


def empty_buffer(cfg: dict, *shape, device, dtype=torch.float32) -> torch.Tensor:
    """An uninitialised kernel output buffer, NaN-filled when ``cfg["poison"]`` (tests / benchmark checks)."""
    t = torch.empty(*shape, device=device, dtype=dtype)
    if cfg["poison"]:
        t.fill_(float("nan"))
    return t


def kernel_config() -> dict:
    return dict(_CFG)


def set_kernel_config(**kw) -> None:
    update_config(_CFG, **kw)


def _empty(*shape, device, dtype=torch.float32) -> torch.Tensor:
    return empty_buffer(_CFG, *shape, device=device, dtype=dtype)


def _record(name: str, handle) -> None:
    if not _INTERPRET and handle is not None:
        LAST_KERNELS[name] = handle


def _np2(x: int) -> int:
    return max(16, triton.next_power_of_2(x))


# float64 arange per (length, device): a constant, so caching it is exact. (A cache of the power table itself, keyed
# by the log λ tensor, is not: the parameter changes in place every optimizer step.)
_ARANGE: dict = {}


def _arange64(n: int, device: torch.device) -> torch.Tensor:
    key = (n, str(device))
    if key not in _ARANGE:
        _ARANGE[key] = torch.arange(n, device=device, dtype=torch.float64)
    return _ARANGE[key]


def _power_table(ll: torch.Tensor, BT: int) -> torch.Tensor:
    """P[h, :, n, m] = (re, im) of λ^n = exp(n log λ), n = 0..BT, computed in float64 then rounded: [H, 2, BT+1, M].

    ll: planar log λ [H, 2, M] (float32). Four device ops (cast, multiply, exp, rounding copy into the planar layout)
    instead of a chain of conversions; float64 keeps n·Im log λ exact enough for |Im log λ| up to ~1e3 (float32 would
    lose ~1e-3 rad of phase at n·Im = 3e4)."""
    H, _, M = ll.shape
    lam = torch.empty(H, M, 2, device=ll.device, dtype=torch.float64)
    lam.copy_(ll.transpose(1, 2))  # [H, M, (re, im)]: the layout torch.view_as_complex reads
    n = _arange64(BT + 1, ll.device)
    P = torch.exp(n[None, :, None] * torch.view_as_complex(lam)[:, None, :])  # [H, BT+1, M] complex128
    out = torch.empty(H, 2, BT + 1, M, device=ll.device, dtype=torch.float32)
    out.copy_(torch.view_as_real(P).permute(0, 3, 1, 2))
    return out


def _prec() -> str:
    return "ieee" if _INTERPRET else _CFG["dot_prec"]


def _states_fwd(k, v, P, bb, init, BT, store_states: bool, store_final: bool):
    Bsz, T, H, R = k.shape
    D = v.shape[-1]
    M = bb.shape[-1]
    NC = R + D
    NT = triton.cdiv(T, BT)
    dev = k.device
    states = _empty(Bsz * H, NT, 2, M, NC, device=dev) if store_states else k.new_empty(1)
    final = _empty(Bsz * H, 2, M, NC, device=dev) if store_final else k.new_empty(1)
    BMS = min(_CFG["BMS"], _np2(M))
    BCH = min(_CFG["BCH"], _np2(NC))
    grid = (triton.cdiv(NC, BCH), triton.cdiv(M, BMS), Bsz * H)
    with _stage("state_fwd"):
        h = _launch_state_fwd(
            grid, k, v, P, bb, init, states, final, T, H, M, R, D, NT, store_states, store_final, BT, BMS, BCH
        )
    _record("state_fwd", h)
    return states, final


def _launch_state_fwd(
    grid, k, v, P, bb, init, states, final, T, H, M, R, D, NT, store_states, store_final, BT, BMS, BCH
):
    return K._state_fwd[grid](
        k,
        v,
        P,
        bb,
        init if init is not None else k,
        states,
        final,
        T,
        H,
        M,
        R,
        D,
        NT,
        HAS_INIT=init is not None,
        STORE_STATES=store_states,
        STORE_FINAL=store_final,
        USE_WHILE=_INTERPRET,
        BT=BT,
        BMS=BMS,
        BCH=BCH,
        DOT_PREC=_prec(),
        num_warps=_CFG["warps_state"],
        num_stages=_CFG["stages_state"],
    )


def _state_bwd_unfused(k, v, dk, dv, P, bb, states, dx, dfinal, dinit, has_init: bool, BT: int):
    """Reverse adjoint scan (_state_bwd, writes dXe into dx in place) then the state-carry gradient (_chunk_dz).
    Adds the carry part to dk / dv in place; returns the carry parts of (dB, d log λ), each [H, 2, M]."""
    Bsz, T, H, R = k.shape
    D = v.shape[-1]
    M = bb.shape[-1]
    NC = R + D
    NT = triton.cdiv(T, BT)
    dev = k.device
    BMS = min(_CFG["BMS"], _np2(M))
    BCH = min(_CFG["BCH"], _np2(NC))
    n_cb = triton.cdiv(NC, BCH)
    gl_part2 = _empty(Bsz * H, n_cb, 2, M, device=dev)
    has_df = dfinal is not None
    with _stage("state_bwd"):
        h = K._state_bwd[(n_cb, triton.cdiv(M, BMS), Bsz * H)](
            P,
            states,
            dx,
            dfinal.contiguous() if has_df else dx,
            dinit,
            gl_part2,
            T,
            H,
            M,
            R,
            D,
            NT,
            HAS_DFINAL=has_df,
            STORE_DINIT=has_init,
            USE_WHILE=_INTERPRET,
            BT=BT,
            BMS=BMS,
            BCH=BCH,
            num_warps=_CFG["warps_state"],
            num_stages=_CFG["stages_state"],
        )
    _record("state_bwd", h)
    BCHZ = min(_CFG["BCH_DZ"], _np2(NC))
    n_cbz = triton.cdiv(NC, BCHZ)
    gb_part3 = _empty(Bsz * H, NT, n_cbz, 2, M, device=dev)
    gl_part3 = _empty(Bsz * H, NT, n_cbz, 2, M, device=dev)
    with _stage("chunk_dz"):
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
            T,
            H,
            M,
            R,
            D,
            NT,
            BT=BT,
            BM=_np2(M),
            BCH=BCHZ,
            DOT_PREC=_prec(),
            num_warps=_CFG["warps_dz"],
            num_stages=_CFG["stages"],
        )
    _record("chunk_dz", h)
    with _stage("host_reduce"):
        dbb = gb_part3.view(Bsz, H, NT * n_cbz, 2, M).sum(dim=(0, 2))
        dll = gl_part2.view(Bsz, H, n_cb, 2, M).sum(dim=(0, 2)) + gl_part3.view(Bsz, H, NT * n_cbz, 2, M).sum(
            dim=(0, 2)
        )
    return dbb, dll


def _state_bwd_dz(k, v, dk, dv, P, bb, states, dx, dfinal, dinit, has_init: bool, BT: int):
    """Fused reverse adjoint scan + state-carry gradient (one launch of K._state_bwd_dz; dx is only read). Same
    contract as ``_state_bwd_unfused``: adds the carry part to dk / dv in place, writes dX0 into ``dinit`` when
    ``has_init``, returns the carry parts of (dB, d log λ), each [H, 2, M]."""
    Bsz, T, H, R = k.shape
    D = v.shape[-1]
    M = bb.shape[-1]
    NC = R + D
    NT = triton.cdiv(T, BT)
    BCH = min(_CFG["BCH_FZ"], _np2(NC))
    n_cb = triton.cdiv(NC, BCH)
    part = _empty(2, Bsz * H, n_cb, 2, M, device=k.device)  # (dB, d log λ) partials per (b·h, channel block)
    gb_part, gl_part = part[0], part[1]
    has_df = dfinal is not None
    with _stage("state_bwd_dz"):
        h = K._state_bwd_dz[(n_cb, Bsz * H)](
            k,
            v,
            dk,
            dv,
            P,
            bb,
            states,
            dx,
            dfinal.contiguous() if has_df else dx,
            dinit,
            gb_part,
            gl_part,
            T,
            H,
            M,
            R,
            D,
            NT,
            HAS_DFINAL=has_df,
            STORE_DINIT=has_init,
            USE_WHILE=_INTERPRET,
            BT=BT,
            BM=_np2(M),
            BCH=BCH,
            DOT_PREC=_prec(),
            num_warps=_CFG["warps_fz"],
            num_stages=_CFG["stages_state"],
        )
    _record("state_bwd_dz", h)
    with _stage("host_reduce"):
        red = part.view(2, Bsz, H, n_cb, 2, M).sum(dim=(1, 3))
    return red[0], red[1]


def _planar(x: torch.Tensor, dim: int) -> torch.Tensor:
    """complex -> contiguous float32 with a new re/im axis at ``dim`` (differentiable); real input gets a zero
    imaginary plane. A complex64 input costs one copy forward and one backward (view_as_real + movedim), where
    stacking .real / .imag cost one forward and three backward."""
    if x.is_complex():
        return torch.view_as_real(x.to(torch.complex64)).movedim(-1, dim).contiguous()
    x = x.float()
    return torch.stack([x, torch.zeros_like(x)], dim=dim)
