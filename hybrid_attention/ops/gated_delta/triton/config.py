"""Launch configuration of the Triton gated delta rule (chunk forward / backward) as a frozen object.

Passed as an argument (``triton_gated_delta(..., config=...)``), never module state: the benchmark compares variants
with ``dataclasses.replace(DEFAULT_CONFIG, seqf_bv=32, ...)``, the tests poison buffers with
``GatedDeltaConfig(poison=True)``. Tile sizes are capped by the head dims at launch (``function._Tiles``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...common.triton.config import KernelConfig

__all__ = ["GatedDeltaConfig", "DEFAULT_CONFIG", "BUFFER_DTYPES", "SEQB_SCALES", "SEQB_DOTS", "config_with_buffers"]

BUFFER_DTYPES = ("auto", "fp32", "bf16")
"""Allowed ``GatedDeltaConfig.buffer_dtype`` values."""
SEQB_SCALES = ("qk", "tile")
"""Allowed ``GatedDeltaConfig.seqb_scale`` values."""
SEQB_DOTS = ("fp32", "bf16")
"""Allowed ``GatedDeltaConfig.seqb_dots`` values."""


@dataclass(frozen=True)
class GatedDeltaConfig(KernelConfig):
    """Tile sizes, warps and stages of the five kernels (one fixed configuration; no autotuning, so the interpreter
    runs it as is). ``benchmarks/aot_regs_gdn.py`` reports every kernel's registers / spills / shared memory at these
    launches (sm_90, compiled on the CPU machine).

    The defaults are the winners of the H200 sweeps of sessions 14 and 15 (``benchmarks.natsl_ops --sweep``, 340m
    head shape, B 1, bf16 activations, commit mask; benchmarks/NOTES.md). Session 15, each kernel's launch timed
    alone (ms forward / forward+backward at 16K; 64K, against session 14's default 0.766 / 3.423; 2.969 / 13.447):
    ``seqf_stages=3`` forward 0.640; 2.477, ``seqb_dots="bf16"`` with ``seqb_stages=2`` f+b 2.834; 11.034,
    ``bwdk_bv=64`` 3.257; 12.770, ``fin_warps=4`` 3.184; 12.489; together they compile for sm_90 without spills
    (AOT) and became the default in session 16 after the CUDA tests. ``replace(DEFAULT_CONFIG, seqf_stages=2,
    seqb_dots="fp32", bwdk_bv=32, fin_warps=8)`` is session 14's default. The 2 stages are the bf16-dot launch's
    only (``seqb_stages_bf16``): with fp32 dots they gave wrong gradients on the H200 (below).

    Session 14's sweep: bf16 buffers (``buffer_dtype="auto"`` with bf16
    activations), ``seqf_stages=2`` (the state forward prefetches the next chunk's w / u / k) and ``par_warps=4``:
    forward 1.644 -> 0.765 ms at 16K and 6.464 -> 2.976 ms at 64K, forward+backward 4.87 -> 3.42 / 19.2 -> 13.5 ms,
    against fp32 buffers / 1 stage / 8 warps (fla's forward in the same run: 1.100 / 2.048 ms). par_warps=4 spills
    96-144 B in ``bwd_local`` in the AOT report and is faster anyway. The default before it: fp32 buffers,
    ``seqf_stages=1``, ``par_warps=8`` (and session 14's backward launches above).

    par_*: the parallel kernels (prep, output, bwd_local), block BK x BV; seqf_*: the sequential state forward (grid
    V / seqf_bv x B*H; H200: 16/4 beat 32/8 and 64/8; 16 with 8 warps hit an illegal memory access in run 2, a
    codegen issue of that tile/warp combination, not a kernel indexing bug: do not use it); seqb_*: the state
    backward; bwdk_*: the key-side backward; fin_*: the finishing backward kernel. ``poison``: see ``KernelConfig``.

    seqb_scale: where the state backward applies the per-token scales r_k e^{G_last - G} and r_q e^G. "qk" (default):
    on the [C, K] key / query tiles before the dots. "tile": on the [C, BV] side (K̃ dS = diag(s) (k dS),
    (e^G q̂)ᵀ dO = qᵀ (diag(s') dO)), K / BV times fewer multiplications per program (sm_90 AOT at 340m, 8 warps:
    loop 800 -> 708 SASS instructions; the default's PTX instructions are those of the kernel verified on the
    H200 before the option existed). "tile" with the default 16-wide / 8-warp tiles hit an illegal memory access on
    the H200 at K = 128 (triton 3.6, session 13: codegen, the addressing is the same); with 4 warps, or 32-wide tiles
    and 8 warps, it runs there (both spill in the AOT compile; timed in session 14: forward+backward -3% / -2% at 16K
    / 64K, at the noise level, so it stays an option). Do not combine it with 16 / 8.

    buffer_dtype: storage of the forward's per-token / per-chunk buffers w, u (``prep``), S_n and vn
    (``state_fwd``), and the operand dtype of the dots of ``state_fwd`` and ``output``. "auto" (default): "bf16" when
    q is bf16 or fp16, "fp32" when it is fp32 -- the buffers take the activations' precision, as fla's do (its w, u,
    h, v_new are in k's dtype). Decided in session 14: the bf16 buffers are the H200 sweep's largest single win, and
    an fp32 call (the CPU interpreter, fp32 training, the tests' float64 comparisons) keeps fp32 accuracy. "fp32": fp32
    buffers, fp32 (tf32) dot operands. "bf16": those four buffers bf16 (rounded to nearest even), the dots of
    ``state_fwd`` / ``output`` take bf16 operands with fp32 accumulation (the carried state S cast to bf16 only as
    the operand of ``w S``; S itself, G, r, X, the final state and the whole backward stay fp32, the backward reading
    the bf16 buffers with a cast on load). Issue 15: fla keeps w / u / h / v_new in bf16 and beats our fp32 forward
    2.3-2.8x from 16K tokens on, ~1 GB of fp32 w / k̂ re-reads per head at T=64K; bf16 halves the w bytes and the
    state / vn writes. Accuracy against float64: relative error up to ~4e-3 instead of ~1e-6 (interpreter; the
    tests' bar is 2e-2, tests/ops/test_gated_delta_bf16.py; fla's forward is 4.7-4.9e-3 from float64 at the same
    shape, session 3). bf16 alone: 1.4x faster forward at 16K / 64K (session 14).

    seqb_dots: operands of the state backward's three dots (K̃ dS, (e^G q̂)ᵀ dO, wᵀ dvn). "fp32": fp32 (tf32).
    "bf16" (default): bf16 operands with fp32 accumulation, only when the buffers are bf16 (an fp32 call is
    unchanged); dS, dh and dvn stay fp32, as fla's backward casts its dh to k's dtype for the dots. Session 14: the
    state backward is the largest GDN kernel (7.5 of the GDN branch's ~20 ms f+b at 64K, NOTES run 2), and the f+b
    is 4.5x the forward after the forward's sweep; session 15: bf16 dots with 2 stages take 17-18% off the f+b
    (tested against float64 at the bf16 bar in tests/ops/test_gated_delta_bf16.py).

    seqb_stages / seqb_stages_bf16: software-pipelining stages of the state backward when its dots are fp32 / bf16.
    Two fields, not one, because of session 16 (H200, triton 3.6, K 128 / V 256, chunk 64, T 200, against float64):
    with 2 stages the fp32-dot launch gave wrong gradients whenever a bf16 operand was loaded (bf16 buffers with
    ``seqb_dots="fp32"``: dS0 rel 0.86; fp32 buffers under bf16 activations: gradients 0.70 at the 340m shape) or
    with ``seqb_scale="tile"`` and 32-wide tiles, and an illegal memory access with fp32 buffers and 8-warp parallel
    kernels; the same launch with 1 stage, and the bf16-dot launch with 2, pass. A codegen issue of the pipelined
    fp32-operand loop (the kernel and its indexing are the same in both); keep ``seqb_stages`` at 1.
    """

    par_bk: int = 64
    par_bv: int = 64
    par_warps: int = 4
    par_stages: int = 1
    seqf_bv: int = 16
    seqf_warps: int = 4
    seqf_stages: int = 3
    seqb_bv: int = 16
    seqb_warps: int = 8
    seqb_stages: int = 1
    seqb_stages_bf16: int = 2
    bwdk_bk: int = 64
    bwdk_bv: int = 64
    bwdk_warps: int = 8
    bwdk_stages: int = 1
    fin_bk: int = 32
    fin_bv: int = 32
    fin_warps: int = 4
    fin_stages: int = 1
    buffer_dtype: str = "auto"
    seqb_scale: str = "qk"
    seqb_dots: str = "bf16"

    def __post_init__(self) -> None:
        if self.buffer_dtype not in BUFFER_DTYPES:
            raise ValueError(f"buffer_dtype must be one of {', '.join(BUFFER_DTYPES)}, got {self.buffer_dtype!r}")
        if self.seqb_scale not in SEQB_SCALES:
            raise ValueError(f"seqb_scale must be one of {', '.join(SEQB_SCALES)}, got {self.seqb_scale!r}")
        if self.seqb_dots not in SEQB_DOTS:
            raise ValueError(f"seqb_dots must be one of {', '.join(SEQB_DOTS)}, got {self.seqb_dots!r}")


DEFAULT_CONFIG = GatedDeltaConfig()


_WITH_BUFFERS = {b: replace(DEFAULT_CONFIG, buffer_dtype=b) for b in BUFFER_DTYPES}


def config_with_buffers(buffer_dtype: str) -> GatedDeltaConfig:
    """``DEFAULT_CONFIG`` with this ``buffer_dtype`` (one of ``BUFFER_DTYPES``): the launch configuration behind the
    ``buffer_dtype`` argument of ``gated_delta`` / ``natsl_mixed`` and of the GDN and NAtS-L layers, which pin the
    buffer precision a model trains with (an experiment suite whose runs trained with fp32 buffers keeps them when
    the default changes; tests/experiments/test_gdn_buffer_pins.py). A lookup in a table built at import (no
    ``functools.cache``: Dynamo traces through it with a warning). Raises ValueError naming the field."""
    if buffer_dtype not in _WITH_BUFFERS:
        GatedDeltaConfig(buffer_dtype=buffer_dtype)  # raises: "buffer_dtype must be one of ..."
    return _WITH_BUFFERS[buffer_dtype]
