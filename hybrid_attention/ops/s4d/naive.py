"""Token-by-token reference of the S4D-only control (arXiv 2605.24330, §3 "S4D-only"): a readout linear in the state.

The same complex diagonal S4D state as Interdomain Attention (``hybrid_attention.ops.interdomain``), driven by
generic inputs z_t = [a_t ; b_t] and read out linearly, y_t = Re(wᵀ C X_t), with the paper's extra H·M parameters
w. This file is the readable definition and the float64 test oracle; ``fft.py`` (the fast path) must agree with it
to rounding. Validation and dtype helpers are shared with the Interdomain op so that both use the same conventions.
"""

from __future__ import annotations

import torch

from ..common.ssm import compute_dtypes, prepare_ssm_params, validate_ssm_inputs
from ..common.varlen import per_document

__all__ = ["naive_s4d", "validate_s4d_inputs"]


def validate_s4d_inputs(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    w: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the offending argument: the shared SSM checks (a ``[B, T, H, R]``, b
    ``[B, T, H, D]``, R and D free; initial_state ``[B, H, M, R + D]``), then w ``[H, M]`` real on a's device."""
    validate_ssm_inputs(a, b, log_lam, B, C, initial_state, key_name="a", value_name="b")
    H, M = log_lam.shape
    if not isinstance(w, torch.Tensor) or tuple(w.shape) != (H, M) or not w.is_floating_point() or w.device != a.device:
        got = f"shape {tuple(w.shape)}, dtype {w.dtype}, device {w.device}" if isinstance(w, torch.Tensor) else repr(w)
        raise ValueError(f"w must be a real floating-point [H, M] = {(H, M)} tensor on {a.device}, got {got}")


@per_document(tokens=("a", "b"))
def naive_s4d(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    w: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S4D-only control, one token at a time (the definition).

    Shapes: a ``[B, T, H, R]``, b ``[B, T, H, D]`` real (R may differ from D); log_lam, B ``[H, M]`` complex
    (discretised: λ = exp(log_lam) with Re(log_lam) < 0, B = B̄); C ``[H, M, M]`` complex; w ``[H, M]`` real;
    initial_state ``[B, H, M, R + D]`` complex, the raw state X. Returns ``y [B, T, H, R + D]`` in ``a.dtype`` and
    the final state X_T (complex128 for float64 inputs, complex64 otherwise) or ``None`` unless
    ``output_final_state``.

    Definition, per batch and head (every channel c of z is an independent single-input S4D)::

        z_t = [a_t ; b_t] ∈ R^{R+D};   X_t = λ ⊙ X_{t-1} + B z_tᵀ ∈ C^{M×(R+D)}   (X_{-1} = initial_state, or 0)
        y_t = Re(wᵀ C X_t) ∈ R^{R+D}
    """
    validate_s4d_inputs(a, b, log_lam, B, C, w, initial_state)
    Bsz, T, H, R = a.shape
    D = b.shape[-1]
    M = log_lam.shape[1]
    out_dtype = a.dtype
    rdtype, cdtype = compute_dtypes(a, b)
    log_lam, B, C = prepare_ssm_params(log_lam, B, C, cdtype)
    w = w.to(rdtype).to(cdtype)

    z = torch.cat([a.to(rdtype), b.to(rdtype)], dim=-1).to(cdtype)  # [B, T, H, R + D]
    lam = torch.exp(log_lam)[None, :, :, None]  # [1, H, M, 1]
    b_in = B[None, :, :, None]
    X = z.new_zeros(Bsz, H, M, R + D) if initial_state is None else initial_state.to(cdtype)

    outputs = []
    for t in range(T):
        X = lam * X + b_in * z[:, t, :, None, :]
        Y = torch.einsum("hmn,bhnc->bhmc", C, X)  # C X_t
        outputs.append((w[None, :, :, None] * Y).sum(dim=-2).real)  # Re(wᵀ C X_t)  [B, H, R + D]
    y = torch.stack(outputs, dim=1) if T > 0 else a.new_zeros(Bsz, 0, H, R + D, dtype=rdtype)
    return y.to(out_dtype), (X if output_final_state else None)
