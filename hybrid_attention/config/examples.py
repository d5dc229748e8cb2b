"""The example training configs shipped in the package (``hybrid_attention/config/examples/``), so that
``hybrid-attention train tiny_cpu`` works from an installed wheel; a clone's ``configs/<name>.yaml`` link to them."""

from __future__ import annotations

import os
from pathlib import Path

from .schema import ConfigError

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"


def example_names() -> list[str]:
    """The names of the shipped example configs (``tiny_cpu``, ...), sorted."""
    return sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml"))


def config_path(given: str | os.PathLike) -> Path:
    """The config file that ``given`` names: that path when it exists, else the shipped example of that bare name
    (``tiny_cpu`` or ``tiny_cpu.yaml``); one-line ConfigError listing the examples when it is neither.

    Args:
        given: a YAML path, or the name of a shipped example.
    """
    path = Path(given)
    if path.exists():
        return path
    example = EXAMPLES_DIR / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if path.parent == Path(".") and example.is_file():
        return example
    raise ConfigError(f"config error: cannot read {given}: no such file, and not the name of a shipped example "
                      f"config ({', '.join(example_names())}; e.g. hybrid-attention train tiny_cpu)")
