"""Launch configuration of the Triton gated delta rule (chunk forward / backward) as a frozen object.

Passed as an argument (``triton_gated_delta(..., config=...)``), never module state: the benchmark compares variants
with ``dataclasses.replace(DEFAULT_CONFIG, seqf_bv=32, ...)``, the tests poison buffers with
``GatedDeltaConfig(poison=True)``. Tile sizes are capped by the head dims at launch (``function._Tiles``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...common.triton.config import KernelConfig

__all__ = ["GatedDeltaConfig", "DEFAULT_CONFIG", "BUFFER_DTYPES", "SEQB_SCALES"]

BUFFER_DTYPES = ("fp32", "bf16")
"""Allowed ``GatedDeltaConfig.buffer_dtype`` values."""
SEQB_SCALES = ("qk", "tile")
"""Allowed ``GatedDeltaConfig.seqb_scale`` values."""


@dataclass(frozen=True)
class GatedDeltaConfig(KernelConfig):
    """Tile sizes, warps and stages of the five kernels (one fixed configuration; no autotuning, so the interpreter
    runs it as is). Chosen from sm_90 compiles on the CPU machine; ``benchmarks/aot_regs_gdn.py`` reports every
    kernel's registers / spills / shared memory at these launches (triton 3.6, 3.9: no spills at the 340m or small GDN
    shapes; par_warps=4 spills 96-144 B in bwd_local, so the parallel kernels keep 8 warps).

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
    and 8 warps, it ran there, untimed (both spill in the AOT compile). Do not combine it with 16 / 8.

    buffer_dtype: storage of the forward's per-token / per-chunk buffers w, u (``prep``), S_n and vn
    (``state_fwd``), and the operand dtype of the dots of ``state_fwd`` and ``output``. "fp32" (default): fp32
    buffers, fp32 (tf32) dot operands. "bf16": those four buffers bf16 (rounded to nearest even), the dots of
    ``state_fwd`` / ``output`` take bf16 operands with fp32 accumulation (the carried state S cast to bf16 only as
    the operand of ``w S``; S itself, G, r, X, the final state and the whole backward stay fp32, the backward reading
    the bf16 buffers with a cast on load). Issue 15: fla keeps w / u / h / v_new in bf16 and beats our fp32 forward
    2.3-2.8x from 16K tokens on, ~1 GB of fp32 w / k̂ re-reads per head at T=64K; bf16 halves the w bytes and the
    state / vn writes. Accuracy against float64: relative error up to ~4e-3 instead of ~1e-6 (interpreter; the
    tests' bar is 2e-2, tests/ops/test_gated_delta_bf16.py).
    """

    par_bk: int = 64
    par_bv: int = 64
    par_warps: int = 8
    par_stages: int = 1
    seqf_bv: int = 16
    seqf_warps: int = 4
    seqf_stages: int = 1
    seqb_bv: int = 16
    seqb_warps: int = 8
    seqb_stages: int = 1
    bwdk_bk: int = 64
    bwdk_bv: int = 32
    bwdk_warps: int = 8
    bwdk_stages: int = 1
    fin_bk: int = 32
    fin_bv: int = 32
    fin_warps: int = 8
    fin_stages: int = 1
    buffer_dtype: str = "fp32"
    seqb_scale: str = "qk"

    def __post_init__(self) -> None:
        if self.buffer_dtype not in BUFFER_DTYPES:
            raise ValueError(f"buffer_dtype must be one of {', '.join(BUFFER_DTYPES)}, got {self.buffer_dtype!r}")
        if self.seqb_scale not in SEQB_SCALES:
            raise ValueError(f"seqb_scale must be one of {', '.join(SEQB_SCALES)}, got {self.seqb_scale!r}")


DEFAULT_CONFIG = GatedDeltaConfig()
