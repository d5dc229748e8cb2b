"""MQAR generator properties (zoology semantics) and the synthetic passkey task."""

import pytest
import torch

from hybrid_attention.data import MQARConfig, multiquery_ar, passkey_prompt, passkey_tokens, recall_accuracy


@pytest.mark.parametrize("T,K,V", [(64, 4, 256), (128, 8, 8192), (64, 16, 128)])
def test_mqar_properties(T, K, V):
    cfg = MQARConfig(vocab_size=V, input_seq_len=T, num_kv_pairs=K)
    x, y = multiquery_ar(cfg, 200, seed=1)
    assert x.shape == y.shape == (200, T)
    half = V // 2
    keys, values = x[:, 0 : 2 * K : 2], x[:, 1 : 2 * K : 2]
    assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < V)).all()
    for row_k in keys:
        assert len(set(row_k.tolist())) == K  # keys distinct within an example
    assert ((y != -100).sum(1) == K).all()  # exactly one query per key
    for n in range(200):
        pos = (y[n] != -100).nonzero().flatten()
        assert (pos >= 2 * K).all() and (pos % 2 == 0).all()  # labels only in the query region, at queries
        for t in pos.tolist():
            key, val = x[n, t].item(), y[n, t].item()
            j = (x[n, :t] == key).nonzero().flatten()[0].item()  # the answer was given earlier
            assert j < 2 * K and x[n, j + 1].item() == val
        mask = torch.ones(T, dtype=torch.bool)
        mask[pos] = False
        mask[: 2 * K] = False
        assert (x[n][mask] == 0).all()
    assert torch.equal(multiquery_ar(cfg, 200, seed=1)[0], x)


def test_mqar_power_law_favours_early_queries():
    x, y = multiquery_ar(MQARConfig(vocab_size=512, input_seq_len=256, num_kv_pairs=4), 500, seed=0)
    pos = (y != -100).nonzero()[:, 1].float() - 8
    assert pos.median() < 0.35 * (256 - 8)


def test_mqar_rejects_bad_sizes():
    with pytest.raises(ValueError, match="even"):
        multiquery_ar(MQARConfig(input_seq_len=63), 1, 0)
    with pytest.raises(ValueError, match="4 \\* num_kv_pairs"):
        multiquery_ar(MQARConfig(vocab_size=256, input_seq_len=64, num_kv_pairs=17), 1, 0)


def test_recall_accuracy_counts_queries_only():
    y = torch.tensor([[-100, 5, -100, 6]])
    logits = torch.zeros(1, 4, 10)
    logits[0, 1, 5] = 1
    logits[0, 0, 9] = 1
    assert recall_accuracy(logits, y).tolist() == [0.5]


def test_passkey_tokens_and_prompt():
    x, y = passkey_tokens(16, 64, vocab_size=64, n_digits=4, seed=0)
    n = 5
    assert torch.equal(x[:, -n:][:, 1:], y[:, -n:-1])
    assert ((x == 1).sum(1) == 2).all()  # needle + query
    prompt, key = passkey_prompt(20, 0.5, seed=3)
    assert key.strip() in prompt and prompt.endswith("The pass key is") and len(key.strip()) == 5


@pytest.mark.parametrize("T,K,V,seed", [(64, 8, 256, 0), (256, 16, 8192, 1), (1024, 64, 8192, 2)])
def test_mqar_uniform_draws_equal_the_gumbel_form(monkeypatch, T, K, V, seed):
    # keys and values are drawn uniformly without replacement by the top k of u, the Gumbel top-k of uniform weights
    # without its two logarithms: the same examples as the full Gumbel form from the same generator
    from hybrid_attention.data import mqar

    def gumbel(weights, k, g, shape=None):
        w = torch.ones(shape, dtype=torch.float64) if weights is None else weights
        u = torch.rand(w.shape, generator=g, dtype=torch.float64).clamp_min(1e-300)
        return torch.topk(w.log() - torch.log(-torch.log(u)), k, dim=-1).indices

    cfg = MQARConfig(vocab_size=V, input_seq_len=T, num_kv_pairs=K)
    fast = multiquery_ar(cfg, 300, seed)
    monkeypatch.setattr(mqar, "_distinct", gumbel)
    slow = multiquery_ar(cfg, 300, seed)
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
