"""The chunk-attention Triton kernels' walk two routed key chunks at a time (``ChunkAttentionConfig(kv_chunks=2)``):
the forward and the dq kernel take the routed chunks before a query tile in pairs, one block of 2C keys, the odd
last one with its second half masked.

Against the float64 dense oracle for the output and every gradient, with the bwd-mode tests' helpers and tolerance:
routed fractions giving odd and even chunk counts, with and without routing bias, group sizes 1 and 2, T not a
multiple of C, packed documents, NaN-poisoned buffers.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
from triton_device import DEVICE

from hybrid_attention.ops.chunk_attention.triton import HAS_TRITON as TRITON_AVAILABLE
from hybrid_attention.ops.chunk_attention.triton import ChunkAttentionConfig
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths

sys.path.insert(0, os.path.dirname(__file__))
from test_chunk_attention_one_pass import _check, _inputs, _run  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton is not installed"),
    pytest.mark.triton,
]
PAIRS = ChunkAttentionConfig(kv_chunks=2, poison=True)


@pytest.mark.parametrize("frac", [0.3, 0.6, 1.0])
@pytest.mark.parametrize("G", [1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_pairs_match_dense(frac: float, G: int, bias: bool) -> None:
    """B = 2, T = 109 (chunks of 16, the last of 13): up to 6 routed chunks before a tile, odd and even counts."""
    B, T, Hs, C = 2, 109, 2 * G, 16
    xs, routing, do = _inputs(B, T, Hs, G, math.ceil(T / C), frac, bias, seed=int(100 * frac) + 7 * G + bias, Dk=24)
    ref = _run([x.double() if x is not None else None for x in xs], routing, do, C, G, "naive")
    dev = [x.to(DEVICE) if x is not None else None for x in xs]
    _check(_run(dev, routing.to(DEVICE), do.to(DEVICE), C, G, "triton", PAIRS), ref)


@pytest.mark.parametrize("lengths,frac,G,C", [((1, 5, 16, 37, 50), 0.7, 2, 16), ((21, 1, 35, 44), 1.0, 1, 32)])
def test_pairs_packed_match_dense(lengths: tuple[int, ...], frac: float, G: int, C: int) -> None:
    """Packed documents: the pairs never reach into another document (each document's routed list starts at its
    first chunk)."""
    N = sum(math.ceil(n / C) for n in lengths)
    xs, routing, do = _inputs(1, sum(lengths), 2 * G, G, N, frac, True, seed=sum(lengths))
    cu = cu_seqlens_from_lengths(lengths)
    ref = _run([x.double() for x in xs], routing, do, C, G, "naive", cu=cu)
    dev = [x.to(DEVICE) for x in xs]
    _check(_run(dev, routing.to(DEVICE), do.to(DEVICE), C, G, "triton", PAIRS, cu=cu.to(DEVICE)), ref)


def test_bad_kv_chunks_one_line_error() -> None:
    with pytest.raises(ValueError, match=r"^kv_chunks must be 1 or 2, got 3$"):
        ChunkAttentionConfig(kv_chunks=3)
    assert ChunkAttentionConfig().kv_chunks == 1  # the default walks one chunk at a time
