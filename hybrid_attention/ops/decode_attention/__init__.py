"""One-query attention over static K/V buffers with device-side lengths (split-KV "flash decoding", Triton).

    o = decode_attention(q, k, v, len1, start2, len2, scale, num_splits)

Per (batch row, head) the keys are the union of two ranges of the buffer: [0, len1) and [start2, start2 + len2),
with the lengths read from device tensors. Softmax attention uses one range ([0, pos + 1)); NAtS-L uses both (the
compacted cache prefix [0, n_kept·C) and the current chunk [cap, cap + slot + 1)). The valid keys are treated as one
virtual sequence of len1 + len2 keys, cut into `num_splits` equal parts, each reduced by its own program (running max,
sum and weighted values in float32); the parts are then combined with their log-sum-exp weights.

Decisions:
- Why not SDPA with a boolean mask: it reads the whole buffer (cost of max_length keys whatever the length), and its
  masked kernel parallelises over (query, head, row) only: with one query and B·H = 16 the GPU is mostly idle at long
  contexts. Here the work follows the real number of keys and is spread over B·H·num_splits programs.
- The split bounds are computed inside the kernel from the device lengths (no host sync, graph capturable); only
  `num_splits` (static) fixes the grid.
- Inference only, no autograd. The PyTorch reference (`decode_attention_reference`, naive.py) defines the result.
- The kernel is a registered custom op (`hybrid_attention::decode_attention`, with a fake kernel) so that a compiled
  decode step treats it as one opaque call (inductor failed inside `_split_kernel` when it traced the raw kernel).
"""

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
