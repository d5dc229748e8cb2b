"""Launch configuration of the Interdomain Triton op: the shared state-scan settings plus its chunk kernels' keys."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...common.triton import interpreting
from ...common.triton.config import ScanConfig

__all__ = ["InterdomainConfig", "DEFAULT_CONFIG", "REAL_DOT_PRECS", "CHUNK_DOTS", "BUFFER_DTYPES"]

REAL_DOT_PRECS = ("tf32", "tf32x3", "ieee")
"""Allowed ``InterdomainConfig.real_dot_prec`` values (Triton's ``input_precision`` names)."""

CHUNK_DOTS = ("fp32", "bf16", "auto")
"""Allowed ``InterdomainConfig.chunk_dots`` values."""

BUFFER_DTYPES = ("fp32", "bf16", "auto")
"""Allowed ``InterdomainConfig.buffer_dtype`` values."""


@dataclass(frozen=True)
class InterdomainConfig(ScanConfig):
    """Frozen launch settings of one Interdomain forward / backward (see ``ScanConfig`` for the shared keys).

    BC: sub-chunk rows (>= 16: tl.dot minimum; BC >= L means one band-matmul block per chunk); warps_chunk_fwd /
    warps_chunk_bwd: warps of the chunk kernels; max_chunk: kernel chunk length cap (H200: L=32 beats
    L=64); bwd_split: the backward chunk kernel as two launches (value side, key side).

    Defaults: the fastest measured on the H200. DECISION: the split backward at 4 warps. ``python -m
    benchmarks.interdomain_launch`` (R = D = M = 64, readout "real", bf16), forward + backward ms, split at 4 warps
    against the one-launch backward at 8 warps: 4.040 vs 4.250 at B×T×H = 16×2048×8 and 8.555 vs 8.977 at 1×32768×16
    (the backward chunk stage 1.97 vs 2.19 and 3.85 vs 4.29); split at 8 warps 4.218 / 8.944, one launch at 4 warps
    4.492 / 9.593; the same order in two separate runs. The sm_90 AOT report (benchmarks/aot_regs.py,
    triton 3.6 = the device's, L = BC = 32; registers / spill stores per thread) agrees: one launch 255 / 832 B,
    split 255 / 0 B + 255 / 40 B. Forward at 4 warps (255 / 52 B) measures faster than 8 warps (225 / 0 B):
    0.741 vs 0.956 ms at 16×2048×8.

    real_one_pass: how readout="real" runs. True: one forward / backward pass of the chunk kernels with the readout
    r = Cᵀ Re(C p) of the key-side vector p, from C itself (two M×M tiles, REAL_C in kernels.py, whose DECISION
    comment holds its compile report), the cost of one transpose pass. False: two passes, "transpose" and "hermitian"
    with half of each operator, averaged (twice the work).
    DECISION (H200, ``python -m benchmarks.interdomain_ops``): one pass is the default. Op fwd+bwd 2.18 / 4.60 / 9.05 ms
    against 7.36 / 9.21 / 18.01 ms for two passes at T = 4K / 16K / 32K (transpose 2.79 / 4.47 / 8.76); the `small` x6
    training step at 16 x 2048 compiled 42.4 ms against 67.7 ms. Precision: within the 5e-3 bar at the training shape (T
    = 1000 and 4096, R = D = M = 64: worst 2.7e-3 / 3.6e-3, two-pass 3.4e-3 at 4096); at tiny shapes with a dominant
    slow mode (the denominator tests) tf32 dots make its dq 2.2e-2 (two-pass 3.2e-3), ieee dots 7e-6
    (benchmarks/interdomain_real_precision.py). The registered op (the training path, which runs ``DEFAULT_CONFIG``)
    follows this default.

    save_states: the forward keeps its chunk-entering states ([B·H, T/L, 2, M, R+D] in ``state_dtype``, 4 (R+D) M / L
    bytes per token and head in bf16: 1 KiB at R = D = M = 64, L = 32; twice that in float32) and power table for the
    backward, which then runs no forward state scan (only when a gradient is needed: the forward alone stores nothing
    extra). DECISION: on by default, faster at every measured shape for the same results (the kept-states rows of the
    launch table in benchmarks/README.md).

    real_dot_prec: input precision of the one-pass "real" readout's chained products through C (x = Re(C p),
    r = Cᵀ x, and in the backward gx = gr Cᵀ, gp = gx C) on the GPU; every other dot keeps ``dot_prec``. "tf32"
    (default, measured above); "tf32x3" (≈ float32 accuracy, three tensor-core passes for those 4 + 6 dots per
    sub-chunk) is the opt-in answer to the tiny dominant-mode cases, not yet timed.

    chunk_dots: operands of every matmul in the chunk kernels. "fp32": float32 operands at ``dot_prec`` /
    ``real_dot_prec``. "bf16": bf16 operands with float32 accumulation (half the operand registers, the bf16 MMA
    rate); the power table, the carried chunk states and every elementwise decay / state term stay float32, only the
    operands of each product are rounded. "auto" (default): "bf16" for bf16 activations, else "fp32" (fp16 callers
    keep the finer operands they chose). Under the interpreter the rounding is reproduced exactly
    (``ops/common/triton/lowp.py``). The state scans keep ``dot_prec``. The denominator ablation always runs "fp32"
    (``triton_interdomain`` passes the op's ``fp32_dots``): its quotient amplifies the rounding past the bars
    (tests/ops/test_interdomain_triton.py, ``test_bf16_chunk_dots``). DECISION: "auto", the "bf16 operands" rows of
    the launch table in benchmarks/README.md (faster at 16×2048×8 and 32K; every Interdomain test of tests/ops,
    layers, models and serving passes with it on the GPU).

    buffer_dtype: storage of the backward's per-chunk buffers, the chunk-local state adjoints (the chunk kernel writes
    them, the reverse scan reads them once) and the per-chunk dK / dC partials (summed on the host in float32): "auto"
    (default: bf16 for bf16 activations with ``fuse_dz``, else float32), "fp32", or "bf16" (half their bytes, rounded
    to nearest on store; needs ``fuse_dz``, whose scan only reads the adjoints). Every sum over them stays float32.
    DECISION: the bf16-buffer rows of the Interdomain launch tables in benchmarks/README.md (the table with "auto" as
    the default).

    state_dtype (``ScanConfig``): "auto" here, so bf16 training stores its chunk states in bf16 and float32 callers
    keep float32 states. DECISION: the "bf16 chunk states" rows of the launch table in benchmarks/README.md (faster at
    every measured shape; outputs within bf16 rounding of the float32 default).
    """

    BC: int = 32
    save_states: bool = True
    warps_chunk_fwd: int = 4
    warps_chunk_bwd: int = 4
    max_chunk: int = 32
    bwd_split: bool = True
    real_one_pass: bool = True
    real_dot_prec: str = "tf32"
    chunk_dots: str = "auto"
    buffer_dtype: str = "auto"
    state_dtype: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.real_dot_prec not in REAL_DOT_PRECS:
            raise ValueError(f"real_dot_prec must be one of {', '.join(REAL_DOT_PRECS)}, got {self.real_dot_prec!r}")
        if self.chunk_dots not in CHUNK_DOTS:
            raise ValueError(f"chunk_dots must be one of {', '.join(CHUNK_DOTS)}, got {self.chunk_dots!r}")
        if self.buffer_dtype not in BUFFER_DTYPES:
            raise ValueError(f"buffer_dtype must be one of {', '.join(BUFFER_DTYPES)}, got {self.buffer_dtype!r}")
        if self.buffer_dtype == "bf16" and not self.fuse_dz:
            raise ValueError("buffer_dtype='bf16' needs fuse_dz=True (the unfused scan writes the adjoints in place)")

    def buffers(self, act: torch.dtype) -> torch.dtype:
        """dtype of the backward's per-chunk buffers for activations of dtype ``act`` (``buffer_dtype``; "auto"
        without ``fuse_dz`` is float32)."""
        bf16 = self.buffer_dtype == "bf16" or (self.buffer_dtype == "auto" and act == torch.bfloat16 and self.fuse_dz)
        return torch.bfloat16 if bf16 else torch.float32

    def bf16_dots(self, act: torch.dtype, fp32_dots: bool = False) -> bool:
        """Whether the chunk kernels take bf16 operands for activations of dtype ``act`` (``chunk_dots``); never for a
        call that asks for float32 operands (``fp32_dots``: the denominator ablation)."""
        if fp32_dots:
            return False
        return self.chunk_dots == "bf16" or (self.chunk_dots == "auto" and act == torch.bfloat16)

    def _bf16_prec(self, act: torch.dtype, fp32_dots: bool) -> str | None:
        """The chunk kernels' bf16 precision name (``lowp.mm``) when they take bf16 operands, else None."""
        if not self.bf16_dots(act, fp32_dots):
            return None
        return "bf16_rn" if interpreting() else "bf16"

    def chunk_prec(self, act: torch.dtype, fp32_dots: bool = False) -> str:
        """The DOT_PREC constexpr of the chunk kernels for activations of dtype ``act``: ``prec()``, or the bf16 name
        (``bf16_dots``)."""
        return self._bf16_prec(act, fp32_dots) or self.prec()

    def real_prec(self, act: torch.dtype, fp32_dots: bool = False) -> str:
        """The REAL_PREC constexpr of the chunk kernels for activations of dtype ``act``: ``real_dot_prec`` on the GPU,
        "ieee" under the interpreter, or the bf16 name (``bf16_dots``)."""
        return self._bf16_prec(act, fp32_dots) or ("ieee" if interpreting() else self.real_dot_prec)


DEFAULT_CONFIG = InterdomainConfig()
