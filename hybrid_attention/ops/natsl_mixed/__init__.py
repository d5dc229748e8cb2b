"""The NAtS-L mixed op (``natsl_mixed``): the layer's GDN branch (``gated_delta`` with the commit mask) and chunk-routed
softmax branch (``chunk_attention``) in one call. Its own folder because it composes two ops and belongs to neither;
the Triton form runs the GDN branch on a side stream (``triton/concurrent.py``), the reference (``chunk.py``) in turn.
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from ..common.varlen import varlen_kwargs
from ..gated_delta.triton import config_with_buffers
from . import triton as triton_backend
from .chunk import chunk_natsl_mixed
from .triton import triton_natsl_mixed

__all__ = ["natsl_mixed", "chunk_natsl_mixed", "triton_natsl_mixed", "BACKENDS"]

BACKENDS = ("auto", "reference", "triton")
_FORMS = {"reference": chunk_natsl_mixed, "triton": triton_natsl_mixed}


def natsl_mixed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    commit: torch.Tensor | None,
    q_attn: torch.Tensor,
    k_attn: torch.Tensor,
    v_attn: torch.Tensor,
    routing: torch.Tensor,
    *,
    routing_bias: torch.Tensor | None = None,
    chunk_size: int = 64,
    group_size: int = 1,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    decay_uncommitted: bool = True,
    attn_scale: float | None = None,
    concurrent: bool = True,
    backend: str = "triton",
    cu_seqlens: torch.Tensor | None = None,
    buffer_dtype: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """GDN branch ``gated_delta(q, k, v, g, beta, commit=...)`` and softmax branch
    ``chunk_attention(q_attn, k_attn, v_attn, routing, routing_bias=...)``.

    Shapes as in the two ops: q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g, beta ``[B, T, H]``, commit
    ``[B, N, H]``; q_attn, k_attn ``[B, T, Hs, Dk]``, v_attn ``[B, T, Hs, Dv]``, routing / routing_bias
    ``[B, N, Hs // G]``. Returns ``(o_gdn [B, T, H, V], final_state [B, H, K, V] or None, o_attn [B, T, Hs, Dv])``.
    ``backend``: "triton" (both Triton ops, ``concurrent`` streams on CUDA), "reference" (both PyTorch chunk forms),
    "auto" (Triton for CUDA inputs both kernels support). ``cu_seqlens [N + 1]``: packed documents (B == 1,
    ``ops/common/varlen.py``), passed to both branches; every backend takes them. ``buffer_dtype``: the GDN branch's
    Triton buffer precision, as in ``gated_delta`` (checked for every backend; the reference form ignores it).

    DECISION: the default backend is "triton" (not "auto") because its caller, the NAtS-L layer, decides itself when
    the mixed path runs (its ``_concurrent_branches``: ``supported``, and backend "triton" or "auto" resolved by
    ``resolve_backend`` on CUDA inputs) and then wants the kernels, also under the CPU interpreter.
    """
    gdn_config = config_with_buffers(buffer_dtype)  # ValueError naming buffer_dtype
    supported = lambda: q.is_cuda and triton_backend.supported(q, v, q_attn, v_attn, chunk_size)  # noqa: E731
    form = resolve_backend(backend, "natsl_mixed", supported, BACKENDS, varlen=cu_seqlens is not None, no_varlen=())
    fn, extra = _FORMS[form], ({"gdn_config": gdn_config} if form == "triton" else {})
    return fn(q, k, v, g, beta, commit, q_attn, k_attn, v_attn, routing, routing_bias=routing_bias,
              chunk_size=chunk_size, group_size=group_size, initial_state=initial_state,
              output_final_state=output_final_state, decay_uncommitted=decay_uncommitted, attn_scale=attn_scale,
              concurrent=concurrent, **varlen_kwargs(cu_seqlens), **extra)
