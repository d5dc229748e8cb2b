"""Launch configuration of the chunk-attention Triton kernels as a frozen object.

Passed as an argument (``triton_chunk_attention(..., config=...)``), never module state: the benchmark compares
variants with ``dataclasses.replace(DEFAULT_CONFIG, fwd_qc=2, ...)``, the tests poison buffers with
``ChunkAttentionConfig(poison=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...common.triton.config import KernelConfig

__all__ = ["BWD_MODES", "ChunkAttentionConfig", "DEFAULT_CONFIG"]

BWD_MODES = ("two_pass", "one_pass")


@dataclass(frozen=True)
class ChunkAttentionConfig(KernelConfig):
    """Warps and stages of the kernels (C = 64 on the GPU) and the backward variant.

    fwd_qc / dq_qc: chunks per query tile of the forward / dq kernels (capped at 128 // C, 1 for C > 64); dkv_qb:
    query rows per step of the dk/dv kernel (capped at C). H200 run 1 (T = 16K / 64K, 30% routed): fwd QC=1/4
    warps/3 stages 0.62 / 7.85 ms vs QC=2/8/3 0.88 / 10.8 ms; dq QC=1/4/2 saved 0.25 / 2.8 ms of forward+backward
    vs QC=2/8/2; dk/dv QB=64/4 warps/2 stages was the best tried. ``poison``: see ``KernelConfig``.

    bwd_mode: "two_pass" (a dq kernel over each query tile's key chunks, then the dk/dv kernel) or "one_pass" (one
    program per key chunk and head accumulates dk, dv in registers and adds its dq share with fp32 atomics into a
    zeroed buffer, as FlashAttention-2's backward: 5 matmuls per (query, key) block pair instead of 3 + 4);
    onepass_qb / onepass_warps / onepass_stages: query rows per step, warps and stages of that kernel (dkv_qb's
    rule for onepass_qb). Defaults from the sm_90 AOT report (benchmarks/aot_regs_attention.py, triton 3.6, Dk = 64,
    C = 64): QB=64 / 8 warps / 2 stages is the one setting tried without spills at both Dv = 64 (212 registers) and
    the NAtS-L benchmark's Dv = 128 (255), where 4 warps spill 188 B; QB=64 keeps every dot on wgmma (QB=32 puts the
    dq share's 32-row dot on mma.sync). No H200 timing of it yet (benchmarks/natsl_ops.py sweep).
    """

    fwd_qc: int = 1
    fwd_warps: int = 4
    fwd_stages: int = 3
    dq_qc: int = 1
    dq_warps: int = 4
    dq_stages: int = 2
    dkv_qb: int = 64
    dkv_warps: int = 4
    dkv_stages: int = 2
    bwd_mode: str = "two_pass"
    onepass_qb: int = 64
    onepass_warps: int = 8
    onepass_stages: int = 2

    def __post_init__(self) -> None:
        # tl.dot's smallest tile is 16 rows on a GPU (the interpreter does not check it: a GPU-only failure).
        for name in ("dkv_qb", "onepass_qb"):
            qb = getattr(self, name)
            if qb < 16 or qb & (qb - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot's smallest tile), got {qb}")
        if self.bwd_mode not in BWD_MODES:
            raise ValueError(f"bwd_mode must be one of {', '.join(map(repr, BWD_MODES))}, got {self.bwd_mode!r}")


DEFAULT_CONFIG = ChunkAttentionConfig()
