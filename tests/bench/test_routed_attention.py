"""benchmarks/routed_attention.py: its work count equals the pairs the op's definition attends, and the script runs
end to end on the CPU (interpreter, no timings)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.routed_attention import attended_pairs, main
from hybrid_attention.ops.chunk_attention.naive import routing_to_heads


def _dense_pairs(routing: torch.Tensor, T: int, C: int, group: int) -> int:
    """Visible (query, key) pairs of ``naive_chunk_attention``'s mask, over batch and softmax heads."""
    pos = torch.arange(T)
    chunk = pos // C
    own = (chunk[:, None] == chunk[None, :]) & (pos[:, None] >= pos[None, :])
    earlier = chunk[None, :] < chunk[:, None]
    routed = routing_to_heads(routing, group)[:, chunk].permute(0, 2, 1)[:, :, None, :]
    return int((own | (earlier & routed)).sum())


@pytest.mark.parametrize("T,C,group,fraction", [(200, 16, 2, 0.4), (64, 16, 1, 1.0), (70, 32, 3, 0.0)])
def test_attended_pairs_match_the_mask(T, C, group, fraction):
    n = -(-T // C)
    routing = (torch.rand(2, n, 2, generator=torch.Generator().manual_seed(T)) < fraction).float()
    assert attended_pairs(routing, T, C, group) == _dense_pairs(routing, T, C, group)


@pytest.mark.triton
def test_dryrun_runs(capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert main(["--dryrun", "--variants", "default", "--fractions", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "| 1x80x4x16x32 | 0.5 | default |" in out and "SDPA causal" in out
