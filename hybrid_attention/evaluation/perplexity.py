"""Perplexity and bits per byte of a causal LM on a flat token array."""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LMScore:
    """Mean next-token loss (nats/token), its perplexity, bits per byte (None without byte lengths), tokens scored."""

    loss: float
    ppl: float
    bpb: float | None
    tokens: int
    seq_len: int

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def evaluate_lm(
    model: nn.Module,
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int = 8,
    device: torch.device | str = "cpu",
    byte_lengths: np.ndarray | None = None,
    max_tokens: int | None = None,
    autocast_dtype: torch.dtype | None = None,
    rank: int = 0,
    world_size: int = 1,
    all_reduce_sum=None,
) -> LMScore:
    """Score ``tokens[:max_tokens]`` cut into non-overlapping windows of ``seq_len`` (each window starts fresh).

    ``tokens``: flat int array [n]. Every window predicts its tokens 1..seq_len-1. Bits per byte = total nats /
    ln 2 / UTF-8 bytes of the predicted tokens (``byte_lengths[id]``, 0 for specials). In a distributed run each rank
    scores windows ``rank::world_size`` and ``all_reduce_sum`` (tensor -> tensor) adds the totals.
    """
    device = torch.device(device)
    toks = tokens[:max_tokens] if max_tokens else tokens
    n = len(toks) // seq_len
    n -= n % world_size  # every rank runs the same number of forwards (FSDP needs it)
    if n == 0:
        raise ValueError(f"need at least {seq_len * world_size} tokens to score windows of {seq_len}, got {len(toks)}")
    windows = torch.from_numpy(np.asarray(toks[: n * seq_len], dtype=np.int64).reshape(n, seq_len))[rank::world_size]
    blen = torch.from_numpy(np.asarray(byte_lengths, dtype=np.float64)) if byte_lengths is not None else None
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # nats, tokens, bytes
    ctx = (
        torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else contextlib.nullcontext()
    )
    # Scoring runs eager even when the model was compiled for training (``train.compile``: nn.Module.compile with
    # dynamic=False): every new window shape would compile again, ~60 s per shape for an Interdomain model on the
    # H200, longer than a 100M-token run's training; eager inference over the windows takes seconds.
    try:
        for i in range(0, len(windows), batch_size):
            x = windows[i : i + batch_size].to(device)
            with ctx, torch.compiler.set_stance("force_eager"):
                logits = model(input_ids=x, use_cache=False).logits
            nll = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), x[:, 1:].flatten(), reduction="sum")
            totals[0] += nll.double().cpu()
            totals[1] += x[:, 1:].numel()
            if blen is not None:
                totals[2] += blen[x[:, 1:].cpu()].sum()
    finally:
        model.train(was_training)
    if all_reduce_sum is not None:
        totals = all_reduce_sum(totals)
    nats, count, nbytes = totals.tolist()
    loss = nats / count
    bpb = nats / math.log(2) / nbytes if blen is not None and nbytes > 0 else None
    return LMScore(loss=loss, ppl=math.exp(min(loss, 700.0)), bpb=bpb, tokens=int(count), seq_len=seq_len)
