"""Launch configuration of the chunk-attention Triton kernels as a frozen object.

Passed as an argument (``triton_chunk_attention(..., config=...)``), never module state: the benchmark compares
variants with ``dataclasses.replace(DEFAULT_CONFIG, fwd_qc=2, ...)``, the tests poison buffers with
``ChunkAttentionConfig(poison=True)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...common.triton.config import KernelConfig

__all__ = ["ChunkAttentionConfig", "DEFAULT_CONFIG"]


@dataclass(frozen=True)
class ChunkAttentionConfig(KernelConfig):
    """Warps and stages of the three kernels (C = 64 on the GPU).

    fwd_qc / dq_qc: chunks per query tile of the forward / dq kernels (capped at 128 // C, 1 for C > 64); dkv_qb:
    query rows per step of the dk/dv kernel (capped at C). H200 run 1 (T = 16K / 64K, 30% routed): fwd QC=1/4
    warps/3 stages 0.62 / 7.85 ms vs QC=2/8/3 0.88 / 10.8 ms; dq QC=1/4/2 saved 0.25 / 2.8 ms of forward+backward
    vs QC=2/8/2; dk/dv QB=64/4 warps/2 stages was the best tried. ``poison``: see ``KernelConfig``.
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

    def __post_init__(self) -> None:
        # tl.dot's smallest tile is 16 rows on a GPU (the interpreter does not check it: a GPU-only failure).
        if self.dkv_qb < 16 or self.dkv_qb & (self.dkv_qb - 1):
            raise ValueError(f"dkv_qb must be a power of two >= 16 (tl.dot's smallest tile), got {self.dkv_qb}")


DEFAULT_CONFIG = ChunkAttentionConfig()
