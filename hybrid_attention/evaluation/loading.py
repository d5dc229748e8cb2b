"""Load a trained model, its tokenizer and (when there is one) its run configuration from a directory.

Accepted paths: a run directory (``final/`` is preferred, else the newest checkpoint), a checkpoint directory
(``<run>/checkpoints/step-…``) or any Hugging Face model directory saved by ``save_pretrained``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from hybrid_attention.data.errors import DataError
from hybrid_attention.data.tokenizer import BYTE_VOCAB_SIZE, byte_tokenizer, load_tokenizer


@dataclass
class LoadedModel:
    """A model in eval mode, its tokenizer, the run config (None for a bare HF dir) and the directory it came from."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    run_config: object | None
    source: Path


@contextlib.contextmanager
def _quiet_hf():
    """No transformers progress bars while loading (they clutter the CLI output)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _find_tokenizer(*dirs: Path | None) -> PreTrainedTokenizerBase | None:
    for d in dirs:
        if d is not None and (d / "tokenizer_config.json").exists():
            return load_tokenizer(d)
    return None


def load_model(path: str | Path, device: str | torch.device = "cpu") -> LoadedModel:
    """Load for evaluation. Raises DataError with the path when nothing loadable is there."""
    import hybrid_attention  # noqa: F401  (registers the model type with the Auto classes)
    from hybrid_attention.models import HybridForCausalLM
    from hybrid_attention.training.checkpoint import latest_checkpoint
    from hybrid_attention.training.config import load_config, model_config

    path = Path(path)
    if not path.exists():
        raise DataError(f"no such checkpoint or run directory: {path}")
    run_dir: Path | None = None
    if (path / "config.yaml").exists():
        run_dir = path
    elif path.parent.name == "checkpoints" and (path.parent.parent / "config.yaml").exists():
        run_dir = path.parent.parent
    elif (path.parent / "config.yaml").exists():  # <run>/final
        run_dir = path.parent
    run_cfg = load_config(run_dir / "config.yaml") if run_dir is not None else None

    if (path / "config.json").exists():
        with _quiet_hf():
            model, source = HybridForCausalLM.from_pretrained(str(path)), path
    elif run_dir is not None and (run_dir / "final" / "config.json").exists() and path == run_dir:
        with _quiet_hf():
            model, source = HybridForCausalLM.from_pretrained(str(run_dir / "final")), run_dir / "final"
    else:
        ckpt = path if (path / "model.safetensors").exists() else latest_checkpoint(path / "checkpoints")
        if ckpt is None or run_cfg is None:
            raise DataError(f"{path} holds no model: expected config.json, final/ or checkpoints/step-*")
        from safetensors.torch import load_file

        tok = _find_tokenizer(run_dir / "tokenizer")
        model = HybridForCausalLM(model_config(run_cfg.model, vocab_size=len(tok) if tok else None))
        model.load_state_dict(load_file(str(ckpt / "model.safetensors")))
        source = ckpt
    extra = (run_dir / "tokenizer", run_dir / "final") if run_dir is not None else ()
    tok = _find_tokenizer(source, path, *extra)
    if tok is None:
        if model.config.vocab_size != BYTE_VOCAB_SIZE:
            raise DataError(f"no tokenizer found next to {path} (vocab {model.config.vocab_size})")
        tok = byte_tokenizer()
    model.to(device).eval()
    return LoadedModel(model, tok, run_cfg, source)
