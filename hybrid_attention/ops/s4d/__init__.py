"""S4D-only control op of Interdomain Attention (arXiv 2605.24330, §3 "S4D-only"): the Interdomain S4D state read out
linearly, y_t = Re(wᵀ C X_t), hence an S4-style convolution. Forms: naive.py (the definition), conv_form.py (the
convolution view), fft.py, toeplitz.py and chunk.py (packed documents without a host sync); the bilinear mixer is
``ops.s4d_bilinear``."""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend, validate_backend
from ..common.ssm import validate_chunk_size
from .chunk import chunk_s4d
from .fft import fft_s4d
from .naive import naive_s4d
from .toeplitz import toeplitz_s4d

__all__ = ["s4d", "naive_s4d", "fft_s4d", "toeplitz_s4d", "chunk_s4d", "auto_backend", "BACKENDS", "FFT_ALIASES"]

BACKENDS = ("auto", "reference", "naive", "triton", "fft", "toeplitz", "chunk")
# "reference" and "triton" run the FFT form. There is no Triton kernel: cuFFT and cuBLAS already run the convolution.
# "triton" is accepted for configuration compatibility: the Interdomain layer passes its one ``backend`` to whichever
# core it runs (``layers/interdomain.py``), so a model configured with ``backend: triton`` and the linear contraction
# runs the FFT here.
FFT_ALIASES = ("reference", "triton")
_FORMS = {"naive": naive_s4d, "toeplitz": toeplitz_s4d, "fft": fft_s4d, "chunk": chunk_s4d,
          **{alias: fft_s4d for alias in FFT_ALIASES}}

# DECISION ("auto" on CUDA, dense batches): the Toeplitz matmul (in blocks of 512 rows above 2048 tokens,
# toeplitz.py) up to 16384 tokens; above, the chunked form under torch.compile and the FFT in eager mode: the fastest
# form at each length and mode in the S4D tables of benchmarks/README.md (`python -m benchmarks.s4d_conv` and
# `--long-only`; the Toeplitz cost per token grows with T, the FFT's with log T). Toeplitz's bf16 error vs float64 is
# inside the 5e-3 / 1e-2 bars (same tables). On the CPU (and for float64) "auto" stays on the FFT: exact to 1e-10.
# DECISION (packed documents, any device): "auto" with cu_seqlens runs "chunk". The Toeplitz / FFT forms run one
# convolution per document at its own length with host-side offsets (``per_document``): under torch.compile Dynamo
# re-specialises per document length and the packed s4d training step does not finish (H200, B = 1, T = 32768, 82
# documents); the chunked form has static shapes given T, N and chunk_size and reads nothing on the host. Without
# cu_seqlens the Toeplitz / FFT choice above applies (benchmarks/s4d_conv.py also times the chunk form).
AUTO_TOEPLITZ_MAX_T = 16384


def auto_backend(a: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> str:
    """What "auto" runs for inputs a [B, T, H, R]: "chunk" for packed documents; on CUDA (not float64) "toeplitz" up
    to ``AUTO_TOEPLITZ_MAX_T`` tokens, above it "chunk" while torch.compile traces and "fft" in eager mode; "fft" on
    the CPU (the DECISIONs above)."""
    if cu_seqlens is not None:
        return "chunk"
    if a.device.type != "cuda" or a.dtype == torch.float64:
        return "fft"
    if a.shape[1] <= AUTO_TOEPLITZ_MAX_T:
        return "toeplitz"
    return "chunk" if torch.compiler.is_compiling() else "fft"


def s4d(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    w: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    backend: str = "auto",
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S4D-only control (linear readout y_t = Re(wᵀ C X_t)), dispatched to a backend.

    Per batch and head, the complex diagonal state X_t = λ ⊙ X_{t-1} + B z_tᵀ over z_t = [a_t ; b_t] ∈ R^{R+D} is read
    out with C the shared M×M readout and w ∈ R^M per head (the paper's extra H·M parameters). Linear in the state, it
    is a convolution y = K_h * z per channel with K_h(l) = Re(c̃ᵀ (λ^l ⊙ B)), c̃ = Cᵀw (plus the decaying response to
    an initial state).

    Shapes: a ``[B, T, H, R]``, b ``[B, T, H, D]`` real (R may differ from D); log_lam, B ``[H, M]`` complex
    (discretised); C ``[H, M, M]`` complex; w ``[H, M]`` real; initial_state ``[B, H, M, R + D]`` complex.
    log_lam, B and C may also be ``Planar`` (real, imaginary) pairs (``ops/common/planar.py``; ``S4DCore.planar()``):
    the fast forms then run no complex op unless a state is passed in or returned (what the layers' compiled
    training path relies on). Returns ``(y [B, T, H, R + D] in a.dtype, final_state or None)``. See ``naive_s4d``
    for the definition.

    ``backend``: "naive" runs the token loop; "toeplitz" runs ``toeplitz_s4d``; "reference", "triton" and "fft" run
    ``fft_s4d``; "chunk" runs ``chunk_s4d``; "auto" runs ``chunk_s4d`` for packed documents, else ``toeplitz_s4d``
    on CUDA for T <= ``AUTO_TOEPLITZ_MAX_T`` (non-float64 inputs), ``chunk_s4d`` above it under torch.compile and
    ``fft_s4d`` otherwise (the DECISIONs above).
    ``chunk_size`` (validated for every backend: a positive int) is the chunk length of "chunk" and unused by the
    others. ``cu_seqlens [N + 1]``: packed documents (B == 1, ``ops/common/varlen.py``): "chunk" runs them in one
    pass, the other forms one convolution per document; initial and final states per sequence ``[N, ...]``.
    """
    # "auto" is decided once, by auto_backend (every form runs every input, so "auto" is always "supported"; every
    # form takes cu_seqlens). The name is validated before chunk_size, and auto_backend runs after both.
    validate_backend(backend, "s4d", BACKENDS)
    validate_chunk_size(chunk_size)  # checked for every backend so that errors do not depend on the backend
    backend = resolve_backend(backend, "s4d", True, BACKENDS, fast=lambda: auto_backend(a, cu_seqlens))
    extra = {"chunk_size": chunk_size} if backend == "chunk" else {}  # the only chunked form
    return _FORMS[backend](a, b, log_lam, B, C, w, initial_state=initial_state, output_final_state=output_final_state,
                           cu_seqlens=cu_seqlens, **extra)
