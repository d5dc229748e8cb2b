"""Launch configuration of the bilinear S4D Triton op: the shared state-scan settings plus its readout kernels' keys."""

from __future__ import annotations

from dataclasses import dataclass

from ...common.triton.config import ScanConfig

__all__ = ["S4DBilinearConfig", "DEFAULT_CONFIG"]


@dataclass(frozen=True)
class S4DBilinearConfig(ScanConfig):
    """Frozen launch settings of one bilinear S4D forward / backward (see ``ScanConfig`` for the shared keys, which
    the readout kernels use too: stages, dot_prec, poison).

    max_chunk: kernel chunk length cap (the Interdomain op's default); JT: channel tile of the readout kernels (>= 16:
    tl.dot minimum); warps_fwd / warps_bwd: their warps; bwd_split: the backward readout as two launches (PART 1: da,
    db, X0 adjoint; PART 2: table grads), each recomputing Y: compiled for sm_90 at JT=32 / 8 warps the fused kernel
    spills 2.6 KB per thread, the two parts 0.7 and 0.8 KB (cuobjdump of an ahead-of-time build; the benchmark sweep
    compares both).
    """

    max_chunk: int = 32
    JT: int = 32
    warps_fwd: int = 4
    warps_bwd: int = 8
    bwd_split: bool = True


DEFAULT_CONFIG = S4DBilinearConfig()
