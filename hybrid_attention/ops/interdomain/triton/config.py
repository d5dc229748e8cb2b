"""Launch configuration of the Interdomain Triton op: the shared state-scan settings plus its chunk kernels' keys."""

from __future__ import annotations

from dataclasses import dataclass

from ...common.triton.config import ScanConfig

__all__ = ["InterdomainConfig", "DEFAULT_CONFIG"]


@dataclass(frozen=True)
class InterdomainConfig(ScanConfig):
    """Frozen launch settings of one Interdomain forward / backward (see ``ScanConfig`` for the shared keys).

    BC: sub-chunk rows (>= 16: tl.dot minimum; BC >= L means one band-matmul block per chunk); warps_chunk_fwd /
    warps_chunk_bwd: warps of the chunk kernels; max_chunk: kernel chunk length cap (run 2 on the H200: L=32 beat
    L=64, benchmarks/NOTES.md); bwd_split: the backward chunk kernel as two launches (value side, key side),
    measured slower (run 3).
    """

    BC: int = 32
    warps_chunk_fwd: int = 4
    warps_chunk_bwd: int = 8
    max_chunk: int = 32
    bwd_split: bool = False


DEFAULT_CONFIG = InterdomainConfig()
