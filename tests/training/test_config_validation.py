"""Config loading never ends in a traceback or a silent surprise: every problem is one ConfigError line naming it."""

import pytest

from hybrid_attention.config.run_config import load_config
from hybrid_attention.config.schema import ConfigError
from hybrid_attention.models import HybridConfig
from hybrid_attention.models.configuration import mixer_option_names
from hybrid_attention.models.mixers import MIXER_BUILDERS


def _error(path=None, overrides=()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("config error: ")
    return msg


@pytest.mark.parametrize("text, kind", [("- model\n- train\n", "a list"), ("just a string\n", "a string"),
                                        ("42\n", "an integer")])
def test_top_level_must_be_a_mapping(tmp_path, text, kind):
    (tmp_path / "c.yaml").write_text(text)
    msg = _error(tmp_path / "c.yaml")
    assert "the top level must be a mapping" in msg and kind in msg and "c.yaml" in msg


def test_empty_file_is_the_defaults(tmp_path):
    (tmp_path / "c.yaml").write_text("# nothing\n")
    assert load_config(tmp_path / "c.yaml").train.steps == load_config(None).train.steps


def test_non_utf8_file(tmp_path):
    (tmp_path / "c.yaml").write_bytes(b"train: {steps: 3}\n# caf\xe9\n")
    msg = _error(tmp_path / "c.yaml")
    assert "is not UTF-8 text" in msg and "0xe9" in msg


@pytest.mark.parametrize("text, key, line", [("train:\n  steps: 3\ntrain:\n  steps: 4\n", "train", 3),
                                             ("train: {steps: 3, log_every: 1, steps: 4}\n", "steps", 1),
                                             ("model:\n  options:\n    hidden_size: 64\n    hidden_size: 32\n",
                                              "hidden_size", 4)])
def test_duplicate_keys_are_rejected(tmp_path, text, key, line):
    (tmp_path / "c.yaml").write_text(text)
    msg = _error(tmp_path / "c.yaml")
    assert f"duplicate key '{key}'" in msg and f"(line {line}," in msg


@pytest.mark.parametrize("override", ["model.layers=[softmax", "train.steps={a: 1", "model.options={x: [}"])
def test_bad_yaml_override(override):
    msg = _error(overrides=[override])
    assert f"override {override!r} is not valid YAML" in msg


@pytest.mark.parametrize("override", ["optim.lr=.nan", "optim.lr=.inf", "optim.lr=-.inf", "optim.lr=nan",
                                      "optim.lr=inf", "optim.eps=.nan", "optim.beta1=.nan", "optim.grad_clip=.inf",
                                      "optim.min_lr_ratio=.nan", "data.val_fraction=.nan"])
def test_non_finite_numbers(override):
    key = override.split("=")[0]
    assert f"{key} = " in (msg := _error(overrides=[override])) and "is not a finite number" in msg


@pytest.mark.parametrize("override", ["model.options={rope_theta: .nan}", "model.options={norm_eps: .inf}",
                                      "model.options={mixer_options: {interdomain: {dt_max: .nan}}}"])
def test_non_finite_numbers_in_model_options(override):
    assert "is not a finite number" in _error(overrides=[override])


def test_unknown_model_option():
    msg = _error(overrides=["model.options={hidden_sise: 64}"])
    assert "unknown key 'model.options.hidden_sise'" in msg and "hidden_size" in msg and "mixer_options" in msg


@pytest.mark.parametrize("mixer, option", [("s4d", "rop"), ("interdomain", "readuot"), ("natsl", "num_attn_head"),
                                           ("softmax", "state_size"), ("gdn", "rope")])
def test_unknown_mixer_option_names_it_and_the_allowed_ones(mixer, option):
    msg = _error(overrides=[f"model.layers={mixer}", f"model.options={{mixer_options: {{{mixer}: {{{option}: 1}}}}}}"])
    assert f"mixer_options[{mixer!r}] has unknown option {option!r}" in msg
    for allowed in mixer_option_names(MIXER_BUILDERS[mixer][0]):
        assert allowed in msg


def test_unknown_mixer_option_of_an_unused_mixer_is_caught_too():
    # checked when the config is built, not only when a layer of that mixer is constructed
    with pytest.raises(ValueError, match="mixer_options\\['natsl'\\] has unknown option 'nope'"):
        HybridConfig.from_preset("tiny", layers="softmax", mixer_options={"natsl": {"nope": 1}})


def test_mixer_option_names_follow_the_kwargs_chain():
    s4d = mixer_option_names(MIXER_BUILDERS["s4d"][0])
    assert {"num_heads", "state_size", "dt_min", "readout", "rope"} <= set(s4d)  # S4DMixer -> S4DCoreMixer
    assert "hidden_size" not in s4d
    # S4DMixer accepts (and ignores) readout: a shared mixer_options block stays valid
    cfg = load_config(None, ["model.layers=s4d", "model.options={mixer_options: {s4d: {readout: real, rope: true}}}"])
    assert cfg.model.options["mixer_options"]["s4d"]["readout"] == "real"
    natsl = mixer_option_names(MIXER_BUILDERS["natsl"][0])
    assert "num_attn_heads" in natsl and "weights_from" in natsl
