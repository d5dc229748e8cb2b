"""The training run's configuration: four sections, validated up front, saved resolved as ``config.yaml``.

```yaml
model: {preset: tiny, layers: interdomain, options: {hidden_size: 128}}   # options: any HybridConfig field
data:  {source: stdlib, tokenizer: byte, seq_len: 256}                    # see hybrid_attention.data.DataConfig
optim: {lr: 3.0e-3, warmup_steps: 100, weight_decay: 0.1, grad_clip: 1.0}
train: {out_dir: runs/tiny, steps: 1000, batch_size: 16, grad_accum: 1}
```
Overrides on the command line: ``train.steps=200 model.layers=[softmax,s4d]`` (values are YAML).
"""

from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import yaml

from hybrid_attention.data.config import DataConfig
from hybrid_attention.models import PRESETS, HybridConfig, HybridForCausalLM

from .examples import config_path
from .schema import ConfigError, from_dict, merge, parse_overrides, read_yaml_mapping, to_dict


@dataclass
class ModelSection:
    """A HybridConfig preset, its mixers and further HybridConfig fields. ``vocab_size`` follows the tokenizer unless
    it is set in ``options``."""

    preset: str = "tiny"
    layers: str | list[str] = "interdomain"
    options: dict = field(default_factory=dict)


@dataclass
class OptimSection:
    """AdamW (with the SSM parameter group) and the warmup + cosine schedule."""

    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio at the last step
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still logged)
    # a resumed run with more train.steps than its checkpoint's schedule: that schedule runs to its end, then
    # "constant" holds its final lr, "cosine" re-warms to lr over warmup_steps and decays again (training/schedule.py)
    extend_schedule: Literal["constant", "cosine"] = "constant"


@dataclass
class WandbSection:
    """``train.wandb``: a Weights & Biases run that gets the same scalars as TensorBoard (training/wandb_tracker.py;
    needs the wandb package: the `train` extra). Its files go to ``<out_dir>/wandb/``.

    ``mode``: ``offline`` (records the run on disk; ``wandb sync <out_dir>/wandb/offline-run-*`` uploads it later,
    no network or login needed), ``online`` or ``disabled``; unset: the ``WANDB_MODE`` environment variable, else
    ``offline``."""

    project: str = "hybrid_attention"
    entity: str | None = None
    name: str | None = None  # the run's display name (default: the name of train.out_dir)
    group: str | None = None
    tags: list[str] = field(default_factory=list)
    notes: str | None = None
    mode: Literal["offline", "online", "disabled"] | None = None


# train.compile_scope's values; training/compile.py derives COMPILE_SCOPES from it
CompileScope = Literal["model", "blocks"]


@dataclass
class TrainSection:
    """The loop: batch sizes, devices, logging, checkpoints."""

    out_dir: str = "runs/default"
    steps: int = 1000
    batch_size: int = 16  # global: sequences per optimizer step over all processes and accumulation steps
    grad_accum: int = 1
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA, fp32 on CPU
    compile: bool = False
    # torch.compile mode when compile is on. "reduce-overhead": the compiled forward and backward replay as CUDA graphs
    # (one launch per graph instead of ~1500 per step for the `small` s4d model, whose step was host-bound on the
    # H200: 50.1 ms with 27.2 ms of kernels, ``bench train``); CUDA and one process only.
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = "default"
    # what torch.compile compiles (training/compile.py): "blocks" each decoder block and the loss (regional
    # compilation: one graph per distinct block, reused for every layer), "model" one region. DECISION: "blocks", the
    # same speed at a fraction of the compile time (H200, `bench train`, one run: transformer-340m 4x4096 157.9k vs
    # 159.7k tok/s, warm-up 4.0 vs 41.6 s; `small` x6 16x2048 0.94-0.98x of "model", warm-up 5-13 vs 16-86 s).
    compile_scope: CompileScope = "blocks"
    tf32: bool = True  # CUDA: float32 matmuls outside autocast on TF32 tensor cores (device.set_tf32)
    checkpointing: bool = False  # activation checkpointing of every decoder block (recomputed in the backward)
    parallel: Literal["ddp", "fsdp2"] = "ddp"  # used when launched with torchrun (WORLD_SIZE > 1)
    eval_every: int = 200  # 0: only at the end
    log_every: int = 10
    checkpoint_every: int = 200  # 0: only at the end
    keep_checkpoints: int = 3
    max_nonfinite: int = 5  # stop after this many consecutive steps with a NaN/Inf loss or gradient
    progress: bool = True
    progress_every_s: float = 30.0  # stderr not a terminal (a log file): one progress line per this many seconds
    save_final: bool = True  # HF-format model + tokenizer in out_dir/final
    plots: bool = True
    # loss, validation ppl, lr, gradient norm, tokens/s and NAtS-L softmax shares as TensorBoard events in
    # out_dir/tensorboard (training/tracking.py; needs the tensorboard package: the `train` extra)
    tensorboard: bool = False
    # the same scalars in a Weights & Biases run: {project: ..., entity, name, group, tags, notes, mode}; null: off
    wandb: WandbSection | None = None


@dataclass
class RunConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimSection = field(default_factory=OptimSection)
    train: TrainSection = field(default_factory=TrainSection)


_POSITIVE = ("data.seq_len", "data.bpe_vocab_size", "data.val_tokens", "train.steps", "train.batch_size",
             "train.grad_accum", "train.keep_checkpoints", "train.max_nonfinite", "train.log_every",
             "train.progress_every_s", "optim.lr")
_NON_NEGATIVE = ("optim.warmup_steps", "optim.weight_decay", "optim.grad_clip", "train.eval_every",
                 "train.checkpoint_every", "optim.min_lr_ratio", "optim.eps")


