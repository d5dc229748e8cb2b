"""RMS normalisation as a function: the math of ``modules.norm.RMSNorm`` and of the decode ops' references."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x**2, -1) + eps), computed in at least float32. Shape preserved."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
