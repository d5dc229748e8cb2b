"""The token mixers every contract test runs on: name -> factory(hidden_size) in float64.

Tests of other mixers (GDN, NAtS-L) add their factories here so that the contract tests cover them too.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from hybrid_attention.layers import InterdomainAttention, S4DBilinearMixer, S4DMixer, SoftmaxAttention

HIDDEN = 32


def _interdomain(**kw) -> Callable[[], nn.Module]:
    return lambda: InterdomainAttention(HIDDEN, num_heads=2, head_dim=8, state_size=6, chunk_size=5, **kw)


MIXER_CASES: dict[str, Callable[[], nn.Module]] = {
    "softmax": lambda: SoftmaxAttention(HIDDEN, num_heads=2, head_dim=16),
    "interdomain": _interdomain(),
    "interdomain-norope": _interdomain(rope=False),
    "interdomain-denominator": _interdomain(denominator=True),
    "interdomain-gate": _interdomain(output_gate=True),
    "interdomain-single-input": _interdomain(dual_input=False),
    "interdomain-no-q": _interdomain(query_readout=False),
    "interdomain-no-q-bilinear": _interdomain(query_readout=False, contraction="bilinear"),
    "interdomain-hermitian": _interdomain(readout="hermitian"),
    "interdomain-real": _interdomain(readout="real"),
    "s4d": lambda: S4DMixer(HIDDEN, num_heads=2, head_dim=8, state_size=6, chunk_size=5),
    "s4d-rope": lambda: S4DMixer(HIDDEN, num_heads=2, head_dim=8, state_size=6, chunk_size=5, rope=True),
    "s4d_bilinear": lambda: S4DBilinearMixer(HIDDEN, num_heads=2, head_dim=8, state_size=6, chunk_size=5),
}


def _natsl(**kw) -> Callable[[], nn.Module]:
    from hybrid_attention.layers import NatsLAttention

    return lambda: NatsLAttention(HIDDEN, num_heads=2, head_dim=8, expand_v=2, num_attn_heads=4, chunk_size=4, **kw)


def _gdn() -> nn.Module:
    from hybrid_attention.layers import GatedDeltaNet

    return GatedDeltaNet(HIDDEN, num_heads=2, head_dim=8, expand_v=2, chunk_size=4)


MIXER_CASES.update({
    "gdn": _gdn,
    "natsl": _natsl(),
    "natsl-rope": _natsl(rope=True),
    "natsl-x-weights-single-norm": _natsl(weights_from="x", separate_norms=False),
    "natsl-no-decay": _natsl(decay_uncommitted=False),
    "natsl-no-qk-norm": _natsl(qk_norm=False),
    "natsl-softmax-output": _natsl(fused_outputs="softmax"),
    "natsl-own-attn-qk": _natsl(attn_qk="own"),
    "natsl-own-conv-attn-qk": _natsl(attn_qk="own_conv"),
})
