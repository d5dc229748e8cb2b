"""Passkey (needle) retrieval data in two forms: synthetic token-level examples for train-and-evaluate runs like MQAR
(:func:`passkey_tokens`) and text prompts for a trained language model (:func:`passkey_prompt`)."""

from __future__ import annotations

import random

import torch

KEY_TOKEN = 1  # marks the needle and the query; token 0 is unused padding
DIGIT_OFFSET = 2  # digit d is token DIGIT_OFFSET + d


def passkey_tokens(
    num_examples: int, seq_len: int, vocab_size: int, n_digits: int = 4, seed: int = 0, depth: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic passkey examples ``(inputs, labels)``, int64 [num_examples, seq_len].

    ``depth`` in [0, 1] places the needle at that fraction of the filler; ``None`` draws it uniformly per example.

    Filler tokens from ``[2 + n_digits_vocab, vocab)``, a needle ``<KEY> d1..dn`` at the chosen depth, and at the end
    ``<KEY> d1..dn`` again; labels (zoology convention, no shift: ``labels[t]`` is the target at position ``t``) ask for
    ``d_{j+1}`` at the position of ``<KEY>``/``d_j`` in the final copy, -100 elsewhere.
    """
    filler_lo = DIGIT_OFFSET + 10
    if vocab_size <= filler_lo:
        raise ValueError(f"vocab_size must exceed {filler_lo}")
    if seq_len < 2 * (n_digits + 1) + 1:
        raise ValueError(f"seq_len {seq_len} too short for a {n_digits}-digit passkey")
    g = torch.Generator().manual_seed(seed)
    N, n = num_examples, n_digits + 1
    inputs = torch.randint(filler_lo, vocab_size, (N, seq_len), generator=g)
    digits = DIGIT_OFFSET + torch.randint(0, 10, (N, n_digits), generator=g)
    needle = torch.cat([torch.full((N, 1), KEY_TOKEN), digits], dim=1)  # [N, n]
    room = seq_len - 2 * n  # first position after which the needle cannot start
    if depth is None:
        start = torch.randint(0, room + 1, (N,), generator=g)
    else:
        start = torch.full((N,), round(depth * room))
    cols = start[:, None] + torch.arange(n)
    inputs.scatter_(1, cols, needle)
    inputs[:, seq_len - n :] = needle
    labels = torch.full((N, seq_len), -100, dtype=torch.long)
    labels[:, seq_len - n : seq_len - 1] = digits
    return inputs, labels


_FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


def passkey_prompt(n_filler: int, depth: float, seed: int, filler: str = _FILLER) -> tuple[str, str]:
    """A prompt with ``n_filler`` repetitions of ``filler`` and the key at ``depth``; returns (prompt, key).

    For evaluating a trained language model: a 5-digit pass key hidden in filler text at ``depth``, the prompt ending in
    "The pass key is".
    """
    key = str(random.Random(seed).randint(10000, 99999))
    before = int(round(depth * n_filler))
    head = "Find the pass key hidden in this text.\n"
    needle = f"The pass key is {key}. Remember it.\n"
    prompt = head + filler * before + needle + filler * (n_filler - before) + "What is the pass key? The pass key is"
    return prompt, " " + key
