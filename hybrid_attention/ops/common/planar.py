"""Planar complex arithmetic: a complex tensor carried as its (real, imaginary) float parts, so that compiled
training graphs hold no complex op (``Planar``'s docstring says why)."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Planar", "as_planar", "as_complex", "is_planar", "cmul", "cdiv", "cexpm1", "cexp_scaled"]


class Planar(NamedTuple):
    """A complex tensor z = re + i·im as two real tensors of one shape, dtype and device.

    It answers ``shape``, ``dim()``, ``device`` and ``dtype`` (the real dtype) like a tensor, so that the shape
    checks of the ops take it in place of a complex tensor.

    Why: torch.compile's inductor generates no code for complex dtypes ("Torchinductor does not support code generation
    for complex operators"): every complex op of a compiled graph runs as its own eager ATen kernel, unfused. The
    training paths of the S4D-only control and of the Interdomain glue therefore compute their complex parameters and
    tables as pairs of real tensors (``Planar``), which inductor fuses like any real elementwise work
    (``benchmarks/compile_graph_stats.py`` counts what is left). Complex tensors remain at the public boundaries that
    are complex by contract (states handed to or returned to the caller) and in the naive / reference oracles.

    Autograd: for real leaves (the stored parameters are real) the gradient of a real function computed in planar form
    equals the one PyTorch's complex (Wirtinger) autograd gives through the complex form, so swapping one for the other
    changes results by float rounding only.
    """

    re: torch.Tensor
    im: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.re.shape

    @property
    def device(self) -> torch.device:
        return self.re.device

    @property
    def dtype(self) -> torch.dtype:
        return self.re.dtype

    def dim(self) -> int:
        return self.re.dim()

    def to(self, dtype: torch.dtype) -> Planar:
        """Both parts cast to the real ``dtype``."""
        return Planar(self.re.to(dtype), self.im.to(dtype))

    def conj(self) -> Planar:
        return Planar(self.re, -self.im)

    def map(self, fn) -> Planar:
        """``fn`` (a real-linear, shape-only op: indexing, transpose, flip, scaling by a real) applied to both parts."""
        return Planar(fn(self.re), fn(self.im))


def is_planar(x: object) -> bool:
    """Whether x is a ``Planar`` pair (not a tensor)."""
    return isinstance(x, Planar)


def as_planar(x: torch.Tensor | Planar, dtype: torch.dtype) -> Planar:
    """x as a ``Planar`` of the real ``dtype``: a Planar is cast, a complex tensor split (``.real`` / ``.imag``: the
    only complex ops, for callers that pass complex tensors), a real tensor gets a zero imaginary part."""
    if isinstance(x, Planar):
        return x.to(dtype)
    if x.is_complex():
        return Planar(x.real.to(dtype), x.imag.to(dtype))
    x = x.to(dtype)
    return Planar(x, torch.zeros_like(x))


def as_complex(x: torch.Tensor | Planar, cdtype: torch.dtype) -> torch.Tensor:
    """x as a complex tensor of ``cdtype`` (a real tensor gets a zero imaginary part): for the complex oracles and
    the complex public boundaries only, never on a compiled hot path."""
    if isinstance(x, Planar):
        rdtype = torch.float64 if cdtype == torch.complex128 else torch.float32
        return torch.complex(x.re.to(rdtype), x.im.to(rdtype))
    return x.to(cdtype)


def cmul(xr: torch.Tensor, xi: torch.Tensor, yr: torch.Tensor, yi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Re, Im) of (xr + i·xi)(yr + i·yi), broadcasting like ``*``."""
    return xr * yr - xi * yi, xr * yi + xi * yr


def cdiv(x: Planar, y: Planar) -> Planar:
    """x / y elementwise. The plain formula x·conj(y) / |y|²: the divisors here (S4D's A, |A| in [~0.5, ~1e4]) are
    far from float32's overflow and underflow, so Smith's scaling (what torch does for complex) is not needed."""
    den = y.re * y.re + y.im * y.im
    re, im = cmul(x.re, x.im, y.re, -y.im)
    return Planar(re / den, im / den)


def cexpm1(z: Planar) -> Planar:
    """exp(z) - 1 elementwise, accurate for small |z| (the ZOH B̄ = (exp(ΔA) - 1)/A at Δ = 1e-3): the real part as
    expm1(x)·cos(y) - 2 sin²(y/2) (= e^x cos y - 1 without the cancellation), the imaginary part e^x sin y."""
    em1 = torch.expm1(z.re)
    half = torch.sin(0.5 * z.im)
    return Planar(em1 * torch.cos(z.im) - 2.0 * half * half, torch.exp(z.re) * torch.sin(z.im))


def cexp_scaled(log_z: Planar, n: torch.Tensor) -> Planar:
    """exp(n·log_z) = |z|^n (cos, sin)(n·Im log_z) for real exponents n broadcasting against log_z."""
    mag = torch.exp(log_z.re * n)
    phase = log_z.im * n
    return Planar(mag * torch.cos(phase), mag * torch.sin(phase))
