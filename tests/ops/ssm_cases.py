"""Random diagonal-SSM parameters and states shared by the S4D op tests (linear `s4d` and `s4d_bilinear`)."""

from __future__ import annotations

import math

import torch

F64, C128 = torch.float64, torch.complex128


def make_ssm_params(H: int, M: int, seed: int, *, im_max: float = 1000.0, re_min: float = -5.0,
                    with_w: bool = False):
    """log_lam [H, M]: Re log-uniform in [re_min, -1e-3], Im uniform in ±im_max (all four extremes forced in);
    complex Gaussian B [H, M] (scale 0.3), C [H, M, M] (E|C_ij|² = 1/M) and, with ``with_w``, a real Gaussian
    readout vector w [H, M] (drawn last, so the other tensors do not depend on it)."""
    g = torch.Generator().manual_seed(seed)
    re = -torch.exp(torch.empty(H, M, dtype=F64).uniform_(math.log(1e-3), math.log(-re_min), generator=g))
    im = torch.empty(H, M, dtype=F64).uniform_(-im_max, im_max, generator=g)
    if M >= 4:
        re[:, 0], re[:, 1] = re_min, -1e-3
        im[:, 2], im[:, 3] = im_max, -im_max
    B = 0.3 * torch.randn(H, M, dtype=C128, generator=g)
    C = torch.randn(H, M, M, dtype=C128, generator=g) / math.sqrt(M)
    if not with_w:
        return torch.complex(re, im), B, C
    return torch.complex(re, im), B, C, torch.randn(H, M, dtype=F64, generator=g)


def make_state(Bsz: int, H: int, M: int, n_ch: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return 0.3 * torch.randn(Bsz, H, M, n_ch, dtype=C128, generator=g)


def max_err(x: torch.Tensor, y: torch.Tensor) -> float:
    return (x - y).abs().max().item() if x.numel() else 0.0