def _get(cfg: RunConfig, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def check(cfg: RunConfig, training: bool = True) -> RunConfig:
    """Value checks that types cannot express; raises ConfigError naming the key.

    Args:
        cfg: the configuration to check.
        training: also check what only a training run needs (``check_training_needs``); False for the config of a
            finished run that is read to load its model.
    """
    for key in _POSITIVE:
        if _get(cfg, key) <= 0:
            raise ConfigError(f"config error: {key} = {_get(cfg, key)!r} must be > 0")
    for key in _NON_NEGATIVE:
        if _get(cfg, key) < 0:
            raise ConfigError(f"config error: {key} = {_get(cfg, key)!r} must be >= 0")
    if not 0 < cfg.data.val_fraction < 1:
        raise ConfigError(f"config error: data.val_fraction = {cfg.data.val_fraction!r} must be in (0, 1)")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(cfg.optim, key) < 1:
            raise ConfigError(f"config error: optim.{key} = {getattr(cfg.optim, key)!r} must be in [0, 1)")
    if cfg.optim.min_lr_ratio > 1:
        raise ConfigError(f"config error: optim.min_lr_ratio = {cfg.optim.min_lr_ratio!r} must be in [0, 1]")
    if cfg.train.batch_size % cfg.train.grad_accum:
        raise ConfigError(f"config error: train.batch_size = {cfg.train.batch_size} is not divisible by "
                          f"train.grad_accum = {cfg.train.grad_accum}")
    check_model(cfg.model)
    if training:
        check_training_needs(cfg)
    return cfg


def check_training_needs(cfg: RunConfig) -> None:
    """What only training reads: the tracking packages it writes to (``train.tensorboard``) and the tokenizer
    directory it copies (``data.tokenizer``). A finished run holds its own tokenizer and reads no tracker, so loading
    it (eval, generate, info) skips these."""
    if cfg.data.tokenizer not in ("byte", "bpe") and not Path(cfg.data.tokenizer).is_dir():
        raise ConfigError(f"config error: data.tokenizer = {cfg.data.tokenizer!r} is not allowed; allowed values: "
                          "byte, bpe, or an existing tokenizer directory")
    if cfg.train.tensorboard:
        check_tensorboard()
    if cfg.train.wandb is not None:
        check_wandb()


TENSORBOARD_INSTALL = "pip install 'hybrid_attention[train]' (or pip install tensorboard)"


def check_tensorboard() -> None:
    """ConfigError naming ``train.tensorboard`` when the ``tensorboard`` package is not installed."""
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise ConfigError("config error: train.tensorboard = true needs the tensorboard package: "
                          f"{TENSORBOARD_INSTALL}") from None


WANDB_INSTALL = "pip install 'hybrid_attention[train]' (or pip install wandb)"


def check_wandb() -> None:
    """ConfigError naming ``train.wandb`` when the ``wandb`` package is not installed."""
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ConfigError(f"config error: train.wandb is set but the wandb package is not installed: {WANDB_INSTALL}; "
                          "or set train.wandb=null") from None


def model_config(section: ModelSection, vocab_size: int | None = None):
    """The HybridConfig of a model section (``vocab_size`` from the tokenizer unless set in options)."""
    if section.preset not in PRESETS:
        raise ConfigError(f"config error: model.preset = {section.preset!r} is not allowed; allowed values: "
                          + ", ".join(sorted(PRESETS)))
    _check_options(section.options)
    kwargs = dict(section.options)
    if vocab_size is not None:
        kwargs.setdefault("vocab_size", vocab_size)
    try:
        return HybridConfig.from_preset(section.preset, layers=section.layers, **kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"config error: model: {e}") from e


def _hybrid_config_fields() -> list[str]:
    params = inspect.signature(HybridConfig.__init__).parameters.values()
    return [p.name for p in params if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]


def _check_finite(value: Any, key: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"config error: {key} = {value!r} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}[{i}]")


def _check_options(options: dict) -> None:
    """``model.options`` holds HybridConfig fields only (HybridConfig itself would keep an unknown name as an unused
    attribute), with finite numbers. Mixer options are checked by HybridConfig against the layers' arguments."""
    allowed = _hybrid_config_fields()
    for key in options:
        if key not in allowed:
            raise ConfigError(f"config error: unknown key 'model.options.{key}'; allowed keys in 'model.options': "
                              + ", ".join(allowed))
    _check_finite(options, "model.options")


def check_model(section: ModelSection) -> None:
    """Build the model on the meta device (no memory, no compute) so that layer-level errors surface up front."""
    cfg = model_config(section)
    try:
        with torch.device("meta"):
            HybridForCausalLM(cfg)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise ConfigError(f"config error: model: {e}") from e


def load_config(path: str | os.PathLike | None, overrides: list[str] = (), training: bool = True) -> RunConfig:
    """Read a YAML file (or start from defaults when ``path`` is None), apply overrides, validate.

    Args:
        path: the YAML file (or the name of a shipped example config, ``config/examples.py``), or None for the
            defaults.
        overrides: ``key=value`` strings (values are YAML).
        training: check what only training needs too (see :func:`check`); False to read a finished run's config.
    """
    data = read_yaml_mapping(config_path(path)) if path is not None else {}
    data = merge(data, parse_overrides(list(overrides)))
    return check(from_dict(RunConfig, data), training=training)


def save_config(cfg: RunConfig, path: str | os.PathLike) -> None:
    """The resolved configuration as YAML (loadable by :func:`load_config`), written to a temporary file and
    renamed into place, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    os.replace(tmp, path)
