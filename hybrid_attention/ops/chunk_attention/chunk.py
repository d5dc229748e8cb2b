"""Memory-lean exact chunk attention: a loop over query chunks that gathers only the visible key chunks.

For query chunk c and softmax head i, the visible keys are the earlier chunks n < c with routing[b, n, i // G] = 1
(gathered, per (b, i), into a padded list of at most M_c = max_{b,i} #visible chunks) plus chunk c itself (causal).
Peak memory per step is O(B·Hs·C·(M_c + 1)·C) <= O(B·Hs·C·T), never T². Differentiable by autograd (the gathers
scatter-add back), including through ``routing_bias``.
"""

from __future__ import annotations

import math

import torch

from ..common.varlen import per_document
from .naive import compute_dtype, routing_to_heads, validate_chunk_attention_inputs

__all__ = ["chunk_chunk_attention"]


@per_document(tokens=("q", "k", "v"), chunks=("routing", "routing_bias"), outputs="t")
def chunk_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: torch.Tensor,
    *,
    chunk_size: int = 64,
    group_size: int = 1,
    scale: float | None = None,
    routing_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as ``naive_chunk_attention``; O(T·C) memory per query chunk instead of O(T²).

    Shapes: q, k ``[B, T, Hs, Dk]``; v ``[B, T, Hs, Dv]``; routing, routing_bias ``[B, ceil(T / C), Hs // G]``.
    Returns ``o [B, T, Hs, Dv]`` in ``v.dtype``.
    """
    validate_chunk_attention_inputs(q, k, v, routing, chunk_size, group_size, routing_bias)
    B, T, Hs, Dk = q.shape
    Dv = v.shape[-1]
    C = chunk_size
    N = math.ceil(T / C)
    dtype = compute_dtype(q, k, v, routing_bias)
    scale = Dk**-0.5 if scale is None else scale
    out_dtype = v.dtype

    # [B, T, Hs, D] -> [B, Hs, T, D]
    q, k, v = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    routed = routing_to_heads(routing, group_size)  # [B, N, Hs] bool
    bias = routing_bias.to(dtype).repeat_interleave(group_size, dim=2) if routing_bias is not None else None
    outputs = []
    for c in range(N):
        start, end = c * C, min((c + 1) * C, T)
        L = end - start
        q_c = q[:, :, start:end]  # [B, Hs, L, Dk]
        k_own, v_own = k[:, :, start:end], v[:, :, start:end]
        causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        logits = (scale * q_c @ k_own.transpose(-1, -2)).masked_fill(~causal, float("-inf"))  # [B, Hs, L, L]
        values = v_own

        if c > 0:
            vis = routed[:, :c].transpose(1, 2)  # [B, Hs, c]
            count = vis.sum(-1)  # [B, Hs]
            # Decision: one host sync per query chunk to size the gather (M = the largest visible count over batch and
            # heads). This is the CPU/autograd reference; GPU paths (flex.py, Triton) use block lists instead.
            M = int(count.max())
            if M > 0:
                # visible earlier chunks first, in ascending chunk order: stable sort of "not routed" (0 before 1)
                order = torch.sort((~vis).to(torch.uint8), dim=-1, stable=True).indices[..., :M]  # [B, Hs, M]
                slot_valid = torch.arange(M, device=q.device) < count[..., None]  # [B, Hs, M]
                k_past = k[:, :, : c * C].reshape(B, Hs, c, C, Dk)
                v_past = v[:, :, : c * C].reshape(B, Hs, c, C, Dv)
                k_g = torch.gather(k_past, 2, order[..., None, None].expand(B, Hs, M, C, Dk)).reshape(B, Hs, M * C, Dk)
                v_g = torch.gather(v_past, 2, order[..., None, None].expand(B, Hs, M, C, Dv)).reshape(B, Hs, M * C, Dv)
                past = scale * q_c @ k_g.transpose(-1, -2)  # [B, Hs, L, M*C]
                if bias is not None:
                    b_g = torch.gather(bias[:, :c].transpose(1, 2), 2, order)  # [B, Hs, M]
                    past = past + b_g.repeat_interleave(C, dim=-1)[:, :, None, :]
                key_valid = slot_valid.repeat_interleave(C, dim=-1)[:, :, None, :]  # padded slots -> -inf
                past = past.masked_fill(~key_valid, float("-inf"))
                logits = torch.cat([past, logits], dim=-1)
                values = torch.cat([v_g, v_own], dim=-2)

        # Every row has at least its diagonal key, so the softmax never sees an all -inf row.
        outputs.append(logits.softmax(dim=-1) @ values)  # [B, Hs, L, Dv]

    o = torch.cat(outputs, dim=2) if N > 0 else v.new_zeros(B, Hs, 0, Dv)
    return o.transpose(1, 2).to(out_dtype)
