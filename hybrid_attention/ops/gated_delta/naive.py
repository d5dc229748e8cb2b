"""Token-by-token reference of the gated delta rule with a per-chunk commit mask (the NAtS-L GDN branch).

This file is the readable definition and the float64 test oracle; ``chunk.py`` must agree with it to rounding.
Shared helpers (input validation, l2 normalisation, dtype policy) live here so that both forms use the exact same
conventions.
"""

from __future__ import annotations

import math

import torch

from ..common.varlen import per_document

__all__ = ["naive_gated_delta", "l2norm", "compute_dtype", "validate_gated_delta_inputs"]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x**2, -1) + eps)`` over the last axis (fla's convention: eps inside the square root)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """Internal precision: float32 at least, float64 when any input is float64.

    Decision: the state is never kept in a low-precision dtype (DESIGN.md: state in float32 at least), and float64
    inputs stay float64 end to end so that the naive/chunk agreement can be tested to ~1e-12.
    """
    dtype = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def validate_gated_delta_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    commit: torch.Tensor | None,
    chunk_size: int,
    initial_state: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the offending argument and the expected shape."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    if tuple(k.shape) != (B, T, H, K):
        raise ValueError(f"k must be [B, T, H, K] = {(B, T, H, K)} like q, got {tuple(k.shape)}")
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] with [B, T, H] = {(B, T, H)}, got {tuple(v.shape)}")
    V = v.shape[-1]
    if tuple(g.shape) != (B, T, H):
        raise ValueError(f"g must be [B, T, H] = {(B, T, H)}, got {tuple(g.shape)}")
    if tuple(beta.shape) != (B, T, H):
        raise ValueError(f"beta must be [B, T, H] = {(B, T, H)}, got {tuple(beta.shape)}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if commit is not None:
        N = math.ceil(T / chunk_size)
        if tuple(commit.shape) != (B, N, H):
            raise ValueError(
                f"commit must be [B, N, H] = {(B, N, H)} with N = ceil(T / chunk_size) = ceil({T} / {chunk_size}), "
                f"got {tuple(commit.shape)}"
            )
    if initial_state is not None and tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(f"initial_state must be [B, H, K, V] = {(B, H, K, V)}, got {tuple(initial_state.shape)}")


@per_document(tokens=("q", "k", "v", "g", "beta"), chunks=("commit",))
def naive_gated_delta(
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
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated delta rule with a per-chunk commit mask, one token at a time.

    Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H]`` (log-decay, <= 0); beta ``[B, T, H]``;
    commit ``[B, N, H]`` with ``N = ceil(T / chunk_size)`` (chunks aligned to position 0 of this call);
    initial_state ``[B, H, K, V]``. Returns ``o [B, T, H, V]`` in ``v.dtype`` and the final state
    ``[B, H, K, V]`` (float32, float64 for float64 inputs) or ``None``.

    Definition (per batch b and head h; k̂, q̂ are l2-normalised when ``use_qk_l2norm``)::

        S = S0
        for chunk n:
            S_start = S
            for t in chunk n:
                S = exp(g_t) S
                u = beta_t (v_t - Sᵀ k̂_t)
                S = S + k̂_t uᵀ
                o_t = scale * Sᵀ q̂_t                    # every token sees the pseudo-updated state
            Γ_n = exp(Σ_{t∈n} g_t);  ΔS_n = S - Γ_n S_start
            S = Γ_n S_start + m_n ΔS_n                    if decay_uncommitted
            S = (m_n Γ_n + 1 - m_n) S_start + m_n ΔS_n    otherwise

    ``commit=None`` is plain gated DeltaNet (all m_n = 1). m is real-valued, so the op is differentiable in m.
    """
    validate_gated_delta_inputs(q, k, v, g, beta, commit, chunk_size, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    scale = K**-0.5 if scale is None else scale
    out_dtype = v.dtype

    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    m = commit.to(dtype) if commit is not None else None

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dtype)
    S_start = S
    log_gamma = q.new_zeros(B, H)  # Σ g over the current chunk
    outputs = []
    for t in range(T):
        if t % chunk_size == 0:
            S_start = S
            log_gamma = q.new_zeros(B, H)
        q_t, k_t, v_t = q[:, t], k[:, t], v[:, t]  # [B, H, K], [B, H, K], [B, H, V]
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v_t - torch.einsum("bhkv,bhk->bhv", S, k_t))
        S = S + k_t[..., :, None] * u[..., None, :]
        outputs.append(scale * torch.einsum("bhkv,bhk->bhv", S, q_t))
        log_gamma = log_gamma + g[:, t]
        if m is not None and (t % chunk_size == chunk_size - 1 or t == T - 1):
            m_n = m[:, t // chunk_size][..., None, None]  # [B, H, 1, 1]
            gamma = log_gamma.exp()[..., None, None]
            delta = S - gamma * S_start  # the chunk's own writes, decayed to the chunk end
            if decay_uncommitted:
                S = gamma * S_start + m_n * delta
            else:
                S = (m_n * gamma + (1 - m_n)) * S_start + m_n * delta
    o = torch.stack(outputs, dim=1) if T > 0 else v.new_zeros(B, 0, H, V)
    return o.to(out_dtype), (S if output_final_state else None)
