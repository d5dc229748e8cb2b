"""HybridConfig records the Interdomain readout; configs saved before it did read LEGACY_READOUT ("transpose"), so a
later change of DEFAULT_READOUT changes no stored model."""

import inspect
import json

import pytest
from transformers import AutoConfig

import hybrid_attention  # noqa: F401  (registers the Auto classes)
from hybrid_attention.layers.interdomain import InterdomainAttention, S4DMixer
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.models.configuration import CONFIG_REVISION
from hybrid_attention.ops.interdomain import readout as readout_mod
from hybrid_attention.ops.interdomain.readout import DEFAULT_READOUT, LEGACY_READOUT

# config.json of HybridConfig.from_preset("tiny") as save_pretrained wrote it before configs recorded the readout
# (commit 2bb312c, transformers 5.24.0): no config_revision, mixer_options without "readout".
LEGACY_TINY_JSON = {
    "bos_token_id": None, "chunk_size": 16, "eos_token_id": None, "head_dim": 32, "hidden_size": 64,
    "initializer_range": 0.02, "intermediate_size": 256, "layers": "interdomain", "max_position_embeddings": 1024,
    "mixer_options": {}, "model_type": "hybrid_attention", "norm_eps": 1e-06, "num_heads": 2, "num_hidden_layers": 2,
    "pad_token_id": None, "rescale_residual": True, "rope_theta": 10000.0, "state_size": 16,
    "tie_word_embeddings": False, "transformers_version": "5.24.0", "use_cache": True, "vocab_size": 259,
}


def _readouts(model) -> list[str]:
    return [m.readout for m in model.modules() if type(m) is InterdomainAttention]


@pytest.fixture
def hermitian_default(monkeypatch):
    """The later switch: DEFAULT_READOUT and the layer's constructor default both become "hermitian"."""
    monkeypatch.setattr(readout_mod, "DEFAULT_READOUT", "hermitian")
    params = list(inspect.signature(InterdomainAttention.__init__).parameters.values())
    with_default = [p for p in params if p.default is not inspect.Parameter.empty]
    defaults = tuple("hermitian" if p.name == "readout" else p.default for p in with_default)
    monkeypatch.setattr(InterdomainAttention.__init__, "__defaults__", defaults)
    assert InterdomainAttention(64, 2, 32).readout == "hermitian"


def _legacy_dir(tmp_path, config_json: dict):
    """A model directory as today's save_pretrained leaves it, with the given config.json."""
    HybridForCausalLM(HybridConfig.from_preset("tiny")).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    return tmp_path


@pytest.mark.parametrize("layers", ["interdomain", ["softmax", "interdomain"], ["s4d", "interdomain", "gdn"]])
def test_fresh_config_records_default(layers):
    cfg = HybridConfig.from_preset("tiny", layers=layers)
    assert cfg.config_revision == CONFIG_REVISION
    assert cfg.mixer_options == {"interdomain": {"readout": DEFAULT_READOUT}}
    assert cfg.to_diff_dict()["mixer_options"] == {"interdomain": {"readout": DEFAULT_READOUT}}
    assert set(_readouts(HybridForCausalLM(cfg))) == {DEFAULT_READOUT}


def test_fresh_config_follows_a_switched_default(hermitian_default):
    cfg = HybridConfig.from_preset("tiny")
    assert cfg.mixer_options["interdomain"]["readout"] == "hermitian"
    assert _readouts(HybridForCausalLM(cfg)) == ["hermitian", "hermitian"]


def test_user_readout_kept():
    opts = {"interdomain": {"readout": "real", "rope": False}}
    cfg = HybridConfig.from_preset("tiny", mixer_options=opts)
    assert cfg.mixer_options == opts and opts == {"interdomain": {"readout": "real", "rope": False}}  # not mutated
    assert _readouts(HybridForCausalLM(cfg)) == ["real", "real"]


