"""One token of the gated delta rule over a state updated in place: the decode step of GDN and of NAtS-L's GDN branch.

    o = gated_delta_step(q, k, v, g, beta, S, use_kernels)

The token-by-token definition of `naive_gated_delta` with T = 1 (scale K^-1/2, q/k ℓ2-normalised: the layers'
settings). With `use_kernels` and a float32 state, the fused Triton step (`triton/decode.py`, a registered custom op);
otherwise PyTorch math in the state's dtype. No host sync, no value-dependent branch.
"""

from __future__ import annotations

import torch

from ..common.backend import resolve_backend
from .naive import l2norm
from .triton import HAS_TRITON

if HAS_TRITON:
    from .triton.decode import gated_delta_step_op

__all__ = ["gated_delta_step"]


def gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     S: torch.Tensor, use_kernels: bool) -> torch.Tensor:
    """q, k [B, H, K]; v [B, H, V]; g, beta [B, H]; S [B, H, K, V] updated in place. Returns o [B, H, V] in v.dtype."""
    # use_kernels is the caller's choice (layers: resolve_use_kernels); with it, "auto" runs the kernel on a float32
    # state only (the fused step's state dtype), the PyTorch math on any other
    if resolve_backend("auto" if use_kernels else "reference", "gated_delta_step", S.dtype == torch.float32) \
            == "triton":
        return gated_delta_step_op(q, k, v, g.float(), beta.float(), S)
    dt = S.dtype
    qn, kn = l2norm(q.to(dt)), l2norm(k.to(dt))
    S.mul_(g.to(dt).exp()[..., None, None])
    u = beta.to(dt)[..., None] * (v.to(dt) - torch.einsum("bhkv,bhk->bhv", S, kn))
    S.add_(kn[..., :, None] * u[..., None, :])
    return (q.shape[-1] ** -0.5 * torch.einsum("bhkv,bhk->bhv", S, qn)).to(v.dtype)
