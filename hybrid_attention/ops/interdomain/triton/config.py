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
    L=64, benchmarks/NOTES.md); bwd_split: the backward chunk kernel as two launches (value side, key side).

    Defaults from the sm_90 AOT report (benchmarks/aot_regs.py, triton 3.9, R=D=M=64, L=BC=32; registers / spill
    stores per thread): forward 8 warps 225 / 0 B (4 warps: 255 / 44 B); backward split 255 / 0 B and 255 / 40 B
    (fused: 255 / 872 B). Run 3 on the H200 measured the split slower (4.48 vs 3.93 ms at 32K) when both spilled
    under an older triton (fused 240 B); the split as default is a prediction until the next device run.
    """

    BC: int = 32
    warps_chunk_fwd: int = 8
    warps_chunk_bwd: int = 8
    max_chunk: int = 32
    bwd_split: bool = True


DEFAULT_CONFIG = InterdomainConfig()
