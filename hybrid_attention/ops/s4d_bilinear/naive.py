"""Token-by-token reference of the bilinear S4D core (after arXiv 2605.24330, §3 "S4D-only", Fig. 3d), the
``s4d_bilinear`` baseline: the readable definition and the float64 test oracle."""

from __future__ import annotations

import torch

from ..common.ssm import compute_dtypes, prepare_ssm_params, validate_ssm_inputs
from ..common.varlen import per_document

__all__ = ["naive_s4d_bilinear", "validate_s4d_bilinear_inputs"]


def validate_s4d_bilinear_inputs(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the offending argument; on top of the SSM shape checks, R == D is required."""
    validate_ssm_inputs(a, b, log_lam, B, C, initial_state, key_name="a", value_name="b")
    if a.shape[-1] != b.shape[-1]:
        raise ValueError(
            f"b must be [B, T, H, D] with D == R = {a.shape[-1]} (the readout pairs channel j of a with channel j "
            f"of b), got {tuple(b.shape)}"
        )


@per_document(tokens=("a", "b"))
def naive_s4d_bilinear(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Bilinear S4D core, one token at a time (the definition).

    Shapes: a, b ``[B, T, H, R]`` real (R == D required); log_lam, B ``[H, M]`` complex (discretised, Re(log_lam) < 0);
    C ``[H, M, M]`` complex (full readout shared by both halves); initial_state ``[B, H, M, 2R]`` complex, the raw
    state X before C. Returns ``o [B, T, H, R]`` in ``a.dtype`` and the final state (complex128 for float64 inputs,
    complex64 otherwise) or ``None`` unless ``output_final_state``.

    Definition, per batch and head::

        z_t = [a_t ; b_t] ∈ R^{2R};   X_t = λ ⊙ X_{t-1} + B z_tᵀ ∈ C^{M×2R}   (X_{-1} = initial_state, or 0)
        Y_t = C X_t;   U_t = Y_t[:, :R],  Γ_t = Y_t[:, R:]                  ∈ C^{M×R}
        o_t[j] = Re(Σ_m U_t[m, j] Γ_t[m, j]) = Re(diag(U_tᵀ Γ_t))[j]          ∈ R^R

    The same complex diagonal S4D core as Interdomain Attention (``hybrid_attention.ops.interdomain``), with generic
    inputs [a_t ; b_t] instead of [ξ(k_t) ; v_t] and no query. This file is the readable definition and the float64
    test oracle; ``chunk.py`` must agree with it to rounding. Validation and dtype helpers are shared with the
    Interdomain op so that both use exactly the same conventions.
    """
    # DECISION (spec §3 and §6.2 item 14, the readout "C_out z_t" as first read): o_t = Re(diag(U_tᵀ Γ_t)), i.e. the
    # bilinear plain-transpose readout of Interdomain (naive_interdomain, same Re/no-conjugation convention) with the
    # query fixed to the identity: output channel j queries key channel j. The layer then applies a learned d×d map
    # C_out to the concatenated heads, which has exactly the d² parameters of the W_Q it replaces (parameter parity).
    # The readout is quadratic in the input like Interdomain's, but it is not conditioned on a query.
    validate_s4d_bilinear_inputs(a, b, log_lam, B, C, initial_state)
    Bsz, T, H, R = a.shape
    M = log_lam.shape[1]
    out_dtype = a.dtype
    rdtype, cdtype = compute_dtypes(a, b)
    log_lam, B, C = prepare_ssm_params(log_lam, B, C, cdtype)

    z = torch.cat([a, b], dim=-1).to(rdtype).to(cdtype)  # [B, T, H, 2R]
    lam = torch.exp(log_lam)[None, :, :, None]  # [1, H, M, 1]
    b_in = B[None, :, :, None]
    X = z.new_zeros(Bsz, H, M, 2 * R) if initial_state is None else initial_state.to(cdtype)

    outputs = []
    for t in range(T):
        X = lam * X + b_in * z[:, t, :, None, :]
        Y = torch.einsum("hmn,bhnc->bhmc", C, X)
        outputs.append((Y[..., :R] * Y[..., R:]).sum(dim=-2).real)  # [B, H, R]
    o = torch.stack(outputs, dim=1) if T > 0 else a.new_zeros(Bsz, 0, H, R, dtype=rdtype)
    return o.to(out_dtype), (X if output_final_state else None)
