"""The forward state scan shared by the Interdomain and bilinear S4D Triton ops (``ssm_scan.states_fwd``), called
directly: every chunk-entering state and the final state against a float64 token-by-token recurrence, dense and
with packed documents, and the bf16 chunk-state buffer (``ScanConfig.state_dtype``).

Runs under the Triton interpreter on a CPU (``triton_device.py``), compiled on a GPU (tf32 dots: the looser
tolerance). Skipped when triton does not import.
"""

from __future__ import annotations

import pytest
import torch
from triton_device import DEVICE as DEV

from hybrid_attention.ops.common.triton import HAS_TRITON
from hybrid_attention.ops.common.varlen import chunk_table, cu_seqlens_from_lengths

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")

if HAS_TRITON:
    from hybrid_attention.ops.common.triton.config import ScanConfig
    from hybrid_attention.ops.common.triton.hooks import NO_HOOKS
    from hybrid_attention.ops.common.triton.ssm_scan import power_table, states_fwd

F64, C128 = torch.float64, torch.complex128
TOL = 1e-4 if DEV == "cpu" else 5e-3  # relative L2 of float32 states vs float64 (tf32 dots on a GPU)
H, R, D, M = 2, 12, 20, 10  # non-power-of-two channels and modes: masked tiles


def _problem(Bsz: int, T: int, n_seq: int, seed: int, with_init: bool):
    """float64 k [Bsz, T, H, R], v [.., D], planar log λ and B [H, 2, M] (modes from fast-decaying to nearly
    undamped, fast phases) and the initial states [n_seq, H, 2, M, R + D] (or None)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(Bsz, T, H, R, dtype=F64, generator=g)
    v = torch.randn(Bsz, T, H, D, dtype=F64, generator=g)
    re = -torch.logspace(-3, 0.5, M, dtype=F64).expand(H, M)
    ll = torch.stack([re, 20 * torch.randn(H, M, dtype=F64, generator=g)], 1)
    bb = 0.3 * torch.randn(H, 2, M, dtype=F64, generator=g)
    init = torch.randn(n_seq, H, 2, M, R + D, dtype=F64, generator=g) if with_init else None
    return k, v, ll, bb, init


def _reference(k, v, ll, bb, init, bounds, BT: int):
    """Float64 recurrence X_t = λ X_{t-1} + B z_tᵀ per sequence (token range ``bounds[n]`` of row b of k / v):
    ([n_seq, H, n_chunks, M, R + D] chunk-entering states, one list per sequence; [n_seq, H, M, R + D] final)."""
    lam = torch.exp(torch.complex(ll[:, 0], ll[:, 1]))  # [H, M]
    Bc = torch.complex(bb[:, 0], bb[:, 1])
    states, finals = [], []
    for n, (b, t0, t1) in enumerate(bounds):
        x = torch.complex(init[n, :, 0], init[n, :, 1]) if init is not None else torch.zeros(H, M, R + D, dtype=C128)
        seq = []
        for t in range(t0, t1):
            if (t - t0) % BT == 0:
                seq.append(x)
            z = torch.cat([k[b, t], v[b, t]], -1).to(C128)  # [H, R + D]
            x = lam[:, :, None] * x + Bc[:, :, None] * z[:, None, :]
        states.append(torch.stack(seq, 1))
        finals.append(x)
    return states, torch.stack(finals)


def _complex(x: torch.Tensor) -> torch.Tensor:
    """Planar [..., 2, M, NC] float32 on DEV -> complex128 [..., M, NC] on the CPU."""
    x = x.detach().cpu().to(F64)
    return torch.complex(x.select(-3, 0), x.select(-3, 1))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().norm() / b.abs().norm().clamp(min=1e-30)).item()


CASES = [
    # Bsz, T or document lengths, chunk, initial state
    pytest.param(2, 70, 32, True, id="dense-partial-last-chunk-init"),
    pytest.param(1, 16, 16, False, id="dense-one-full-chunk"),
    pytest.param(1, (1, 15, 16, 17, 3), 16, True, id="packed-init"),  # documents shorter than, equal to, past a chunk
    pytest.param(1, (40, 2, 33), 32, False, id="packed-zero-init"),
]


@pytest.mark.parametrize("Bsz,T,BT,with_init", CASES)
def test_states_match_float64(Bsz, T, BT, with_init):
    """NaN-poisoned buffers: every chunk-entering state and the final state of every sequence within TOL of the
    float64 recurrence."""
    packed = isinstance(T, tuple)
    lengths = T if packed else None
    T = sum(lengths) if packed else T
    vl = chunk_table(cu_seqlens_from_lengths(lengths), T, BT, DEV) if packed else None
    if packed:
        cu = cu_seqlens_from_lengths(lengths).tolist()
        bounds = [(0, cu[n], cu[n + 1]) for n in range(len(lengths))]
    else:
        bounds = [(b, 0, T) for b in range(Bsz)]
    k, v, ll, bb, init = _problem(Bsz, T, len(bounds), seed=T + BT, with_init=with_init)
    ref_states, ref_final = _reference(k, v, ll, bb, init, bounds, BT)
    f32 = [None if t is None else t.to(DEV, torch.float32).contiguous() for t in (k, v, ll, bb, init)]
    P = power_table(f32[2], BT)
    cfg = ScanConfig(poison=True, BMS=16, BCH=16)
    states, final = states_fwd(f32[0], f32[1], P, f32[3], f32[4], BT, True, True, cfg, NO_HOOKS, vl)
    st = _complex(states).view(Bsz * H, -1, M, R + D)
    # the real chunk rows of each sequence: slots b·H·NT + h·NT + j dense, h·NT + offsets[n] + j packed
    for n, (b, t0, t1) in enumerate(bounds):
        nc = -(-(t1 - t0) // BT)
        first = int(vl.offsets[n]) if packed else 0
        rows = torch.stack([st[b * H + h, first:first + nc] for h in range(H)])
        assert torch.isfinite(rows.real).all() and torch.isfinite(rows.imag).all(), n
        assert _rel(rows, ref_states[n]) < TOL, (n, _rel(rows, ref_states[n]))
    final = _complex(final).view(len(bounds), H, M, R + D)
    assert _rel(final, ref_final) < TOL, _rel(final, ref_final)


@pytest.mark.parametrize("Bsz,T,BT,with_init", [CASES[0], CASES[2]])
def test_bf16_state_buffer_is_the_rounded_float32_scan(Bsz, T, BT, with_init):
    """``state_dtype="bf16"``: the sequential scan carries its recurrence in float32 and rounds only the stored copies,
    so the bf16 buffer equals the float32 buffer rounded to nearest, element for element (dense and packed, NaN-
    poisoned), and the final state (a float32 buffer) is unchanged. The field is validated at construction."""
    with pytest.raises(ValueError, match=r"^state_dtype must be one of auto, fp32, bf16, got 'fp16'$"):
        ScanConfig(state_dtype="fp16")
    packed = isinstance(T, tuple)
    lengths = T if packed else None
    T = sum(lengths) if packed else T
    vl = chunk_table(cu_seqlens_from_lengths(lengths), T, BT, DEV) if packed else None
    n_seq = len(lengths) if packed else Bsz
    k, v, ll, bb, init = (None if t is None else t.to(DEV, torch.float32).contiguous()
                          for t in _problem(Bsz, T, n_seq, seed=7, with_init=with_init))
    P = power_table(ll, BT)
    out = {}
    for dtype in ("fp32", "bf16"):
        cfg = ScanConfig(state_dtype=dtype, poison=True, BMS=16, BCH=16)
        out[dtype] = states_fwd(k, v, P, bb, init, BT, True, True, cfg, NO_HOOKS, vl)
    states32, final32 = out["fp32"]
    states16, final16 = out["bf16"]
    assert states16.dtype == torch.bfloat16 and states16.shape == states32.shape
    written = torch.isfinite(states32)  # packed: the spare rows past the real chunks are never written
    assert written.any()
    assert torch.equal(states16[written], states32[written].to(torch.bfloat16))
    assert torch.equal(final16, final32)
