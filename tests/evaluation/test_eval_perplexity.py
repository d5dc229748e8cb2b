"""Perplexity, bits per byte and the length sweep on a model with known outputs."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybrid_attention.evaluation.length_sweep import length_sweep, length_table, plot_length_sweep
from hybrid_attention.evaluation.perplexity import evaluate_lm


class Uniform(torch.nn.Module):
    """Logits all zero: every next-token loss is ln(vocab)."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, use_cache=False):
        return SimpleNamespace(logits=torch.zeros(*input_ids.shape, self.vocab))


def test_uniform_model_scores_exactly():
    tokens = np.arange(1000) % 256
    s = evaluate_lm(Uniform(259), tokens, seq_len=100, batch_size=3, byte_lengths=np.array([1] * 256 + [0] * 3))
    assert s.loss == pytest.approx(math.log(259), rel=1e-5) and s.ppl == pytest.approx(259, rel=1e-5)
    assert s.bpb == pytest.approx(math.log2(259), rel=1e-5) and s.tokens == 10 * 99


def test_rank_shards_add_up():
    tokens = np.arange(1200) % 256
    parts = [evaluate_lm(Uniform(300), tokens, 100, rank=r, world_size=2, all_reduce_sum=lambda t: t * 2)
             for r in range(2)]
    assert all(p.tokens == 12 * 99 for p in parts)


def test_length_sweep_table_and_plot(tmp_path):
    tokens = np.arange(5000) % 256
    rows = length_sweep(Uniform(259), tokens, train_len=64, multipliers=(1, 2, 4, 8), max_tokens=2048)
    assert [r["seq_len"] for r in rows] == [64, 128, 256, 512]
    assert all(r["ppl"] == pytest.approx(259, rel=1e-5) for r in rows)
    table = length_table(rows)
    assert "x train" in table and "512" in table
    assert plot_length_sweep({"uniform": rows}, tmp_path / "l.png").stat().st_size > 1000


def test_too_short_for_a_window():
    with pytest.raises(ValueError, match="need at least"):
        evaluate_lm(Uniform(10), np.arange(5), seq_len=10)


def test_scoring_a_compiled_model_compiles_nothing():
    """evaluate_lm runs eager under a model compiled for training: new window shapes must not compile again (on the
    H200 each recompile of an Interdomain model takes ~60 s)."""
    from hybrid_attention.models import HybridConfig, HybridForCausalLM

    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers="softmax"))
    tokens = np.random.default_rng(0).integers(0, model.config.vocab_size, 200)
    eager = evaluate_lm(model, tokens, 16, batch_size=3)
    model.compile(backend=counting_backend, dynamic=False)
    model(input_ids=torch.randint(0, model.config.vocab_size, (2, 8)))  # the training shape: compiles
    n = len(graphs)
    assert n > 0
    scored = evaluate_lm(model, tokens, 16, batch_size=3)
    assert len(graphs) == n  # nothing compiled for the scoring shapes
    assert scored.loss == pytest.approx(eager.loss, rel=1e-6)