@pytest.mark.parametrize("readout", [None, "hermitian"])
def test_save_load_round_trip_keeps_readout(tmp_path, readout):
    opts = {"interdomain": {"readout": readout}} if readout else None
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", mixer_options=opts))
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    want = readout or DEFAULT_READOUT
    assert saved["mixer_options"] == {"interdomain": {"readout": want}}
    assert saved["config_revision"] == CONFIG_REVISION
    for cfg in (HybridConfig.from_pretrained(tmp_path), AutoConfig.from_pretrained(tmp_path),
                HybridConfig.from_json_file(tmp_path / "config.json"), HybridConfig.from_dict(saved),
                HybridConfig(**model.config.to_dict())):
        assert cfg.config_revision == CONFIG_REVISION and cfg.interdomain_readout == want
    loaded = HybridForCausalLM.from_pretrained(tmp_path)
    assert _readouts(loaded) == [want, want]


@pytest.mark.parametrize("switched", [False, True])
def test_legacy_config_reads_transpose(tmp_path, request, switched):
    if switched:
        request.getfixturevalue("hermitian_default")
    d = _legacy_dir(tmp_path, LEGACY_TINY_JSON)
    for cfg in (HybridConfig.from_pretrained(d), AutoConfig.from_pretrained(d),
                HybridConfig.from_json_file(d / "config.json"), HybridConfig.from_dict(dict(LEGACY_TINY_JSON)),
                HybridConfig(**LEGACY_TINY_JSON)):
        assert cfg.config_revision == 0
        assert cfg.mixer_options == {"interdomain": {"readout": LEGACY_READOUT}}
        assert _readouts(HybridForCausalLM(cfg)) == ["transpose", "transpose"]
    loaded = HybridForCausalLM.from_pretrained(d)
    assert _readouts(loaded) == ["transpose", "transpose"]
    # re-saved, it stays transpose (recorded now) and keeps revision 0
    loaded.save_pretrained(tmp_path / "again")
    again = json.loads((tmp_path / "again" / "config.json").read_text())
    assert again["mixer_options"] == {"interdomain": {"readout": "transpose"}} and again["config_revision"] == 0
    # options replaced after loading (from_pretrained(..., mixer_options=...) sets them after __init__): the builder
    # still asks the config, not the layer's default
    cfg = HybridConfig.from_pretrained(d, mixer_options={"interdomain": {"rope": False}})
    assert cfg.mixer_options == {"interdomain": {"rope": False}}
    assert _readouts(HybridForCausalLM(cfg)) == ["transpose", "transpose"]


def test_legacy_config_keeps_its_set_readout(tmp_path, hermitian_default):  # e.g. a readout A/B cell saved before
    d = _legacy_dir(tmp_path, {**LEGACY_TINY_JSON, "mixer_options": {"interdomain": {"readout": "real"}}})
    assert _readouts(HybridForCausalLM.from_pretrained(d)) == ["real", "real"]


@pytest.mark.parametrize("layers", ["softmax", "s4d", "s4d_bilinear", ["gdn", "natsl"], ["s4d", "softmax"]])
@pytest.mark.parametrize("saved", [False, True])
def test_config_without_interdomain_unchanged(layers, saved):
    opts = {"s4d": {"rope": False}} if layers == "s4d" else {}
    if saved:  # an old-style dict of this config
        d = {**LEGACY_TINY_JSON, "layers": layers, "mixer_options": opts}
        d["num_hidden_layers"] = len(layers) if isinstance(layers, list) else 2
        cfg = HybridConfig.from_dict(d)
    else:
        cfg = HybridConfig.from_preset("tiny", layers=layers, mixer_options=opts or None)
    assert cfg.mixer_options == opts
    assert cfg.to_diff_dict()["mixer_options"] == opts
    model = HybridForCausalLM(cfg)
    assert _readouts(model) == []
    for m in model.modules():
        if isinstance(m, S4DMixer):
            assert not m.query_readout



def test_readout_recorded_on_save_after_changes(tmp_path, monkeypatch):
    cfg = HybridConfig.from_preset("tiny", layers="softmax")
    cfg.layers = "interdomain"  # changed after construction: nothing recorded in mixer_options yet
    model = HybridForCausalLM(cfg)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["mixer_options"] == {"interdomain": {"readout": DEFAULT_READOUT}}
    monkeypatch.setattr(readout_mod, "DEFAULT_READOUT", "real" if DEFAULT_READOUT != "real" else "hermitian")
    assert _readouts(HybridForCausalLM.from_pretrained(tmp_path)) == _readouts(model)
