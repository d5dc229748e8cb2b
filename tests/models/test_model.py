"""HybridForCausalLM: HF integration, generation with the cache, save/load, presets, config validation."""

import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import hybrid_attention  # noqa: F401  (registers the Auto classes)
from hybrid_attention.layers.natsl.routing import RoutingRecorder
from hybrid_attention.models import HybridCache, HybridConfig, HybridForCausalLM
from hybrid_attention.training.param_groups import SSM_LR_CAP, ssm_param_groups

MIXERS = ["softmax", "interdomain", "s4d", "s4d_bilinear", "gdn", "natsl"]
HYBRID = ["gdn", "natsl", "softmax", "natsl"]


def _tiny(layers, **kw) -> HybridForCausalLM:
    torch.manual_seed(0)
    # NAtS-L: 4 softmax heads carved from the 2 GDN heads; chunk 16 so prompts cross chunk boundaries.
    kw.setdefault("mixer_options", {"natsl": {"num_attn_heads": 4}})
    return HybridForCausalLM(HybridConfig.from_preset("tiny", layers=layers, **kw)).eval()


def _greedy_uncached(model, ids, n):
    for _ in range(n):
        nxt = model(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


@pytest.mark.parametrize("layers", [*MIXERS, ["softmax", "interdomain"], ["s4d", "softmax"], HYBRID])
def test_generate_equals_uncached_greedy(layers):
    model = _tiny(layers)
    prompt = torch.randint(0, 256, (2, 19))  # no pad id (258) inside; crosses a chunk boundary (tiny chunk_size = 16)
    out = model.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=258)  # decode completes a chunk
    assert torch.equal(out, _greedy_uncached(model, prompt, 16))


@pytest.mark.parametrize("layers", MIXERS)
def test_cache_and_past_key_values_are_the_same_kwarg(layers):
    model = _tiny(layers)
    ids = torch.randint(0, 259, (1, 10))
    c1 = model(ids[:, :7], use_cache=True).cache
    c2 = model(ids[:, :7], use_cache=True).cache
    a = model(ids[:, 7:], cache=c1).logits
    b = model(ids[:, 7:], past_key_values=c2).logits
    full = model(ids, use_cache=False).logits[:, 7:]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, full, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="cache"):
        model(ids[:, 7:], cache=c1, past_key_values=c2)


@pytest.mark.parametrize("layers", [*MIXERS, HYBRID])
def test_chunked_prefill_equals_full_forward(layers):
    model = _tiny(layers)
    ids = torch.randint(0, 259, (2, 45))
    last, cache = model.prefill(ids, chunk_size=13)
    torch.testing.assert_close(last, model(ids, use_cache=False).logits[:, -1], rtol=1e-4, atol=1e-5)
    assert cache.get_seq_length() == 45


def test_cache_counts_tokens_and_is_fed_back():
    model = _tiny("interdomain")
    out = model(torch.randint(0, 259, (1, 5)), use_cache=True)
    assert isinstance(out.cache, HybridCache) and out.cache.get_seq_length() == 5
    assert out.past_key_values is out.cache  # readable under the old name as well


@pytest.mark.parametrize("layers", MIXERS)
def test_save_load_roundtrip(tmp_path, layers):
    model = _tiny(layers)
    ids = torch.randint(0, 259, (2, 21))
    ref = model(ids).logits
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    assert AutoConfig.from_pretrained(tmp_path).model_type == "hybrid_attention"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, HybridForCausalLM)
    torch.testing.assert_close(loaded(ids).logits, ref, rtol=0, atol=0)


def test_loss_and_logits_to_keep():
    model = _tiny("interdomain")
    ids = torch.randint(0, 259, (2, 9))
    out = model(ids, labels=ids)
    manual = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 259), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, manual)
    assert model(ids, logits_to_keep=1).logits.shape == (2, 1, 259)


def test_residual_init_and_state_size():
    model = HybridForCausalLM(HybridConfig.from_preset("small", layers="interdomain"))
    cfg = model.config
    std = model.model.layers[0].mixer.o_proj.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(2 * cfg.num_hidden_layers)) < 1e-3
    assert abs(model.model.layers[0].mixer.proj["q"].weight.std().item() - 0.02) < 1e-3
    per_layer = 2 * cfg.num_heads * cfg.state_size * 2 * cfg.head_dim
    assert model.state_size(10) == model.state_size(10**5) == cfg.num_hidden_layers * per_layer


NATSL_PRESETS = {  # spec natsl.md §4.1: ≈380.1M / ≈793.1M counted from the released configs
    "natsl-hybrid-340m": 380.1e6, "natsl-hybrid-760m": 793.1e6, "natsl-340m": None, "gdn-340m": None,
    "gdn-hybrid-340m": None, "transformer-340m": 373_867_520,
}


def test_natsl_family_presets():
    rows = []
    for name, expected in NATSL_PRESETS.items():
        with torch.device("meta"):
            model = HybridForCausalLM(HybridConfig.from_preset(name))
        n = sum(p.numel() for p in model.parameters())
        rows.append(f"{name}: {n:,}" + (f" (expected ≈{expected:,.0f})" if expected else ""))
        if expected:
            assert abs(n / expected - 1) < 0.001, rows[-1]
    print("\n" + "\n".join(rows))
    cfg = HybridConfig.from_preset("natsl-hybrid-340m")
    assert [i for i, m in enumerate(cfg.mixer_types) if m == "natsl"] == [3, 7, 11, 15, 19, 20]
    gh = HybridConfig.from_preset("gdn-hybrid-340m")
    assert [i for i, m in enumerate(gh.mixer_types) if m == "softmax"] == [3, 7, 11, 15, 19, 20]


