"""Chunk-parallel gated delta rule (WY representation) with the NAtS-L per-chunk commit mask, in pure PyTorch."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..common.varlen import per_document
from .naive import compute_dtype, l2norm, validate_gated_delta_inputs

__all__ = ["chunk_gated_delta"]


@per_document(tokens=("q", "k", "v", "g", "beta"), chunks=("commit",))
def chunk_gated_delta(
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
    """Chunk-parallel gated delta rule with per-chunk commit mask; same contract as ``naive_gated_delta``.

    Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; commit ``[B, ceil(T/C), H]``;
    initial_state ``[B, H, K, V]``. Returns ``(o [B, T, H, V] in v.dtype, final_state [B, H, K, V] or None)``;
    the state is float32 (float64 for float64 inputs).

    Per chunk of C tokens with start state S (K x V), chunk-local inclusive log-gate cumsum G_t = Σ_{r<=t} g_r (<= 0):

        A_ts   = β_t (k̂_t·k̂_s) exp(G_t - G_s)            s < t  (strictly lower)
        (I + A) [w | u] = [β e^{G} k̂ | β v]              (unit-lower triangular solve)
        v_new  = u - w S                                  (the delta-rule "corrected values" u_t of the token loop)
        o      = scale (e^{G} q̂ S + ((q̂ k̂ᵀ) ⊙ exp(G_t - G_s))_{s<=t} v_new)
        ΔS     = Σ_s exp(G_C - G_s) k̂_s v_newᵀ_s           (the chunk's own writes, decayed to the chunk end)
        S_end  = Γ S + m ΔS  (Γ = e^{G_C}),  or (mΓ + 1 - m) S + m ΔS when not ``decay_uncommitted``

    Everything except the state recursion is batched over all chunks at once; a Python loop over chunks carries S.
    Autograd through this form gives every gradient, including d m_n = ⟨dS_end(n), ΔS_n⟩ (with v_new depending on
    S_start, which is the exact derivative; the spec's formula treats v_new as constant, which is the same thing because
    m_n enters only through S_end(n)).
    """
    validate_gated_delta_inputs(q, k, v, g, beta, commit, chunk_size, initial_state)
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    N = math.ceil(T / C)
    dtype = compute_dtype(q, k, v, g, beta, initial_state)
    scale = K**-0.5 if scale is None else scale
    out_dtype = v.dtype

    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)

    # Partial last chunk: pad with q = k = v = 0, g = 0, beta = 0. Such tokens write nothing (beta = 0 and k = 0) and
    # decay nothing (e^0 = 1), so the padded chunk computes exactly what the partial chunk computes; the padded
    # outputs are cut off at the end. Padding happens after the l2 norm so the zeros stay zeros.
    pad = N * C - T
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))

    # [B, T, H, D] -> [B, H, N, C, D];  [B, T, H] -> [B, H, N, C]
    # explicit feature sizes (not -1) so that T = 0 (an empty call, e.g. an empty prefix) also works
    q, k = (x.reshape(B, N, C, H, K).permute(0, 3, 1, 2, 4) for x in (q, k))
    v = v.reshape(B, N, C, H, V).permute(0, 3, 1, 2, 4)
    g, beta = (x.reshape(B, N, C, H).permute(0, 3, 1, 2) for x in (g, beta))

    G = g.cumsum(-1)  # chunk-local inclusive cumulative log-gate, non-increasing, <= 0
    G_last = G[..., -1:]  # log Γ_n, [B, H, N, 1]
    incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()  # s <= t
    strict = incl.tril(-1)  # s < t
    # exp(G_t - G_s) for s <= t: the exponent is Σ_{s<r<=t} g_r <= 0 (safe direction). The upper triangle would be
    # exp(positive) and could overflow to inf (inf * 0 = nan in the backward), so it is set to -inf *before* exp.
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~incl, float("-inf")).exp()  # [B, H, N, C, C]

    # WY representation: U = (I + A)^{-1} β (V - e^{G} K S) = u - w S.
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0.0)
    eye = torch.eye(C, dtype=dtype, device=q.device)
    rhs = torch.cat([(beta * G.exp())[..., None] * k, beta[..., None] * v], dim=-1)  # [B, H, N, C, K + V]
    wu = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    w, u = wu[..., :K], wu[..., K:]

    qk = (q @ k.transpose(-1, -2)) * decay  # causal (inclusive), decayed intra-chunk scores, [B, H, N, C, C]
    q_dec = q * G.exp()[..., None]  # e^{G_t} q̂_t: reads the chunk-start state
    k_dec = k * (G_last - G).exp()[..., None]  # e^{G_C - G_s} k̂_s: writes decayed to the chunk end
    log_gamma = G_last[..., 0]  # [B, H, N]

    m = commit.to(dtype) if commit is not None else None
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(dtype)
    outputs = []
    for n in range(N):
        v_new = u[:, :, n] - w[:, :, n] @ S  # [B, H, C, V]
        outputs.append(scale * (q_dec[:, :, n] @ S + qk[:, :, n] @ v_new))
        delta = k_dec[:, :, n].transpose(-1, -2) @ v_new  # ΔS_n, [B, H, K, V]
        gamma = log_gamma[:, :, n].exp()[..., None, None]
        if m is None:
            S = gamma * S + delta
        else:
            m_n = m[:, n][..., None, None]  # [B, H, 1, 1]
            if decay_uncommitted:  # released NAtS-L: an uncommitted chunk keeps its decay, drops its writes
                S = gamma * S + m_n * delta
            else:  # an uncommitted chunk restores the start state undecayed
                S = (m_n * gamma + (1 - m_n)) * S + m_n * delta

    if N == 0:
        o = v.new_zeros(B, 0, H, V)
    else:
        o = torch.stack(outputs, dim=2)  # [B, H, N, C, V]
        o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(out_dtype), (S if output_final_state else None)
