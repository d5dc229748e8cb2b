"""PyTorch helpers of the complex diagonal-SSM ops (Interdomain, S4D-only, bilinear S4D): input validation, dtype
policy, parameter casts, chunk decays, so that the naive, chunk, FFT and Triton forms of all three use the same
conventions. Interdomain-only helpers stay in ``ops/interdomain/naive.py``.
"""

from __future__ import annotations

import torch

from .planar import Planar, as_complex, as_planar

__all__ = ["compute_dtypes", "validate_ssm_inputs", "prepare_ssm_params", "prepare_planar_params",
           "validate_chunk_size", "chunk_decays"]


def compute_dtypes(*tensors: torch.Tensor) -> tuple[torch.dtype, torch.dtype]:
    """(real, complex) internal precision: (float64, complex128) when any input is float64, else (float32, complex64).

    Decision (DESIGN.md: complex state in float32/complex64 at least): bf16/fp16 activations are upcast, the state is
    never kept in low precision, and float64 inputs stay float64 end to end so that naive/chunk agree to ~1e-12.
    The SSM parameters and the initial state are cast to this precision, whatever their own dtype.
    """
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64, torch.complex128
    return torch.float32, torch.complex64


def validate_ssm_inputs(
    key: torch.Tensor,
    value: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    initial_state: torch.Tensor | None,
    *,
    key_name: str = "k",
    value_name: str = "v",
    extra_channels: int = 0,
) -> None:
    """Raise ``ValueError`` naming the offending argument and its expected shape.

    key ``[B, T, H, R]`` and value ``[B, T, H, D]`` real; log_lam, B ``[H, M]``; C ``[H, M, M]``;
    initial_state ``[B, H, M, R + D + extra_channels]``; all on the key's device. log_lam, B and C may be complex
    tensors or ``Planar`` (real, imaginary) pairs of real floating-point tensors of one shape.
    """
    for name, x in ((key_name, key), (value_name, value)):
        if x.dim() != 4:
            dims = "R" if name == key_name else "D"
            raise ValueError(f"{name} must be a 4-d tensor [B, T, H, {dims}], got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a real floating-point tensor, got dtype {x.dtype}")
    Bsz, T, H, R = key.shape
    if tuple(value.shape[:3]) != (Bsz, T, H):
        raise ValueError(
            f"{value_name} must be [B, T, H, D] with [B, T, H] = {(Bsz, T, H)} like {key_name}, "
            f"got {tuple(value.shape)}"
        )
    D = value.shape[-1]
    for name, x in (("log_lam", log_lam), ("B", B), ("C", C)):
        _check_planar(name, x)
    if log_lam.dim() != 2 or log_lam.shape[0] != H:
        raise ValueError(f"log_lam must be [H, M] with H = {H}, got {tuple(log_lam.shape)}")
    M = log_lam.shape[1]
    if tuple(B.shape) != (H, M):
        raise ValueError(f"B must be [H, M] = {(H, M)} like log_lam, got {tuple(B.shape)}")
    if tuple(C.shape) != (H, M, M):
        raise ValueError(f"C must be [H, M, M] = {(H, M, M)}, got {tuple(C.shape)}")
    named = [(value_name, value), ("log_lam", log_lam), ("B", B), ("C", C), ("initial_state", initial_state)]
    for name, x in named:
        if x is not None and x.device != key.device:
            raise ValueError(f"{name} must be on the same device as {key_name} ({key.device}), got {x.device}")
    if initial_state is not None:
        n_ch = R + D + extra_channels
        if tuple(initial_state.shape) != (Bsz, H, M, n_ch):
            what = "R + D + 1 (denominator channel)" if extra_channels else "R + D"
            raise ValueError(
                f"initial_state must be [B, H, M, {what}] = {(Bsz, H, M, n_ch)}, got {tuple(initial_state.shape)}"
            )


def _check_planar(name: str, x: torch.Tensor | Planar) -> None:
    """Raise ``ValueError`` unless a ``Planar`` x has real floating-point parts of one shape, dtype and device."""
    if not isinstance(x, Planar):
        return
    re, im = x
    ok = isinstance(re, torch.Tensor) and isinstance(im, torch.Tensor)
    if not (ok and re.is_floating_point() and im.is_floating_point() and re.shape == im.shape
            and re.dtype == im.dtype and re.device == im.device):
        got = [(tuple(t.shape), t.dtype, str(t.device)) if isinstance(t, torch.Tensor) else repr(t) for t in x]
        raise ValueError(f"{name} as Planar must be two real floating-point tensors of one shape, dtype and device, "
                         f"got {got}")


def prepare_ssm_params(
    log_lam: torch.Tensor | Planar, B: torch.Tensor | Planar, C: torch.Tensor | Planar, cdtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cast (log_lam, B, C) to the complex compute dtype (a real tensor becomes complex with zero imaginary part, a
    ``Planar`` pair is joined): the complex oracles' form."""
    return as_complex(log_lam, cdtype), as_complex(B, cdtype), as_complex(C, cdtype)


def prepare_planar_params(
    log_lam: torch.Tensor | Planar, B: torch.Tensor | Planar, C: torch.Tensor | Planar, rdtype: torch.dtype
) -> tuple[Planar, Planar, Planar]:
    """(log_lam, B, C) as ``Planar`` pairs of the real ``rdtype`` (complex tensors split, real ones get a zero
    imaginary part): the form of the compiled paths, which keep complex dtypes out of their graphs."""
    return as_planar(log_lam, rdtype), as_planar(B, rdtype), as_planar(C, rdtype)


def validate_chunk_size(chunk_size: int) -> None:
    """Raise ``ValueError`` unless chunk_size is a positive int."""
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def chunk_decays(log_lam: torch.Tensor, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decay tables for a chunk of L tokens, all exponents >= 0.

    Returns ``Ldec [H, L, L, M]`` with Ldec[h, t, s, m] = exp(log_lam[h, m] (t - s)) for s <= t and 0 otherwise,
    and ``Din [H, L, M]`` with Din[h, t, m] = exp(log_lam[h, m] (t + 1)). A chunk of L' < L tokens uses the leading
    blocks ``Ldec[:, :L', :L']`` and ``Din[:, :L']`` (they depend only on t - s and t).
    """
    rdtype = log_lam.real.dtype
    idx = torch.arange(L, device=log_lam.device)
    n = idx[:, None] - idx[None, :]  # t - s
    causal = (n >= 0).to(rdtype)
    n = n.clamp(min=0).to(rdtype)  # masked entries get exponent 0 (finite), then are zeroed by `causal`
    Ldec = torch.exp(log_lam[:, None, None, :] * n[None, :, :, None]) * causal[None, :, :, None]
    Din = torch.exp(log_lam[:, None, :] * (idx + 1).to(rdtype)[None, :, None])
    return Ldec, Din
