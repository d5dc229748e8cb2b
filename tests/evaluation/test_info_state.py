"""``info`` and the demo's table compute a NAtS-L state size the same way and say which routing it assumes."""

import torch

from hybrid_attention.data.tokenizer import byte_tokenizer
from hybrid_attention.evaluation.info import ASSUMED_SOFTMAX_FRACTION, format_info, model_info, state_size
from hybrid_attention.models import HybridConfig, HybridForCausalLM


def _natsl():
    cfg = HybridConfig.from_preset("tiny", layers=["gdn", "natsl"], mixer_options={"natsl": {"num_attn_heads": 4}})
    return HybridForCausalLM(cfg)


def test_state_size_does_not_depend_on_the_last_forward():
    model = _natsl()
    before = state_size(model, 256)
    model(input_ids=torch.randint(0, 256, (1, 64)), use_cache=False)  # sets a measured routing fraction
    assert state_size(model, 256) == before
    natsl = model.model.layers[1].mixer
    assert before == (model.model.layers[0].mixer.state_size(256)
                      + natsl.state_size(256, softmax_fraction=ASSUMED_SOFTMAX_FRACTION))
    assert state_size(model, 256, softmax_fraction=1.0) > before > state_size(model, 256, softmax_fraction=0.0)


def test_info_says_which_routing_the_state_size_assumes():
    model = _natsl()
    info = model_info(model, byte_tokenizer(), (64, 256), sample_text="def f(x):\n    return x + 1\n" * 40)
    assert info["state_size"] == {64: state_size(model, 64), 256: state_size(model, 256)}
    measured = info["measured_softmax_fraction"]
    assert 0.0 <= measured <= 1.0
    text = format_info(info)
    assert (f"\n  NAtS-L layers counted with 50% of their chunks routed to softmax attention (whose KV cache grows "
            f"with that share); the router sent {measured:.0%} of the sample text's chunks there") in text


def test_info_of_a_model_without_natsl_has_no_routing_note():
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers="softmax"))
    text = format_info(model_info(model, None, (64,)))
    assert "softmax fraction" not in text and "state size (numbers per sequence): " in text
