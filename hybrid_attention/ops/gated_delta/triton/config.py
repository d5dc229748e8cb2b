"""Launch configuration of the Triton gated delta rule (chunk forward / backward) as a frozen object.

Passed as an argument (``triton_gated_delta(..., config=...)``), never module state: the benchmark compares variants
with ``dataclasses.replace(DEFAULT_CONFIG, seqf_bv=32, ...)``, the tests poison buffers with
``GatedDeltaConfig(poison=True)``. Tile sizes are capped by the head dims at launch (``function._Tiles``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...common.triton.config import KernelConfig

__all__ = ["GatedDeltaConfig", "DEFAULT_CONFIG", "BUFFER_DTYPES", "SEQB_SCALES", "SEQB_DOTS", "LOCAL_DV",
           "config_with_buffers"]

BUFFER_DTYPES = ("auto", "fp32", "bf16")
"""Allowed ``GatedDeltaConfig.buffer_dtype`` values."""
SEQB_SCALES = ("qk", "tile")
"""Allowed ``GatedDeltaConfig.seqb_scale`` values."""
SEQB_DOTS = ("fp32", "bf16")
"""Allowed ``GatedDeltaConfig.seqb_dots`` and ``bwdk_dots`` values."""
LOCAL_DV = ("bwd_local", "state_bwd")
"""Allowed ``GatedDeltaConfig.local_dv`` values."""


@dataclass(frozen=True)
class GatedDeltaConfig(KernelConfig):
    """Tile sizes, warps and stages of the five kernels (one fixed configuration; no autotuning, so the interpreter
    runs it as is). ``benchmarks/aot_regs_gdn.py`` reports every kernel's registers / spills / shared memory at these
    launches (sm_90).

    The defaults are the fastest measured settings: ``python -m benchmarks.natsl_ops --sweep`` at the 340m heads with
    B 1 (buffers, state tiles, state-backward dots and stages), ``python -m benchmarks.gdn_launch`` at the two
    training shapes (wide state tiles, finish key tiles, the local value gradient, the pipelining stages); the GDN op
    section of benchmarks/README.md holds the rows. They compile without spills for sm_90.

    par_*: the parallel kernels (prep, output, bwd_local), block BK x BV; ``par_stages`` pipelines output and
    bwd_local, ``prep_stages`` prep (two stages speed up the first two and slow prep); bwdk_bv 32 with 3 stages
    pipelines the key-side backward's V loop. DECISION for both: the "pipelining stages" rows of the GDN op section
    in benchmarks/README.md. seqf_*: the sequential state forward (grid
    V / seqf_bv x B*H; ``seqf_bv=16`` with 8 warps hits an illegal memory access on the H200, a codegen issue of that
    tile/warp combination: do not use it); seqb_*: the state backward; bwdk_*: the key-side backward; fin_*: the
    finishing backward kernel (``fin_bk`` 64: the "GDN launch variants" rows in benchmarks/README.md). ``poison``:
    see ``KernelConfig``.

    seq_wide_bv / seq_wide_grid: with bf16 buffers the two sequential state kernels take ``seq_wide_bv``-wide value
    tiles (in place of ``seqf_bv`` / ``seqb_bv``) when that grid still has at least ``seq_wide_grid`` programs
    (sequences × heads × V / ``seq_wide_bv``); 0 keeps the narrow tiles, and so do float32 buffers (the state
    forward's 32-wide float32 tile at K = 128 exceeds sm_90's shared memory: the `fb1f178` row of the GPU suite
    table in benchmarks/README.md). Wide tiles halve the programs that each re-read the chunk's keys, which pays
    once the grid fills the GPU (B ≥ 4 at the 340m heads, the `small` step), while a single long sequence needs the
    narrow tiles' programs. DECISION: the "GDN launch variants" rows in benchmarks/README.md.

    seqb_scale: where the state backward applies the per-token scales r_k e^{G_last - G} and r_q e^G. "qk" (default):
    on the [C, K] key / query tiles before the dots. "tile": on the [C, BV] side (K̃ dS = diag(s) (k dS),
    (e^G q̂)ᵀ dO = qᵀ (diag(s') dO)), K / BV times fewer multiplications per program; within noise of "qk" on the
    H200 (-3% / -2% at 16K / 64K), so it is an option. "tile" with 16-wide / 8-warp tiles hits an illegal memory
    access on the H200 at K = 128 (triton 3.6, codegen); do not combine it with 16 / 8.

    buffer_dtype: storage of the forward's per-token / per-chunk buffers w, u (``prep``), S_n and vn
    (``state_fwd``), and the operand dtype of the dots of ``state_fwd`` and ``output``. "auto" (default): "bf16" when
    q is bf16 or fp16, "fp32" when it is fp32, so an fp32 call (the interpreter, fp32 training, float64 tests) keeps
    fp32 accuracy. "fp32": fp32 buffers, fp32 (tf32) dot operands. "bf16": those four buffers bf16, the dots of
    ``state_fwd`` / ``output`` take bf16 operands with fp32 accumulation (the carried state S, G, r, X, the final
    state and the whole backward stay fp32). bf16 buffers make the forward 1.4x faster at 16K / 64K on the H200, at a
    relative error up to ~4e-3 against float64 (the bar of tests/ops/test_gated_delta_bf16.py is 2e-2).

    seqb_dots: operands of the state backward's three dots (K̃ dS, (e^G q̂)ᵀ dO, wᵀ dvn). "fp32": fp32 (tf32).
    "bf16" (default): bf16 operands with fp32 accumulation, only when the buffers are bf16 (an fp32 call is
    unchanged); dS, dh and dvn stay fp32. With 2 stages it takes 17-18% off the forward + backward on the H200.

    seqb_stages / seqb_stages_bf16: software-pipelining stages of the state backward when its dots are fp32 / bf16.
    Two fields because the pipelined fp32-operand loop miscompiles on the H200 (triton 3.6, K 128 / V 256, chunk 64,
    T 200, against float64: dS0 relative error 0.86 with 2 stages and bf16 buffers); 1 stage for fp32 dots and 2 for
    bf16 dots pass. Keep ``seqb_stages`` at 1.

    bwdk_dots: operands of the key-side backward's three [C, BV] x [BV, BK] products (dO Sᵀ, dvn Sᵀ, vn dhᵀ). "fp32"
    (default): fp32 (tf32), every loaded tile cast to fp32. "bf16": bf16 operands with fp32 accumulation, only when the
    buffers are bf16 (an fp32 call is unchanged); the state backward then stores dh in bf16 (half its bytes, the
    rounding its bf16 dot would apply anyway). vn, S and the dO of bf16 activations are bf16 already, so dO Sᵀ is the
    same product; dvn and dh are rounded as the state backward's bf16 dots round them. DECISION (off): the "bf16
    operands in the key-side backward" rows of the GDN op section in benchmarks/README.md.

    local_dv: which kernel forms the chunk-local value gradient dvn_local = scale (P⊙D)ᵀ dO. "bwd_local":
    ``bwd_local`` writes it, [B, H, T, V] float32, and the state backward reads it. "state_bwd" (default):
    ``bwd_local`` writes scale (P⊙D)ᵀ, [B, H, N, C, C] bf16, and each state-backward program multiplies it by the dO
    tile it loads anyway (operands as its other dots, ``seqb_dots``), so the [T, V] float32 buffer is neither written
    nor read; with the state backward's bf16 dots only (bf16 buffers and ``seqb_dots="bf16"``; float32 operands keep
    "bwd_local": their form fails the CUDA head-shape tests at K 128 / V 256, the GPU suite table rows). DECISION:
    the "local value gradient" rows of the GDN op section in benchmarks/README.md.
    """

    par_bk: int = 64
    par_bv: int = 64
    par_warps: int = 4
    par_stages: int = 2
    prep_stages: int = 1
    seqf_bv: int = 16
    seqf_warps: int = 4
    seqf_stages: int = 3
    seqb_bv: int = 16
    seqb_warps: int = 8
    seqb_stages: int = 1
    seqb_stages_bf16: int = 2
    bwdk_bk: int = 64
    bwdk_bv: int = 32
    bwdk_warps: int = 8
    bwdk_stages: int = 3
    fin_bk: int = 64
    fin_bv: int = 32
    fin_warps: int = 4
    fin_stages: int = 1
    seq_wide_bv: int = 32
    seq_wide_grid: int = 128
    buffer_dtype: str = "auto"
    seqb_scale: str = "qk"
    seqb_dots: str = "bf16"
    local_dv: str = "state_bwd"
    bwdk_dots: str = "fp32"

    def __post_init__(self) -> None:
        if self.buffer_dtype not in BUFFER_DTYPES:
            raise ValueError(f"buffer_dtype must be one of {', '.join(BUFFER_DTYPES)}, got {self.buffer_dtype!r}")
        if self.seqb_scale not in SEQB_SCALES:
            raise ValueError(f"seqb_scale must be one of {', '.join(SEQB_SCALES)}, got {self.seqb_scale!r}")
        if self.seqb_dots not in SEQB_DOTS:
            raise ValueError(f"seqb_dots must be one of {', '.join(SEQB_DOTS)}, got {self.seqb_dots!r}")
        if self.bwdk_dots not in SEQB_DOTS:
            raise ValueError(f"bwdk_dots must be one of {', '.join(SEQB_DOTS)}, got {self.bwdk_dots!r}")
        if self.local_dv not in LOCAL_DV:
            raise ValueError(f"local_dv must be one of {', '.join(LOCAL_DV)}, got {self.local_dv!r}")


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
