"""Config validation: one-line errors naming the key and the allowed values; YAML + overrides; saved config."""

from pathlib import Path

import pytest
import yaml

from hybrid_attention.config.run_config import load_config, save_config
from hybrid_attention.config.schema import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("train.stepz=1", r"unknown key 'train.stepz'; allowed keys in 'train': out_dir, steps"),
        ("trian.steps=1", r"unknown key 'trian'; allowed keys at the top level: model, data, optim, train"),
        ("train.device=gpu", r"train.device = 'gpu' is not allowed; allowed values: auto, cpu, cuda"),
        ("train.parallel=zero3", r"allowed values: ddp, fsdp2"),
        ("data.source=web", r"data.source = 'web' is not allowed; allowed values: stdlib, local, hf"),
        ("optim.lr=fast", r"optim.lr = 'fast' is not a number"),
        ("train.steps=1.5", r"train.steps = 1.5 is not an integer"),
        ("train.steps=0", r"train.steps = 0 must be > 0"),
        ("train.compile=maybe", r"train.compile = 'maybe' is not true/false"),
        ("train.compile_mode=fast", r"train.compile_mode = 'fast' is not allowed; allowed values: default, "
                                    r"reduce-overhead, max-autotune-no-cudagraphs"),
        ("model.layers=transformer", r"model: layers\[0\] = 'transformer' is not a mixer; allowed values"),
        ("model.preset=huge", r"model.preset = 'huge' is not allowed; allowed values: .*tiny"),
        ("data.tokenizer=/does/not/exist", r"allowed values: byte, bpe, or an existing tokenizer directory"),
        ("optim.beta2=1.5", r"optim.beta2 = 1.5 must be in \[0, 1\)"),
        ("train.batch_size=6", r"train.batch_size = 6 is not divisible by train.grad_accum = 4"),
        ("steps", r"override 'steps' is not key=value"),
    ],
)
def test_errors_are_one_line_and_name_the_key(override, pattern):
    extra = ["train.grad_accum=4"] if "batch_size" in override else []
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(None, [*extra, override])
    assert "\n" not in str(info.value)


def test_yaml_overrides_and_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {layers: softmax}\noptim: {lr: 3e-4}\ntrain: {steps: 7}\n")
    cfg = load_config(path, ["train.steps=9", "model.layers=[softmax, s4d]"])
    assert cfg.optim.lr == 3e-4 and cfg.train.steps == 9 and cfg.model.layers == ["softmax", "s4d"]
    save_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == cfg
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text())["train"]["steps"] == 9


def test_bad_yaml_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    data = yaml.safe_load(path.read_text())
    if "task" in data or "mixers" in data:  # recall sweep configs
        from hybrid_attention.config.schema import from_dict
        from hybrid_attention.training.recall import RecallConfig

        from_dict(RecallConfig, data)
    else:
        load_config(path)
