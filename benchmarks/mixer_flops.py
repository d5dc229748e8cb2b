"""Forward FLOPs of each token mixer's sequence op, for the "model TFLOP/s" column of ``bench train``.

One convention for every mixer, decided here ("6N plus the mixers' counted FLOPs"):

* count the matmul-class multiply-accumulates (MACs) of the mixer's *chunked* algorithm with chunk length L (the
  layer's ``chunk_size``), the minimal chunk-parallel form the model needs, not the tile work of one kernel (the op
  benchmarks keep their own "as implemented" models, e.g. ``interdomain_ops.flop_model``); an implementation that
  does more work (a full Toeplitz matmul, a recomputing backward) shows a lower TFLOP/s;
* 2 FLOPs per real MAC; a complex × real product is 2 real MACs, complex × complex 4 (2 when only the real part is
  kept); elementwise gates, norms, exponentials and the projections outside the op are not counted here (the
  projections are in 6N);
* forward only; ``bench train`` multiplies by 3 for forward + backward, the convention of 6N = 3 · 2N.

Per token and head, with M modes (complex), R = key / feature width, D = value width, L = chunk:

* softmax (causal): QKᵀ and PV over T/2 keys on average: 2 · (T/2) · d MACs (d = R = D).
* interdomain (query readout): keys state U (M×R) and values state Γ (M×D): the inter-chunk read of U through the
  query (2MR), the state updates of U and Γ (2MR + 2MD), the inter-chunk value read Re(p Γ) (2MD); intra-chunk the
  query-key scores (L·R), their mode weights and the read back (2LM + 2LM), the value sum (L·D); the readout
  operator through C, M×M complex on an M vector (4M²). Sum: 4M(R + D) + L(R + D + 4M) + 4M².
* s4d (the linear control, an LTI convolution per channel through the same M-mode state): per channel the
  inter-chunk read (2M), the state update (2M) and the intra-chunk causal convolution (L / 2). Sum over the R + D
  channels: (4M + L/2)(R + D).
* s4d_bilinear: both halves projected through C every token (U = C X_a, Γ = C X_b: 2 · 4M²R), the state updates
  (2M · 2R), Re(diag(UᵀΓ)) (2MR). Sum: 8M²R + 6MR (intra-chunk terms are small next to 8M²R and left out).
* gdn (Gated DeltaNet, key width K, value width V): the delta-rule state terms vn = u - wS, o = qS and S += K̃ᵀvn
  (3KV); intra-chunk KKᵀ, w = X·βK, QKᵀ (3LK), u = X·βV and the intra output (2LV), the unit-lower-triangular
  inverse by forward substitution (L²/3). Sum: 3KV + L(3K + 2V) + L²/3.
* natsl: its GDN branch over every token (the gdn count, its heads and widths) plus the softmax branch over its own
  chunk (causal, L/2 keys, the softmax heads): the routed earlier chunks depend on the routing and are not counted,
  so the natsl count is a lower bound.
"""

from __future__ import annotations

from torch import nn

__all__ = ["MIXER_FLOP_NAMES", "macs_per_token_head", "mixer_forward_flops"]

MIXER_FLOP_NAMES = ("softmax", "interdomain", "s4d", "s4d_bilinear", "gdn", "natsl")
"""Mixers with a FLOP count here (the others count 0 and the label says so)."""


def _gdn_macs(K: int, V: int, L: int) -> float:
    return 3.0 * K * V + L * (3.0 * K + 2.0 * V) + L * L / 3.0


def macs_per_token_head(kind: str, *, T: int, L: int = 64, M: int = 0, R: int = 0, D: int = 0) -> float:
    """Forward MACs per token and head of mixer ``kind`` for a sequence of T tokens (see the module docstring)."""
    if kind == "softmax":
        return 2.0 * (T / 2.0) * R
    if kind == "interdomain":
        return 4.0 * M * (R + D) + L * (R + D + 4.0 * M) + 4.0 * M * M
    if kind == "s4d":
        return (4.0 * M + L / 2.0) * (R + D)
    if kind == "s4d_bilinear":
        return 8.0 * M * M * R + 6.0 * M * R
    if kind == "gdn":
        return _gdn_macs(R, D, L)
    raise ValueError(f"kind must be one of {', '.join(MIXER_FLOP_NAMES[:-1])}, got {kind!r}")


def mixer_forward_flops(kind: str, mixer: nn.Module, T: int) -> float | None:
    """Forward FLOPs of one sequence of T tokens through ``mixer`` (a layer of mixer type ``kind``), or None for a
    mixer without a count."""
    if kind == "softmax":
        return 2.0 * T * mixer.num_heads * macs_per_token_head("softmax", T=T, R=mixer.head_dim)
    if kind in ("interdomain", "s4d", "s4d_bilinear"):
        per = macs_per_token_head(kind, T=T, L=mixer.chunk_size, M=mixer.state_dim, R=mixer.feature_dim,
                                  D=mixer.head_dim)
        return 2.0 * T * mixer.num_heads * per
    if kind == "gdn":
        return 2.0 * T * mixer.num_heads * _gdn_macs(mixer.head_dim, mixer.head_v_dim, mixer.chunk_size)
    if kind == "natsl":
        L = mixer.chunk_size
        gdn = mixer.num_heads * _gdn_macs(mixer.head_dim, mixer.head_v_dim, L)
        own_chunk = mixer.num_attn_heads * (L / 2.0) * (mixer.attn_head_dim + mixer.attn_head_v_dim)
        return 2.0 * T * (gdn + own_chunk)
    return None
