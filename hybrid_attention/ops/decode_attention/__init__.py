"""One-query attention over static K/V buffers with device-side lengths (split-KV "flash decoding", Triton):
``o = decode_attention(q, k, v, len1, start2, len2, scale, num_splits)``; the algorithm and its decisions are at the
kernel (``triton/kernel.py``), the result is defined by ``decode_attention_reference`` (naive.py)."""

from __future__ import annotations

import torch

from .naive import decode_attention_reference
from .triton import HAS_TRITON, decode_attention

__all__ = ["HAS_TRITON", "decode_attention", "decode_attention_reference", "default_num_splits"]


def default_num_splits(device: torch.device, rows_heads: int, max_keys: int) -> int:
    """Enough programs to fill the GPU about 4 times over, and at least `MIN_KEYS_PER_SPLIT` keys per split."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(-(-4 * sms // rows_heads), -(-max_keys // MIN_KEYS_PER_SPLIT)))


# DECISION: 64 keys per split at least (one BLOCK_N block). With 256, the split kernel takes 12.5 µs per
# transformer-340m layer at 1K context on the H200 (B = 1, 16 heads: 5 splits, 80 programs each walking 4 blocks in
# series) for 4 MB of K / V, i.e. latency, not bandwidth. At 1K this gives 17 splits of one block each; from ≈ 2K
# keys on, the 4-waves-of-programs cap decides.
MIN_KEYS_PER_SPLIT = 64
