"""Packing and the resumable, deterministic batch streams."""

import numpy as np
import pytest
import torch

from hybrid_attention.data import (
    DataError,
    PackedSequences,
    ShuffledBatches,
    StreamingBatches,
    byte_tokenizer,
    local_slice,
)


def test_shuffled_batches_resume_exactly():
    seqs = PackedSequences(np.arange(1000, dtype=np.int32), seq_len=10)
    a = ShuffledBatches(seqs, batch_size=8, seed=3)
    ref = [a.next_batch() for _ in range(30)]  # crosses epochs (12 batches per epoch)
    b = ShuffledBatches(seqs, batch_size=8, seed=3)
    for _ in range(17):
        b.next_batch()
    c = ShuffledBatches(seqs, batch_size=8, seed=3)
    c.load_state_dict(b.state_dict())
    assert all(torch.equal(c.next_batch(), r) for r in ref[17:])
    # one epoch visits each sequence at most once
    first = torch.cat(ref[:12])[:, 0].tolist()
    assert len(set(first)) == len(first)


def test_streaming_batches_resume_and_epochs():
    docs = [f"document number {i} " * (i % 7 + 1) for i in range(20)]
    tok = byte_tokenizer()
    a = StreamingBatches(lambda: iter(docs), tok, seq_len=16, batch_size=4, docs_per_chunk=8)
    ref = [a.next_batch() for _ in range(40)]
    assert a.epoch >= 1
    b = StreamingBatches(lambda: iter(docs), tok, seq_len=16, batch_size=4, docs_per_chunk=8)
    for _ in range(23):
        b.next_batch()
    c = StreamingBatches(lambda: iter(docs), tok, seq_len=16, batch_size=4, docs_per_chunk=8)
    c.load_state_dict(b.state_dict())
    assert all(torch.equal(c.next_batch(), r) for r in ref[23:])


def test_local_slice_partitions_global_batch():
    g = torch.arange(8)[:, None].expand(8, 3)
    one = local_slice(g, grad_accum=2, rank=0, world_size=1)
    parts = [local_slice(g, grad_accum=1, rank=r, world_size=2) for r in range(2)]
    assert one.shape == (2, 4, 3) and parts[0].shape == (1, 4, 3)
    two = [set(local_slice(g, 2, r, 2)[:, :, 0].flatten().tolist()) for r in range(2)]
    assert two[0] | two[1] == set(range(8)) and not two[0] & two[1]


def test_too_little_data():
    with pytest.raises(DataError, match="shorter than one sequence"):
        PackedSequences(np.arange(5), seq_len=10)
    with pytest.raises(DataError, match="fewer than one global batch"):
        ShuffledBatches(PackedSequences(np.arange(50), seq_len=10), batch_size=8)
