"""Which config fields a ``--resume`` may change: the one table of safe and binding fields.

A binding field changes the function the model computes or the token stream it sees; a resume must keep the value
in the run's ``config.yaml``, or it is refused. A safe field changes how long, how fast or how verbosely the run goes
on; a changed one is applied and listed in one note. A field in neither table counts as binding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybrid_attention.config.schema import ConfigError, read_yaml_mapping, to_dict

# model.*: the architecture and the mixers' options (e.g. another Interdomain readout with the same parameter shapes
# is another model); data.*: what the text is, how it is split, tokenized and packed; train.seed and
# train.batch_size: the order and grouping of the training rows that the saved data position refers to.
BINDING: frozenset[str] = frozenset({
    "model.preset", "model.layers", "model.options",
    "data.source", "data.paths", "data.prose_sources", "data.hf_name", "data.hf_config", "data.hf_split",
    "data.text_field", "data.local_suffixes", "data.val_fraction", "data.max_bytes", "data.tokenizer",
    "data.bpe_vocab_size", "data.seq_len", "data.pack",
    "train.seed", "train.batch_size",
})

# how long, how fast, how often and where the run reports; the optimizer settings (a changed optim.lr is applied
# from the resumed step on, training/trainer.py: _apply_configured_lr)
SAFE: frozenset[str] = frozenset({
    "data.val_tokens",
    "optim.lr", "optim.min_lr_ratio", "optim.warmup_steps", "optim.weight_decay", "optim.beta1", "optim.beta2",
    "optim.eps", "optim.grad_clip", "optim.extend_schedule",
    "train.out_dir", "train.steps", "train.grad_accum", "train.device", "train.precision", "train.compile",
    "train.compile_mode", "train.compile_scope", "train.tf32", "train.checkpointing", "train.parallel",
    "train.eval_every", "train.log_every", "train.checkpoint_every", "train.keep_checkpoints", "train.max_nonfinite",
    "train.progress", "train.progress_every_s", "train.save_final", "train.plots", "train.tensorboard", "train.wandb",
})


def _fields(doc: dict) -> dict[str, Any]:
    """``{"section.field": value}`` of a config document (two levels; deeper values compare as a whole)."""
    out = {}
    for section, body in doc.items():
        if isinstance(body, dict):
            for name, value in body.items():
                out[f"{section}.{name}"] = value
        else:
            out[str(section)] = body
    return out


def resume_changes(saved: dict, new: dict) -> tuple[list[str], list[str]]:
    """(binding changes, safe changes) between a run's saved config document and the new one, each as
    ``"key: old -> new"``; a field absent from ``saved`` compares as absent (None)."""
    old_f, new_f = _fields(saved), _fields(new)
    binding, safe = [], []
    for key in sorted(set(old_f) | set(new_f)):
        a, b = old_f.get(key), new_f.get(key)
        if a == b:
            continue
        (safe if key in SAFE else binding).append(f"{key}: {a!r} -> {b!r}")
    return binding, safe


def saved_config(config_path: Path, checkpoints: list[Path]) -> tuple[dict | None, Path]:
    """(the config a run's checkpoints were written with, where it was read): the ``config`` that the newest
    checkpoint's ``trainer_state.json`` holds, else the run's ``config.yaml``; (None, config_path) when neither
    exists. Reads only."""
    for ckpt in reversed(checkpoints):
        try:
            doc = json.loads((ckpt / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue  # a damaged checkpoint: the resume itself reports it
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            return doc["config"], ckpt / "trainer_state.json"
        break  # a checkpoint written without its config: config.yaml tells
    if config_path.exists():
        return read_yaml_mapping(config_path), config_path
    return None, config_path


def check_resume_config(config_path: Path, cfg: Any, checkpoints: list[Path] = ()) -> str | None:
    """Refuse (ConfigError, one line listing the differing fields) a resume whose binding fields differ from the
    config the run's ``checkpoints`` were written with (:func:`saved_config`); otherwise the note listing the changed
    safe fields, or None. Reads only."""
    saved, source = saved_config(config_path, list(checkpoints))
    if saved is None:
        return None
    binding, safe = resume_changes(saved, to_dict(cfg))
    if binding:
        raise ConfigError(f"config error: --resume of {config_path.parent} with fields that change the model or its "
                          f"data: {'; '.join(binding)}; resume with the run's values (in {source}) or start "
                          "a new train.out_dir")
    if safe:
        return "note: resuming with changed settings: " + "; ".join(safe)
    return None
