"""Launch configuration of the causal short-convolution Triton op."""

from __future__ import annotations

from dataclasses import dataclass

from ...common.triton.config import KernelConfig

__all__ = ["BWD_FORMS", "CausalConvConfig", "DEFAULT_CONFIG"]

BWD_FORMS = ("reload", "shifted")
"""Allowed ``CausalConvConfig.bwd_form`` values."""


@dataclass(frozen=True)
class CausalConvConfig(KernelConfig):
    """Frozen launch settings of one causal convolution forward / backward (powers of two).

    BT: tokens per program of both directions (and the chunk length of the packed documents' ``ChunkTable``);
    BC / BC_BWD: channels per program of the forward / backward; BC_STATE: channels per program of the per-sequence
    state kernels (final state, initial-state gradient); warps_fwd / warps_bwd: their warps; poison: see
    ``KernelConfig``.

    bwd_form: the backward tile kernel: "shifted" (default; ``_conv_bwd_shifted_kernel``, K = 4, other widths run
    "reload": the 2K-1 distinct x tiles and the K dy tiles loaded once each) or "reload" (``_conv_bwd_kernel``, any
    K: with SiLU it recomputes the pre-activation at each of the K lags from K shifted x loads, K² + K x-tile loads
    per program). "shifted" is the faster at both timed widths (the short-convolution op table of
    benchmarks/README.md, ``python -m benchmarks.causal_conv --quick``).

    The defaults are the largest tiles that compile without spills for sm_90 (the register table of the
    short-convolution section of benchmarks/README.md, ``python benchmarks/aot_regs_conv.py``); the launch sweep
    ``python -m benchmarks.causal_conv --sweep`` has not run on a GPU.
    """

    BT: int = 32
    BC: int = 64
    BC_BWD: int = 32
    BC_STATE: int = 64
    warps_fwd: int = 4
    warps_bwd: int = 4
    bwd_form: str = "shifted"

    def __post_init__(self) -> None:
        if self.bwd_form not in BWD_FORMS:
            raise ValueError(f"CausalConvConfig.bwd_form must be one of {', '.join(map(repr, BWD_FORMS))}, "
                             f"got {self.bwd_form!r}")
        for name in ("BT", "BC", "BC_BWD", "BC_STATE"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"CausalConvConfig.{name} must be a power of two, got {v}")


DEFAULT_CONFIG = CausalConvConfig()
