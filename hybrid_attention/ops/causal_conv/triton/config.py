"""Launch configuration of the causal short-convolution Triton op."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...common.triton.config import KernelConfig

__all__ = ["BWD_FORMS", "FWD_FORMS", "TILE_BC", "TILE_BC_BWD", "CausalConvConfig", "DEFAULT_CONFIG"]

BWD_FORMS = ("reload", "shifted", "walk")
"""Allowed ``CausalConvConfig.bwd_form`` values."""
FWD_FORMS = ("tile", "walk")
"""Allowed ``CausalConvConfig.fwd_form`` values."""


TILE_BC = 64
"""Forward channel block of the tile forms when a walking setting falls back to them (``for_width``): the largest
without spills for sm_90 at BT 64 (the tile forms' register lines in benchmarks/README.md)."""
TILE_BC_BWD = 32
"""Backward ("reload") channel block of that fallback, chosen the same way."""


@dataclass(frozen=True)
class CausalConvConfig(KernelConfig):
    """Frozen launch settings of one causal convolution forward / backward (powers of two).

    BT: tokens per program of both directions (and the chunk length of the packed documents' ``ChunkTable``);
    BC / BC_BWD: channels per program of the forward / backward; BC_STATE: channels per program of the per-sequence
    state kernels (final state, initial-state gradient); warps_fwd / warps_bwd: their warps; poison: see
    ``KernelConfig``.

    fwd_form / bwd_form: the kernels.
      - "walk" (default, K = 4): ``_conv_fwd_walk_kernel`` / ``_conv_bwd_walk_kernel`` walk the program's BT tokens
        in order with the neighbouring input rows of its BC channels in registers, one [BC] row loaded and one
        stored per step, so wide channel blocks fit;
      - "tile" (forward) and "shifted" (backward, K = 4) / "reload" (backward, any K): the program holds [BT, BC]
        tiles at each of the K lags; "reload" recomputes the pre-activation at every lag.
    Other widths than K = 4 run "tile" / "reload" (``for_width``).

    The defaults are the launch sweep's fastest setting at the 340m heads' fused q|k|v width, within 3 % of the
    fastest at ``small``'s, and compile without spills for sm_90 (the short-convolution section of
    benchmarks/README.md: ``python -m benchmarks.causal_conv --sweep``, ``python benchmarks/aot_regs_conv.py``).
    """

    BT: int = 64
    BC: int = 256
    BC_BWD: int = 256
    BC_STATE: int = 64
    warps_fwd: int = 4
    warps_bwd: int = 4
    bwd_form: str = "walk"
    fwd_form: str = "walk"

    def __post_init__(self) -> None:
        if self.fwd_form not in FWD_FORMS:
            raise ValueError(f"CausalConvConfig.fwd_form must be one of {', '.join(map(repr, FWD_FORMS))}, "
                             f"got {self.fwd_form!r}")
        if self.bwd_form not in BWD_FORMS:
            raise ValueError(f"CausalConvConfig.bwd_form must be one of {', '.join(map(repr, BWD_FORMS))}, "
                             f"got {self.bwd_form!r}")
        for name in ("BT", "BC", "BC_BWD", "BC_STATE"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"CausalConvConfig.{name} must be a power of two, got {v}")

    def for_width(self, K: int) -> CausalConvConfig:
        """The settings that run at kernel width K: unchanged for K = 4; otherwise the forms written for K = 4 give
        way to "tile" / "reload", and a walking form's channel blocks to ``TILE_BC`` / ``TILE_BC_BWD`` at most (BT,
        and with it the packed documents' chunk table, stays)."""
        if K == 4:
            return self
        bc = min(self.BC, TILE_BC) if self.fwd_form == "walk" else self.BC
        bcb = min(self.BC_BWD, TILE_BC_BWD) if self.bwd_form == "walk" else self.BC_BWD
        return replace(self, fwd_form="tile", bwd_form="reload", BC=bc, BC_BWD=bcb)


DEFAULT_CONFIG = CausalConvConfig()
