"""Launch configuration of the causal short-convolution Triton op."""

from __future__ import annotations

from dataclasses import dataclass

from ...common.triton.config import KernelConfig

__all__ = ["CausalConvConfig", "DEFAULT_CONFIG"]


@dataclass(frozen=True)
class CausalConvConfig(KernelConfig):
    """Frozen launch settings of one causal convolution forward / backward (powers of two).

    BT: tokens per program of both directions (and the chunk length of the packed documents' ``ChunkTable``);
    BC / BC_BWD: channels per program of the forward / backward; BC_STATE: channels per program of the per-sequence
    state kernels (final state, initial-state gradient); warps_fwd / warps_bwd: their warps; poison: see
    ``KernelConfig``.

    The defaults by the sm_90 compile report (``python benchmarks/aot_regs_conv.py``, triton 3.9, ``small`` C = 512,
    bf16): forward 64 x 64 / 4 warps 81 registers (156 with an initial state), no spills; backward 64 x 64 / 8 warps
    106 registers (142 with the states), where 4 warps take 220 (255 and 76 B of spills with the states). Not yet
    timed on the device: ``python -m benchmarks.causal_conv --sweep`` compares the variants.
    """

    BT: int = 64
    BC: int = 64
    BC_BWD: int = 64
    BC_STATE: int = 64
    warps_fwd: int = 4
    warps_bwd: int = 8

    def __post_init__(self) -> None:
        for name in ("BT", "BC", "BC_BWD", "BC_STATE"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"CausalConvConfig.{name} must be a power of two, got {v}")


DEFAULT_CONFIG = CausalConvConfig()
