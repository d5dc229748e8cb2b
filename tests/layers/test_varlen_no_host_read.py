"""Packed-document helpers of the layers read no offsets on the host when they are device tensors: run on the meta
device, where any host read (int(), .item(), .tolist(), a data-dependent output size) raises."""

from __future__ import annotations

import pytest
import torch

from hybrid_attention.layers.base import packed_positions
from hybrid_attention.modules import ShortConvolution
from hybrid_attention.ops.common.varlen import document_ids, positions_in_document


def test_positions_equal_the_host_path():
    cu = torch.tensor([0, 1, 5, 9, 16], dtype=torch.int32)
    want = torch.cat([torch.arange(n) for n in (1, 4, 4, 7)])
    assert torch.equal(positions_in_document(cu, 16), want)
    assert torch.equal(positions_in_document(cu), want)
    assert torch.equal(document_ids(cu, 16), torch.repeat_interleave(torch.arange(4), torch.tensor([1, 4, 4, 7])))


def test_layer_helpers_need_no_host_read():
    cu = torch.empty(5, dtype=torch.int32, device="meta")
    x = torch.empty(1, 16, 8, device="meta")
    assert positions_in_document(cu, 16).shape == (16,)
    assert packed_positions(x, None, False, cu, "layer").shape == (16,)
    y, _ = ShortConvolution(8, 4, "silu").to("meta")(x, cu_seqlens=cu)
    assert y.shape == x.shape and y.device.type == "meta"
    with pytest.raises((RuntimeError, NotImplementedError)):  # control: without T the length is read on the host
        positions_in_document(cu)
