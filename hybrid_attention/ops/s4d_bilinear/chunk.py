"""Chunk-parallel PyTorch form of the bilinear S4D core (exact, differentiable by autograd), the ``s4d_bilinear``
baseline; the paper's S4D-only control is the linear readout in ``ops.s4d``."""

from __future__ import annotations

import torch
import torch.utils.checkpoint

from ..common.ssm import chunk_decays, compute_dtypes, prepare_ssm_params, validate_chunk_size
from ..common.varlen import per_document
from .naive import validate_s4d_bilinear_inputs

__all__ = ["chunk_s4d_bilinear"]


# DECISION: on CPU tensors this form runs chunks of at most reference_chunk(M) tokens whatever chunk_size asks for
# (on a GPU, longer chunks mean fewer sequential steps, so chunk_size is used as given). Its cost per
# token and head is L·M·2R (chunk-local states) + M²·R (readout) plus a per-chunk overhead, so short chunks are
# cheaper, unlike the Triton kernels, whose chunk length sets the parallel work per program. Measured on one CPU
# thread, forward + backward, L = 16 / 32 / 64: M=16-32 (tiny and recall shapes, B 8-32, T 64-128, H 2, R 32-64)
# 75-604 / 82-655 / 98-1027 ms, L=16 best of the three (L=8: within 5 %); M=64 (`small` shape, B 2, T 256, H 8,
# R 64) 2108 / 1718 / 2888 ms. The result does not depend on the chunk length beyond rounding.
def reference_chunk(M: int) -> int:
    """Longest chunk the reference form uses for M modes (see the DECISION above)."""
    return 16 if M <= 32 else 32


# DECISION: this reference form is opaque to torch.compile (Dynamo runs it eagerly, a graph break): traced by
# inductor (torch 2.13, CPU) its complex einsums / checkpointed chunks gave wrong gradients for the SSM parameters
# (log Δ, A off by 0.7-12x relative RMS in a compiled 2-layer model; tests/models/test_compile.py), in a pattern that
# moved with unrelated code changes. The GPU path (Triton custom ops) is opaque to inductor anyway.
@torch.compiler.disable
@per_document(tokens=("a", "b"))
def chunk_s4d_bilinear(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Bilinear S4D core, chunk-parallel (equal to ``naive_s4d_bilinear`` to rounding).

    Shapes: a, b ``[B, T, H, R]`` real (R == D required); log_lam, B ``[H, M]`` complex; C ``[H, M, M]`` complex;
    initial_state ``[B, H, M, 2R]`` complex. Any T >= 0 and chunk_size >= 1 (on the CPU chunks of at most
    reference_chunk(M) tokens, see the DECISION above). Returns ``o [B, T, H, R]`` in ``a.dtype`` and the final raw
    state (complex128 for float64 inputs, else complex64) or ``None``.

    For a chunk [t0, t0 + L) entered with state X0, with local indices t, s in [0, L), the per-token states of the chunk
    are

        X_t = Σ_{s<=t} Ldec[t, s] ⊙ B z_sᵀ + Din[t] ⊙ X0                    [B, H, L, M, 2R]

    with Ldec[t, s, m] = exp(log_lam[m] (t - s)) (s <= t, else 0) and Din[t, m] = exp(log_lam[m] (t + 1)), the decay
    tables of ``hybrid_attention.ops.common.ssm.chunk_decays``. Then o_t = Re(diag(U_tᵀ Γ_t)) with U = C X^a,
    Γ = C X^b, computed as o_t[j] = Re(Σ_m X^a_t[m, j] (K X^b_t)[m, j]) with K = CᵀC (plain transpose): one M×M product
    per token instead of two. The last state X_{L-1} is carried to the next chunk.

    Unlike Interdomain, the diagonal readout has no query to contract the key half with, so the chunk-local states are
    materialised (O(L·M·2R) per head, one chunk at a time, never the whole sequence). Every power of λ has a
    non-negative exponent, |λ^n| <= 1, so fast-decaying modes underflow to 0 instead of overflowing (see
    ``chunk_interdomain`` in ops/interdomain/chunk.py).
    """
    validate_s4d_bilinear_inputs(a, b, log_lam, B, C, initial_state)
    validate_chunk_size(chunk_size)
    Bsz, T, H, R = a.shape
    M = log_lam.shape[1]
    if a.device.type == "cpu":
        chunk_size = min(chunk_size, reference_chunk(M))
    out_dtype = a.dtype
    rdtype, cdtype = compute_dtypes(a, b)
    log_lam, B, C = prepare_ssm_params(log_lam, B, C, cdtype)

    z = torch.cat([a, b], dim=-1).to(rdtype).transpose(1, 2).to(cdtype)  # [B, H, T, 2R]
    X = z.new_zeros(Bsz, H, M, 2 * R) if initial_state is None else initial_state.to(cdtype)
    Ldec_full, Din_full = chunk_decays(log_lam, min(chunk_size, T)) if T > 0 else (None, None)

    K = C.transpose(-1, -2) @ C  # [H, M, M], complex symmetric: (C x)ᵀ(C y) = xᵀ K y

    def one_chunk(X, z_c, LdecB, Din, K):
        """(state entering the chunk, its inputs) -> (outputs [B, H, L, R], state leaving it)."""
        Xs = torch.einsum("htsm,bhsc->bhtmc", LdecB, z_c)
        Xs = Xs + Din[None, :, :, :, None] * X[:, :, None]  # chunk-local per-token states [B, H, L, M, 2R]
        KXb = torch.einsum("hmn,bhtnc->bhtmc", K, Xs[..., R:])
        return (Xs[..., :R] * KXb).sum(dim=-2).real, Xs[:, :, -1]

    # With autograd on, each chunk is recomputed in the backward pass instead of saving its per-token states:
    # saved memory is then O(T·2R + (T/L)·M·2R) per head instead of O(T·M·2R).
    recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (a, b, log_lam, B, C, X))
    outputs = []
    for t0 in range(0, T, chunk_size):
        L = min(chunk_size, T - t0)
        args = (X, z[:, :, t0 : t0 + L], Ldec_full[:, :L, :L] * B[:, None, None, :], Din_full[:, :L], K)
        if recompute:
            o_c, X = torch.utils.checkpoint.checkpoint(one_chunk, *args, use_reentrant=False)
        else:
            o_c, X = one_chunk(*args)
        outputs.append(o_c)

    o = torch.cat(outputs, dim=2) if T > 0 else a.new_zeros(Bsz, H, 0, R, dtype=rdtype)
    return o.transpose(1, 2).to(out_dtype), (X if output_final_state else None)
