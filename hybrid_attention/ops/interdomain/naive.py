"""Token-by-token reference of the Interdomain Attention core (arXiv 2605.24330, §1.5, §2.2, Eq. 9 and 11-13).

This file is the readable definition and the float64 test oracle; ``chunk.py`` must agree with it to rounding.
The Interdomain-specific helpers (query checks, the safe denominator) live here; the ones shared with the S4D ops
(SSM input validation, dtype policy, parameter casts) live in ``hybrid_attention.ops.common.ssm``.
"""

from __future__ import annotations

import torch

from ..common.ssm import compute_dtypes, prepare_ssm_params, validate_ssm_inputs
from ..common.varlen import per_document
from .readout import DEFAULT_READOUT, readout_product, validate_readout

__all__ = ["DEN_EPS", "naive_interdomain", "validate_interdomain_inputs", "safe_divide"]

# Smallest |denominator| of the ideal (Nadaraya-Watson) readout: o = num / (sign(den) * max(|den|, DEN_EPS)).
# Only guards against division by (numerically) zero; it does not change the value when |den| >= 1e-6. The sign is
# kept (sign(0) := +1) because with complex bases the denominator Re(qᵀUᵀη) can legitimately be negative.
DEN_EPS = 1e-6


def validate_interdomain_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None,
    denominator: bool,
) -> None:
    """``validate_ssm_inputs`` preceded by the query checks: q ``[B, T, H, R]`` real, k of the same shape as q."""
    if q.dim() != 4:
        raise ValueError(f"q must be a 4-d tensor [B, T, H, R], got shape {tuple(q.shape)}")
    if not q.is_floating_point():
        raise ValueError(f"q must be a real floating-point tensor, got dtype {q.dtype}")
    if tuple(k.shape) != tuple(q.shape):
        raise ValueError(f"k must be [B, T, H, R] = {tuple(q.shape)} like q, got {tuple(k.shape)}")
    validate_ssm_inputs(k, v, log_lam, B, C, initial_state, extra_channels=1 if denominator else 0)


def safe_divide(num: torch.Tensor, den: torch.Tensor, eps: float = DEN_EPS) -> torch.Tensor:
    """``num / (sign(den) * max(|den|, eps))`` with sign(0) := +1; den broadcasts against num."""
    den_safe = torch.where(den >= 0, den.clamp(min=eps), den.clamp(max=-eps))
    return num / den_safe


@per_document(tokens=("q", "k", "v"))
def naive_interdomain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    denominator: bool = False,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    readout: str = DEFAULT_READOUT,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Interdomain Attention core, one token at a time (the definition).

    Shapes: q, k ``[B, T, H, R]`` real (q is already ξ(q), k the normalised SSM key input); v ``[B, T, H, D]`` real;
    log_lam ``[H, M]`` complex with Re < 0 (λ = exp(log_lam), already discretised); B ``[H, M]`` complex (already
    discretised input vector, broadcast over channels); C ``[H, M, M]`` complex (full readout, shared by both halves);
    initial_state ``[B, H, M, R + D]`` (``R + D + 1`` with ``denominator``) complex, the raw state X before C.

    Returns ``o [B, T, H, D]`` in ``q.dtype`` and the final state X_T (same shape as initial_state; complex128 for
    float64 inputs, complex64 otherwise) or ``None`` unless ``output_final_state``.

    Definition, per batch b and head h (every input channel c is an independent single-input S4D)::

        z_t = [k_t ; v_t]                     ∈ R^{R+D}      ([k_t ; v_t ; 1] ∈ R^{R+D+1} with denominator)
        X_t = λ ⊙ X_{t-1} + B z_tᵀ            ∈ C^{M×(R+D)}  (X_{-1} = initial_state, or 0)
        Y_t = C X_t;  U_t = Y_t[:, :R] ∈ C^{M×R};  Γ_t = Y_t[:, R:R+D] ∈ C^{M×D};  η_t = Y_t[:, R+D] ∈ C^M
        o_t = read(q_t, U_t, Γ_t)                                        ∈ R^D   (denominator=False, Eq. 13)
        o_t = read(q_t, U_t, Γ_t) / safe(read(q_t, U_t, η_t))            ∈ R^D   (denominator=True, Eq. 9)

    with read the ``readout`` (readout.py): "transpose" Re(q_tᵀ U_tᵀ Γ_t), "hermitian" Re(q_tᵀ U_t^H Γ_t), "real"
    Re(U_t q_t)ᵀ Re(Γ_t); safe(x) = sign(x) max(|x|, DEN_EPS), sign(0) := +1. T = 0 is allowed (empty output, state
    passed through).
    """
    # The complex-to-real readout (spec §6.2 item 1) is a flag; its default and the evidence are in readout.py. Every
    # form (chunk.py, the Triton kernels, the fused decode step) implements the same three definitions.
    validate_readout(readout)
    validate_interdomain_inputs(q, k, v, log_lam, B, C, initial_state, denominator)
    Bsz, T, H, R = q.shape
    D = v.shape[-1]
    M = log_lam.shape[1]
    out_dtype = q.dtype
    rdtype, cdtype = compute_dtypes(q, k, v)
    log_lam, B, C = prepare_ssm_params(log_lam, B, C, cdtype)
    q, k, v = q.to(rdtype), k.to(rdtype), v.to(rdtype)

    z = torch.cat([k, v] + ([torch.ones_like(v[..., :1])] if denominator else []), dim=-1)  # [B, T, H, R+D(+1)]
    z = z.to(cdtype)
    lam = torch.exp(log_lam)[None, :, :, None]  # [1, H, M, 1]
    b_in = B[None, :, :, None]  # [1, H, M, 1]
    X = z.new_zeros(Bsz, H, M, z.shape[-1]) if initial_state is None else initial_state.to(cdtype)

    outputs = []
    for t in range(T):
        X = lam * X + b_in * z[:, t, :, None, :]  # [B, H, M, R+D(+1)]
        Y = torch.einsum("hmn,bhnc->bhmc", C, X)
        U, G = Y[..., :R], Y[..., R:]  # G: Γ_t (and η_t as its last column with the denominator)
        o_t = readout_product(U, q[:, t].to(cdtype), G, readout)  # [B, H, D(+1)]
        if denominator:
            o_t = safe_divide(o_t[..., :D], o_t[..., D:])
        outputs.append(o_t)
    o = torch.stack(outputs, dim=1) if T > 0 else v.new_zeros(Bsz, 0, H, D)
    return o.to(out_dtype), (X if output_final_state else None)
