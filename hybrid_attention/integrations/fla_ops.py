"""The gated delta rule under fla's op names and argument defaults, mapped onto ``ops.gated_delta.gated_delta``.
Argument order ``(q, k, v, g, beta)``, shapes, the log-space decay g, the state layout ``[N, H, K, V]`` (fla's
``state_v_first=False``) and ``cu_seqlens`` are the same in both libraries; q / k ℓ2 normalisation is the one default
that differs."""

from __future__ import annotations

import torch

from hybrid_attention.ops.gated_delta import gated_delta


def _check_layout(head_first: bool) -> None:
    if head_first:
        raise ValueError("head_first=True is not supported: pass q, k, v as [B, T, H, D] (head_first=False)")


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    head_first: bool = False,
    *,
    chunk_size: int = 64,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, chunked (fla's name and defaults; ``gated_delta`` with ``backend="auto"``). fla's op of this
    name is its fast chunked kernel; this library's ``ops.gated_delta.chunk_gated_delta`` is the plain-PyTorch chunked
    reference form, one of ``gated_delta``'s backends.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, H, V]``. g: log-decay (<= 0) ``[B, T, H]``. beta: ``[B, T, H]``.
        scale: the query scale (default ``K ** -0.5``).
        initial_state: ``[N, H, K, V]`` (N = B, or the number of documents with ``cu_seqlens``).
        output_final_state: also return the final state ``[N, H, K, V]``.
        use_qk_l2norm_in_kernel: ℓ2-normalise q and k inside (fla's default False: the caller normalises;
            ``gated_delta``'s is True; the layers, this library's and fla's ``GatedDeltaNet``, normalise inside).
        cu_seqlens: ``[N + 1]`` offsets of packed documents (B == 1).
        head_first: must be False (``[B, H, T, D]`` inputs are not taken).
        chunk_size: the chunk length of the chunked forms.
        backend: "auto" (Triton kernels for supported CUDA inputs, else "reference"), "reference", "naive", "triton".
    Returns:
        ``(o [B, T, H, V] in v.dtype, final_state [N, H, K, V] or None)``.
    """
    _check_layout(head_first)
    return gated_delta(q, k, v, g, beta, chunk_size=chunk_size, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm_in_kernel, backend=backend,
                       cu_seqlens=cu_seqlens)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    head_first: bool = False,
    *,
    backend: str = "naive",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule, token by token (fla's name and defaults; ``gated_delta`` with ``backend="naive"``).

    Arguments, shapes and the return value as ``chunk_gated_delta_rule``; beta None means ones (fla's default).
    backend: "naive" (the recurrence, default), "reference", "triton" or "auto" (the chunked forms).
    """
    _check_layout(head_first)
    if beta is None:
        beta = torch.ones(q.shape[:3], dtype=q.dtype, device=q.device)
    return gated_delta(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm_in_kernel, backend=backend,
                       cu_seqlens=cu_seqlens)
