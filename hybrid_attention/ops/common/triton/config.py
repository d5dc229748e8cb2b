"""Launch configurations of the Triton ops as frozen (hashable, immutable) objects passed as arguments: the base every
op's config shares (``KernelConfig``) and the settings of the shared diagonal-SSM state scans (``ScanConfig``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import interpreting

__all__ = ["KernelConfig", "ScanConfig", "STATE_DTYPES"]

STATE_DTYPES = ("auto", "fp32", "bf16")
"""Allowed ``ScanConfig.state_dtype`` values."""


@dataclass(frozen=True)
class KernelConfig:
    """What every op's launch configuration has: ``poison`` fills every kernel-written buffer with NaN before the
    launch (tests / benchmark checks: an element a kernel skips shows up). Keyword-only, so subclasses keep their
    own positional order.

    DECISION: Fixed settings, no autotuning: the interpreter needs one configuration, and the GPU benchmarks compare
    variants explicitly by passing another config (``ScanConfig``, an op's subclass, or ``GatedDeltaConfig`` /
    ``ChunkAttentionConfig``, which subclass ``KernelConfig``) as an argument; nothing here is module state. The
    registered custom ops (``torch.library``) always run the defaults and take only scalars, so ``torch.compile`` never
    sees a config object. Each op's kernel configuration subclasses ``ScanConfig`` with its chunk-kernel keys
    (``InterdomainConfig``, ``S4DBilinearConfig``), so one object describes an op's whole launch sequence.
    """

    poison: bool = field(default=False, kw_only=True)

    def empty(self, *shape: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialised kernel output buffer of ``shape``, NaN-filled when ``poison``."""
        t = torch.empty(*shape, device=device, dtype=dtype)
        if self.poison:
            t.fill_(float("nan"))
        return t

    def empty_like(self, x: torch.Tensor) -> torch.Tensor:
        """``empty`` with the shape, device and dtype of ``x``."""
        return self.empty(*x.shape, device=x.device, dtype=x.dtype)


@dataclass(frozen=True)
class ScanConfig(KernelConfig):
    """Settings of the state scans (``ssm_scan.py``) and the ones every op's chunk kernels share.

    BMS / BCH: mode / channel block of the sequential state kernels; BCH_DZ: channel block of the state-carry
    gradient kernel; fuse_dz: reverse scan and state-carry gradient in one launch (``_state_bwd_dz``: H200,
    T=32K forward+backward 9.78 -> 8.52 ms) with channel block BCH_FZ (it holds all M modes;
    >= 16 for tl.dot) and warps_fz warps (sm_90 AOT: 4 warps spill 584 B, 8 warps 16 B, benchmarks/aot_regs.py);
    stages: software pipelining depth of the parallel chunk kernels, stages_state of the sequential scans (their
    loads do not depend on the carried state); dot_prec: input precision of float32 matmuls on the GPU ("tf32",
    "tf32x3", "ieee"; always "ieee" under the interpreter); poison: see ``KernelConfig``.

    state_dtype: storage of the chunk-entering states the scan writes for the chunk kernels (and, with the op's
    ``save_states``, keeps for the backward): "fp32" (the default here), "bf16" (half the bytes: 2 → 1 KiB per token
    and head at R = D = M = 64, L = 32, rounded to nearest on store) or "auto" (bf16 for bf16 / fp16 activations,
    else fp32: float32 callers keep float32 accuracy). The carried recurrence, the local adjoints and every state
    gradient stay float32; only the stored copies are rounded.
    """

    BMS: int = 32
    BCH: int = 32
    BCH_DZ: int = 64
    warps_state: int = 4
    stages_state: int = 2
    warps_dz: int = 8
    fuse_dz: bool = True
    BCH_FZ: int = 16
    warps_fz: int = 8
    stages: int = 1
    dot_prec: str = "tf32"
    state_dtype: str = "fp32"

    def __post_init__(self) -> None:
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype must be one of {', '.join(STATE_DTYPES)}, got {self.state_dtype!r}")

    def state_torch_dtype(self, act: torch.dtype) -> torch.dtype:
        """The torch dtype of the chunk-state buffer (``state_dtype``) for activations of dtype ``act``."""
        low = self.state_dtype == "bf16" or (self.state_dtype == "auto" and act in (torch.bfloat16, torch.float16))
        return torch.bfloat16 if low else torch.float32

    def prec(self) -> str:
        """The DOT_PREC constexpr of the launches: ``dot_prec`` on the GPU, "ieee" under the interpreter."""
        return "ieee" if interpreting() else self.dot_prec
