"""Multi-query associative recall (MQAR), re-implemented from zoology's description (Arora et al., 2023): the
examples (``multiquery_ar``) and their scores (``recall_accuracy``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MQARConfig:
    """Generator parameters, zoology's names and defaults (``random_non_queries`` as in the paper's Figure 2)."""

    vocab_size: int = 8192
    input_seq_len: int = 64
    num_kv_pairs: int = 8
    power_a: float = 0.01
    random_non_queries: bool = False

    def __post_init__(self) -> None:
        T, K, V = self.input_seq_len, self.num_kv_pairs, self.vocab_size
        if T % 2:
            raise ValueError(f"input_seq_len must be even, got {T}")
        if V <= T:
            raise ValueError(f"vocab_size ({V}) must exceed input_seq_len ({T})")
        if 4 * K > T:
            raise ValueError(f"4 * num_kv_pairs ({4 * K}) must not exceed input_seq_len ({T})")
        if K > V // 2 - 1:
            raise ValueError(f"num_kv_pairs ({K}) exceeds the key vocabulary ({V // 2 - 1})")


def _distinct(weights: torch.Tensor | None, k: int, g: torch.Generator, shape: tuple[int, int] | None = None
              ) -> torch.Tensor:
    """k distinct indices per row drawn without replacement ∝ weights [N, M] (Gumbel top-k), shape [N, k].

    ``weights=None``: uniform over ``shape`` [N, M]. Then the Gumbel key log w - log(-log u) is a strictly increasing
    function of u alone, so the top k of u are the same indices in the same order (same draws from ``g``): the two
    logarithms over N x M numbers (half of the generator's time at vocabulary 8192) are skipped, and the examples are
    the same (tests/data/test_data_recall_tasks.py compares with the Gumbel form)."""
    u = torch.rand(weights.shape if weights is not None else shape, generator=g, dtype=torch.float64)
    if weights is None:
        return torch.topk(u, k, dim=-1).indices
    return torch.topk(weights.log() - torch.log(-torch.log(u.clamp_min(1e-300))), k, dim=-1).indices


def multiquery_ar(cfg: MQARConfig, num_examples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_examples`` MQAR examples: ``(inputs, labels)``, both int64 of shape [num_examples, input_seq_len].

    An example of length ``T`` with ``K`` key-value pairs:

      * positions ``0 .. 2K-1``: ``k1 v1 k2 v2 ...``; keys drawn from ``[1, vocab/2)``, values from ``[vocab/2,
        vocab)``, each without replacement, so every key occurs once in the context;
      * the query region (``T - 2K`` positions): every key reappears once, at an even offset ``2*gap`` where the ``K``
        distinct gaps are drawn from a power law ``p(i) ∝ a * i**(a-1)`` (``a = power_a``, i = 1..(T-2K)/2), so most
        queries come early; the other positions are 0 (or random tokens with ``random_non_queries``, which, as in
        zoology, may collide with keys).

    Labels follow zoology: ``labels[t]`` is the target *at* position ``t`` (no shift): the value of the key that stands
    at a query position, -100 everywhere else. Score with :func:`recall_accuracy` on logits of the same positions.
    """
    T, K, V = cfg.input_seq_len, cfg.num_kv_pairs, cfg.vocab_size  # checked by MQARConfig
    g = torch.Generator().manual_seed(seed)
    N, half = num_examples, V // 2
    keys = 1 + _distinct(None, K, g, (N, half - 1))
    values = half + _distinct(None, K, g, (N, V - half))
    context = 2 * K
    space = (T - context) // 2
    i = torch.arange(1, space + 1, dtype=torch.float64)
    p = cfg.power_a * i ** (cfg.power_a - 1)
    gaps = _distinct((p / p.sum()).expand(N, space), K, g)
    inputs = torch.zeros(N, T, dtype=torch.long)
    inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
    qpos = context + 2 * gaps
    inputs.scatter_(1, qpos, keys)
    labels = torch.full((N, T), -100, dtype=torch.long)
    labels.scatter_(1, qpos, values)
    if cfg.random_non_queries:
        noise = torch.randint(V, (N, T), generator=g)
        fill = inputs == 0
        fill[:, :context] = False
        inputs[fill] = noise[fill]
    return inputs, labels


def recall_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example accuracy on labelled positions only: logits [N, T, V], labels [N, T] (-100 = ignore) -> [N]."""
    return prediction_accuracy(logits.argmax(-1), labels)


def prediction_accuracy(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-example accuracy of predicted tokens pred [N, T] on the labelled positions of labels [N, T] (-100 =
    ignore; pred is not read there) -> [N]."""
    mask = labels != -100
    correct = (pred == labels) & mask
    return correct.sum(-1).float() / mask.sum(-1).clamp_min(1).float()
