"""Parameters of the complex diagonal S4D core shared by Interdomain Attention and the S4D-only control; every
parameterisation choice lives in this one file (``S4DCore``'s docstring)."""

from __future__ import annotations

import math

import torch
from torch import nn

from hybrid_attention.ops.common.planar import Planar, as_complex, cdiv, cexpm1

SSM_PARAM_NAMES = ("log_dt", "A_log_re", "A_im", "B", "C")


def s4d_inv_imag(state_size: int) -> torch.Tensor:
    """S4D-Inv imaginary parts for M = state_size complex modes: (N/π)(N/(2n+1) - 1), n = 0..M-1, N = 2M.
    Returns [M] float64, every entry >= 0."""
    N = 2 * state_size
    n = torch.arange(state_size, dtype=torch.float64)
    return (N / math.pi) * (N / (2 * n + 1) - 1)


class S4DCore(nn.Module):
    """Per-head complex diagonal SSM parameters.

    forward() -> (log_lam [H, M] complex, B_bar [H, M] complex, C [H, M, M] complex), complex64 for float32
    parameters and complex128 for float64 parameters; planar() -> the same three as ``Planar`` (real, imaginary)
    pairs of float32 (float64) tensors, what the layers' training path uses (no complex op for torch.compile);
    input_gain() -> B [channels] real.

    Per head h: Λ_h = exp(Δ_h A_h) ∈ C^M and a full complex readout C_h ∈ C^{M×M}; per layer, a real input gain B ∈
    R^{channels} (one entry per SSM input channel, shared by the heads). The ops in `hybrid_attention.ops.interdomain` /
    `.s4d` take the *discretised* quantities (log Λ, B̄, C) returned by `forward()`; the layers scale their SSM inputs
    by `input_gain()`.

    Decisions where the Interdomain paper (arXiv 2605.24330, §2.2 and §6.2) is silent:
    - Δ granularity: one Δ per head (the paper's parameter counts fit exactly one scalar per head), stored as log Δ and
      initialised log-uniformly in [dt_min, dt_max] = [1e-3, 1e-1].
    - A: S4D-Inv as in state-spaces/s4. Re A = -exp(A_log_re) with A_log_re initialised to log(1/2);
      Im A_n = (N/π)(N/(2n+1) - 1) for n = 0..M-1 with N = 2M (S4 counts the state N in reals and keeps N/2 = M complex
      modes): every frequency is >= 0, the top one (N/π)(N - 1) ≈ 5174 at M = 64. Both trainable. (N = M
      would give half of the modes negative frequencies in [-10, -0.3].)
    - B: DECISION (spec §6.2 item 2, and the parameter fit of §2.3): the paper's Table 3 counts R + d_h B-entries per
      layer (the "(R + d_h) small shared vector" of the fit), not M complex entries per head. A per-mode complex B_h
      would in any case be redundant with the full learned C_h (C_h diag(B_h) is just another full matrix), so B is one
      real gain per SSM input channel, shared by the heads, initialised to 1: the input z = [k̃; ṽ] becomes B ⊙ z. The
      per-mode input vector is then fixed to 1 and discretised by ZOH, B̄ = (exp(ΔA) - 1)/A, as in S4D: it makes the
      state's scale independent of Δ (a raw B with Δ = 1e-3 would let slow modes grow to ~1/(1-|λ|) ≈ 2000× the input),
      which matters because the layer has no output normalisation. With this B the eight paper presets match Table 3
      exactly.
    - C: one full complex M×M matrix per head, shared by the key and value halves (a single shared basis), initialised
      complex Gaussian with E|C_ij|² = 1/M so that C preserves the state's scale.
    Complex parameters are stored as real tensors with a trailing (real, imag) axis so that optimisers, safetensors and
    autocast see only real tensors.

    Args:
        num_heads: H, one SSM per head.
        state_size: M, the complex modes per head.
        channels: the SSM input channels (the length of the input gain B).
        dt_min: lower end of Δ's log-uniform initialisation (0 < dt_min <= dt_max).
        dt_max: upper end of Δ's log-uniform initialisation.
    """

    def __init__(self, num_heads: int, state_size: int = 64, channels: int = 1, dt_min: float = 1e-3,
                 dt_max: float = 1e-1) -> None:
        super().__init__()
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.num_heads, self.state_size, self.channels = num_heads, state_size, channels
        self.dt_min, self.dt_max = dt_min, dt_max
        h, m = num_heads, state_size
        self.log_dt = nn.Parameter(torch.empty(h))
        self.A_log_re = nn.Parameter(torch.empty(h, m))
        self.A_im = nn.Parameter(torch.empty(h, m))
        self.B = nn.Parameter(torch.empty(channels))
        self.C = nn.Parameter(torch.empty(h, m, m, 2))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        lo, hi = math.log(self.dt_min), math.log(self.dt_max)
        self.log_dt.copy_(torch.rand(self.num_heads, dtype=torch.float64) * (hi - lo) + lo)
        self.A_log_re.fill_(math.log(0.5))
        self.A_im.copy_(s4d_inv_imag(self.state_size).expand(self.num_heads, -1))
        self.B.fill_(1.0)
        self.C.normal_(0.0, (0.5 / self.state_size) ** 0.5)

    def _apply(self, fn, recurse: bool = True):
        # DECISION: the SSM parameters keep their float32 (or float64) dtype when the module is cast to bf16/fp16 (a
        # model cast with .to(torch.bfloat16) for inference) and only follow its device: complex tensors exist only
        # for float32/float64, and the phases n·Δ·Im(A) of the S4D-Inv modes (Im A up to ~5174) are scrambled by a
        # bf16 Δ or A (0.4% of a 1e4-rad phase). Measured: a `tiny` S4D-only model cast to bf16 drifted by 7.4% in
        # its logits with bf16 SSM parameters.
        full = {name: p.data for name, p in self.named_parameters(recurse=False)}
        super()._apply(fn, recurse)
        low = (torch.bfloat16, torch.float16)
        for name, p in self.named_parameters(recurse=False):
            if p.dtype in low and full[name].dtype not in low:
                p.data = full[name].to(p.device)
        return self

    def _real(self, p: torch.Tensor) -> torch.Tensor:
        # DECISION: the SSM parameters are promoted to float32 when the module is stored in bf16/fp16 (a model cast
        # with .to(torch.bfloat16) for inference): complex tensors exist only for float32/float64, and the decay
        # math needs the precision anyway. The promotion is differentiable; float32/float64 parameters are unchanged.
        return p.float() if p.dtype in (torch.bfloat16, torch.float16) else p

    def A(self) -> torch.Tensor:
        """Continuous-time A: [H, M] complex (Re < 0)."""
        a = self.A_planar()
        return torch.complex(a.re, a.im)

    def A_planar(self) -> Planar:
        """Continuous-time A as (Re, Im) [H, M] real: (-exp(A_log_re), A_im)."""
        return Planar(-torch.exp(self._real(self.A_log_re)), self._real(self.A_im))

    def input_gain(self) -> torch.Tensor:
        """B: the real per-channel gain of the SSM input, [channels] (see the DECISION on B above)."""
        return self.B

    def planar(self) -> tuple[Planar, Planar, Planar]:
        """-> (log λ [H, M], B̄ [H, M], C [H, M, M]) as Planar (real, imaginary) pairs in the parameters' float dtype
        (float32 for bf16/fp16 ones): the discretisation in real arithmetic, equal to ``forward()`` to rounding."""
        a = self.A_planar()
        dt = torch.exp(self._real(self.log_dt))[:, None]
        log_lam = a.map(lambda t: t * dt)  # log Λ = Δ A (Δ real)
        b_bar = cdiv(cexpm1(log_lam), a)  # ZOH of the unit per-mode input: (exp(ΔA) - 1) / A
        c = self._real(self.C)
        return log_lam, b_bar, Planar(c[..., 0], c[..., 1])

    def forward(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (log λ [H, M], B̄ [H, M], C [H, M, M]), complex64 (complex128 for float64 parameters): ``planar()``
        as complex tensors (the decode path and the complex oracles take these)."""
        cdtype = torch.complex128 if self.A_log_re.dtype == torch.float64 else torch.complex64
        return tuple(as_complex(p, cdtype) for p in self.planar())

    def extra_repr(self) -> str:
        return (f"heads={self.num_heads}, M={self.state_size}, channels={self.channels}, "
                f"dt=[{self.dt_min}, {self.dt_max}]")
