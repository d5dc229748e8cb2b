"""Gated delta rule (Gated DeltaNet) with the NAtS-L per-chunk commit mask.

Public op: ``gated_delta(q, k, v, g, beta, *, commit=None, chunk_size=64, ...)``; see ``naive.naive_gated_delta``
for the definition. Argument order ``(q, k, v, g, beta)`` is the same in every form (fla's naive functions swap g and
beta; we do not).
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.varlen import varlen_kwargs
from . import triton as triton_backend
from .chunk import chunk_gated_delta
from .naive import naive_gated_delta
from .triton import triton_gated_delta

__all__ = ["gated_delta", "chunk_gated_delta", "naive_gated_delta", "triton_gated_delta", "BACKENDS"]

BACKENDS = ("auto", "reference", "naive", "triton")
_FORMS = {"reference": chunk_gated_delta, "naive": naive_gated_delta, "triton": triton_gated_delta}


def gated_delta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    commit: torch.Tensor | None = None,
    chunk_size: int = 64,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm: bool = True,
    decay_uncommitted: bool = True,
    backend: str = "auto",
    cu_seqlens: torch.Tensor | None = None,
    buffer_dtype: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule with optional per-chunk commit mask.

    Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g (log-decay <= 0), beta ``[B, T, H]``;
    commit ``[B, ceil(T / chunk_size), H]`` (chunks aligned to position 0 of this call; None = plain GDN);
    initial_state ``[B, H, K, V]``. Returns ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] or None)``.

    backend: ``"reference"`` -> the chunk-parallel PyTorch form; ``"naive"`` -> the token loop; ``"triton"`` -> the
    Triton kernels (forward + backward; CUDA, or CPU under ``TRITON_INTERPRET=1``); ``"auto"`` -> Triton for CUDA
    inputs it supports (not float64, chunk_size in {16, 32, 64, 128}, K <= 256, K <= 32 at chunk 128) when Triton
    is installed, else the reference form.

    ``cu_seqlens [N + 1]``: packed documents (B == 1, ``ops/common/varlen.py``): the state starts fresh at each
    document (or from ``initial_state [N, H, K, V]``), final states ``[N, H, K, V]``, chunks restart at each
    document start (commit ``[1, Σ ceil(len_i / chunk_size), H]``); every form, the Triton kernels too ("auto"
    picks them for supported CUDA inputs as without ``cu_seqlens``).

    ``buffer_dtype``: the Triton kernels' buffer precision, one of ``triton.BUFFER_DTYPES`` ("auto": bf16 buffers for
    bf16 / fp16 activations, fp32 for fp32; "fp32"; "bf16"; ``GatedDeltaConfig.buffer_dtype``). The PyTorch forms
    compute in fp32 or float64 whatever it says; it is checked for every backend, so a typo fails on the CPU too.
    """
    config = triton_backend.config_with_buffers(buffer_dtype)  # ValueError naming buffer_dtype
    supported = lambda: q.is_cuda and triton_backend.supported(q, v, chunk_size)  # noqa: E731
    form = resolve_backend(backend, "gated_delta", supported, BACKENDS, varlen=cu_seqlens is not None, no_varlen=())
    fn, extra = _FORMS[form], ({"config": config} if form == "triton" else {})
    # both forms validate their inputs (ValueError naming the argument and the expected shape)
    return fn(
        q,
        k,
        v,
        g,
        beta,
        commit=commit,
        chunk_size=chunk_size,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        use_qk_l2norm=use_qk_l2norm,
        decay_uncommitted=decay_uncommitted,
        **varlen_kwargs(cu_seqlens),
        **extra,
    )