@pytest.mark.parametrize("mixer", MIXERS)
def test_tiny_preset_builds_every_mixer_with_defaults(mixer):
    cfg = HybridConfig.from_preset("tiny", layers=mixer)
    model = HybridForCausalLM(cfg)
    assert model(torch.randint(0, 259, (1, 20))).logits.shape == (1, 20, 259)


def test_routing_fractions_exposed():
    model = _tiny(HYBRID)
    rec = RoutingRecorder()
    assert rec.fractions() == {}
    with rec.attach(model):
        model(torch.randint(0, 259, (2, 40)))
    fr = rec.fractions()
    assert sorted(fr) == [1, 3] and all(f.shape == (2,) and ((f >= 0) & (f <= 1)).all() for f in fr.values())


# Table 3 of the Interdomain paper (spec §4.1).
PAPER_PARAMS = {
    "softmax": [134_105_856, 373_867_520, 777_856_512, 1_345_423_360],
    "interdomain": [135_416_208, 377_360_768, 781_498_752, 1_352_406_784],
    "s4d": [135_425_424, 377_385_344, 781_523_328, 1_352_455_936],
}


@pytest.mark.parametrize("mixer", sorted(PAPER_PARAMS))
def test_paper_preset_parameter_counts(mixer):
    rows = []
    for scale, paper in zip(["125m", "350m", "760m", "1.3b"], PAPER_PARAMS[mixer]):
        with torch.device("meta"):
            model = HybridForCausalLM(HybridConfig.from_preset(f"{mixer}-{scale}"))
        n = sum(p.numel() for p in model.parameters())
        rows.append(f"{mixer}-{scale}: {n:,} vs paper {paper:,} ({(n / paper - 1) * 100:+.4f}%)")
        # exact: ShortConv without bias, per-head Δ, S4D-Inv A, full C, the per-channel B (modules/s4d.py) and, for
        # S4D-only, the +H·M of the linear contraction w (layers/interdomain.py)
        assert n == paper, rows[-1]
    print("\n" + "\n".join(rows))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(layers="nope"), "layers"),
        (dict(layers=["softmax", "bad"]), r"layers\[1\]"),
        (dict(num_heads=0), "num_heads"),
        (dict(state_size=-1), "state_size"),
        (dict(mixer_options={"foo": {}}), "mixer_options"),
        (dict(norm_eps=0), "norm_eps"),
        (dict(head_dim=7), "head_dim"),
    ],
)
def test_bad_config_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        HybridConfig.from_preset("tiny", **kwargs)


def test_bad_preset_and_bad_mixer_option():
    with pytest.raises(ValueError, match="preset must be one of"):
        HybridConfig.from_preset("huge")
    # checked when the config is built (against the layer's constructor arguments), before any model exists
    with pytest.raises(ValueError, match="mixer_options.*unknown option 'not_an_option'; allowed options"):
        HybridConfig.from_preset("tiny", mixer_options={"interdomain": {"not_an_option": 1}})


def test_layer_list_sets_depth_and_options_reach_the_layer():
    cfg = HybridConfig.from_preset("tiny", layers=["softmax", "s4d", "interdomain"],
                                   mixer_options={"interdomain": {"rope": False}})
    model = HybridForCausalLM(cfg)
    assert cfg.num_hidden_layers == 3
    assert [b.mixer_type for b in model.model.layers] == ["softmax", "s4d", "interdomain"]
    assert model.model.layers[2].mixer.rotary is None


def test_ssm_param_groups():
    model = _tiny(["interdomain", "softmax"])
    groups = ssm_param_groups(model, lr=3e-3, weight_decay=0.1)
    seen = [id(p) for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters()) and len(seen) == len(set(seen))
    by_name = {g["name"]: g for g in groups}
    assert by_name["ssm"]["lr"] == SSM_LR_CAP and by_name["ssm"]["weight_decay"] == 0
    mixer = model.model.layers[0].mixer
    ssm_ids = {id(p) for p in by_name["ssm"]["params"]}
    for p in [*mixer.ssm.parameters(), mixer.key_norm.weight, mixer.key_norm.bias, mixer.value_norm.bias]:
        assert id(p) in ssm_ids
    decay_ids = {id(p) for p in by_name["decay"]["params"]}
    assert id(mixer.proj["q"].weight) in decay_ids and id(model.model.embeddings.weight) not in decay_ids
    assert ssm_param_groups(model, lr=1e-4, weight_decay=0.1)[0]["lr"] == 1e-4  # cap only lowers


@pytest.mark.parametrize("mixer", ["interdomain", "s4d"])
def test_bf16_model_prefill_runs_and_stays_close(mixer):
    """A model cast to bf16 for inference computes its S4D parameters in float32 (complex bf16 does not exist) and
    its chunked prefill agrees with the float32 model to bf16 accuracy."""
    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=mixer)).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 40))
    with torch.no_grad():
        ref = model(ids).logits[:, -1]
        logits, _ = model.to(torch.bfloat16).prefill(ids, chunk_size=16)
    assert logits.dtype == torch.bfloat16
    err = (logits.float() - ref).abs().max() / ref.abs().max()
    assert err < 5e-2, float(err)
