"""YAML configs are bounded: an alias bomb and deep nesting are refused with one line, within a second."""

from __future__ import annotations

import time

import pytest

from hybrid_attention.cli import main
from hybrid_attention.config.schema import MAX_YAML_DEPTH, ConfigError, load_yaml


def _bomb(levels: int = 9) -> str:
    """'billion laughs': each level is a list of nine aliases of the previous one (9**levels values expanded)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_refused_fast():
    t = time.perf_counter()
    with pytest.raises(ConfigError, match="expands to more than"):
        load_yaml(_bomb(), "bomb.yaml")
    assert time.perf_counter() - t < 1.0


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000,
                                  "a:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(MAX_YAML_DEPTH + 5))])
def test_deep_nesting_refused(text):
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_YAML_DEPTH}"):
        load_yaml(text, "deep.yaml")


def test_self_referential_alias_refused():
    with pytest.raises(ConfigError, match="contains it"):
        load_yaml("a: &a [1, *a]\n", "cycle.yaml")


def test_ordinary_aliases_still_load():
    assert load_yaml("a: &x {b: 1}\nc: *x\n", "ok.yaml") == {"a": {"b": 1}, "c": {"b": 1}}


@pytest.mark.parametrize("kind", ["bomb", "deep"])
def test_train_cli_one_line(tmp_path, capsys, kind):
    cfg = tmp_path / f"{kind}.yaml"
    cfg.write_text(_bomb() if kind == "bomb" else "model:\n  options: " + "[" * 100_000 + "]" * 100_000 + "\n")
    out = tmp_path / "run"
    t = time.perf_counter()
    assert main(["train", str(cfg), f"train.out_dir={out}"]) == 2
    assert time.perf_counter() - t < 2.0
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: config error:") and "\n" not in err
    assert not out.exists()
