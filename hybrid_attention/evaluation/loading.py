"""Load a trained model, its tokenizer and (when there is one) its run configuration from a directory
(:func:`load_model`), after checking every folder it reads; no code from a folder is ever run."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import PreTrainedTokenizerBase

from hybrid_attention.checkpoints.integrity import (
    MANIFEST,
    CheckpointDamaged,
    CheckpointError,
    CheckpointMismatch,
    first_nonfinite,
    verify_manifest,
)
from hybrid_attention.checkpoints.model_folder import (
    FolderRefused,
    admit,
    check_folder,
    run_folder,
    unverified_warning,
)
from hybrid_attention.checkpoints.step_checkpoints import (
    check_fits,
    checkpoint_dirs,
    newest_intact,
    one_line,
    read_model_tensors,
    read_trainer_state,
    vocab_size_of,
)
from hybrid_attention.config.run_config import RunConfig, check, load_config, model_config
from hybrid_attention.config.schema import ConfigError, from_dict
from hybrid_attention.data.tokenizer import BYTE_VOCAB_SIZE, byte_tokenizer, load_tokenizer
from hybrid_attention.errors import DataError
from hybrid_attention.models import HybridForCausalLM


@dataclass
class LoadedModel:
    """A model in eval mode, its tokenizer, the run config (None for a bare HF dir), the directory it came from,
    whether its weights were verified against a ``manifest.json`` (False: no manifest, bytes unchecked) and the run
    folder it belongs to (the one holding ``config.yaml``; None for a bare HF dir)."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    run_config: object | None
    source: Path
    verified: bool = False
    run_dir: Path | None = None


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


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def _manifest_kind(d: Path) -> str | None:
    if not (d / MANIFEST).is_file():  # not opened unless a regular file (a FIFO would block; admit refuses it)
        return None
    try:
        return json.loads((d / MANIFEST).read_text()).get("kind")
    except (OSError, ValueError, AttributeError):
        return None


def _is_hf_dir(d: Path) -> bool:
    return (d / "config.json").exists() or _manifest_kind(d) == "final"


def _is_checkpoint_dir(d: Path) -> bool:
    return ((d / "model.safetensors").exists() or (d / "trainer_state.json").exists()
            or _manifest_kind(d) == "checkpoint")


def _find_tokenizer(scope: Path | None, *dirs: Path | None) -> tuple[PreTrainedTokenizerBase, Path] | tuple[None, None]:
    for d in dirs:
        if d is not None and (d / "tokenizer_config.json").exists():
            try:
                return load_tokenizer(d, scope), d
            except FolderRefused:
                raise
            except DataError as e:
                raise CheckpointError(f"cannot load the tokenizer in {d}: {e}") from e
            except Exception as e:  # noqa: BLE001  (the tokenizers library raises plain Exception on a bad file)
                raise CheckpointError(f"cannot load the tokenizer in {d}: {' '.join(str(e).split())}") from e
    return None, None


def _fits_on_meta(config, got: dict[str, torch.Tensor], weights: Path, described_by: str) -> None:
    """CheckpointMismatch (one line) when the model of ``config`` has other tensors than ``got`` (the tensors, or
    their shapes as meta tensors, of ``weights``). Nothing is allocated: the layer count is compared first (building
    100,000 layers takes minutes even on the meta device), then the model is built on the meta device, so a config
    claiming e.g. vocab_size 2,000,000,000 costs no memory."""
    held = {k.split(".")[2] for k in got if k.startswith("model.layers.")}
    if held and config.num_hidden_layers != len(held):
        raise CheckpointMismatch(f"{described_by}: num_hidden_layers {config.num_hidden_layers}, but {weights} holds "
                                 f"{len(held)} layers: they do not belong together")
    with torch.device("meta"):
        model = HybridForCausalLM(config)
    got = dict(got)
    aliases: dict[int, list[str]] = {}
    for name, value in model.state_dict(keep_vars=True).items():  # tied weights are saved once
        aliases.setdefault(id(value), []).append(name)
    for names in aliases.values():
        present = next((n for n in names if n in got), None)
        for n in names if present is not None else ():
            got.setdefault(n, got[present])
    check_fits(weights, got, model)


def _header_fits_config(d: Path) -> None:
    """:func:`_fits_on_meta` for an HF folder: ``config.json`` against the header of ``model.safetensors`` (shapes
    only, no tensor data read)."""
    from safetensors import safe_open

    from hybrid_attention.models import HybridConfig

    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        got = {k: torch.empty(tuple(f.get_slice(k).get_shape()), device="meta") for k in f.keys()}
    _fits_on_meta(HybridConfig.from_pretrained(str(d)), got, d / "model.safetensors", str(d / "config.json"))


def _load_hf(d: Path, scope: Path | None):
    """(HybridForCausalLM.from_pretrained(d), verified), after :func:`admit`; every failure as one CheckpointError."""
    verified = admit(d, scope, required=("config.json", "model.safetensors"))
    try:
        _header_fits_config(d)
    except CheckpointError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError, IndexError, SafetensorError) as e:
        raise CheckpointError(f"cannot load the model in {d}: {one_line(e)}") from e
    try:
        with _quiet_hf():
            model, info = HybridForCausalLM.from_pretrained(str(d), output_loading_info=True, use_safetensors=True,
                                                            trust_remote_code=False)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError, IndexError, SafetensorError) as e:
        # AttributeError / IndexError: a config.json of the wrong shape (e.g. a sub-config given as a plain dict)
        raise CheckpointError(f"cannot load the model in {d}: {one_line(e)}") from e
    missing = list(info.get("missing_keys") or []) + [str(k) for k in info.get("mismatched_keys") or []]
    if missing:
        raise CheckpointDamaged(d, "model.safetensors", f"{len(missing)} weight(s) missing or mis-shaped "
                                                        f"(e.g. {missing[0]})")
    bad = first_nonfinite(dict(model.state_dict()))
    if bad is not None:
        raise CheckpointDamaged(d, "model.safetensors", f"{bad[1]} non-finite value(s) (NaN/inf) in {bad[0]}")
    return model, verified


def _read_checkpoint_tensors(ckpt: Path, scope: Path | None) -> tuple[Path, dict, bool]:
    """(ckpt, model tensors, verified) of an admitted checkpoint folder (read_model_tensors checks the manifest)."""
    check_folder(ckpt, scope)
    return (ckpt, *read_model_tensors(ckpt))


def _checkpoint_run_config(ckpt: Path, run_dir: Path | None) -> RunConfig:
    """The run config that checkpoint ``ckpt`` was written with (``config`` in its ``trainer_state.json``, checked
    against its manifest), for a checkpoint without the run's ``config.yaml``; DataError naming what is missing and
    what to load instead when the checkpoint holds none, CheckpointDamaged when it does not read back."""
    name = "trainer_state.json"
    verify_manifest(ckpt, only=(name,))
    doc = read_trainer_state(ckpt)
    saved = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(saved, dict):
        if run_dir is None:
            raise DataError(f"{ckpt} is a training checkpoint outside a run folder and its {name} holds no config to "
                            "build the model from: load it from its run folder (<run>/checkpoints/step-…, beside "
                            "<run>/config.yaml)")
        final = f", or load {run_dir / 'final'}" if _is_hf_dir(run_dir / "final") else ""
        raise DataError(f"{ckpt} is a training checkpoint, but {run_dir} has no config.yaml and its {name} holds no "
                        f"config to build the model from: put the run's config.yaml back{final}")
    try:
        return check(from_dict(RunConfig, saved), training=False)
    except ConfigError as e:
        raise CheckpointDamaged(ckpt, name, f"its config is not valid ({one_line(e)})") from e


def _read_checkpoint(ckpt: Path, run_dir: Path | None,
                     run_cfg: RunConfig | None) -> tuple[Path, dict, bool, RunConfig]:
    """(ckpt, model tensors, verified, run config) of an admitted checkpoint folder: ``run_cfg`` (the run's
    config.yaml) or, without one, the config saved in the checkpoint."""
    ckpt, tensors, verified = _read_checkpoint_tensors(ckpt, run_dir)
    return ckpt, tensors, verified, run_cfg if run_cfg is not None else _checkpoint_run_config(ckpt, run_dir)


def _newest_readable(run_dir: Path, read: Callable[[Path], object]) -> tuple[Path, object] | tuple[None, None]:
    """(checkpoint, ``read(checkpoint)``) of the newest checkpoint of ``run_dir`` that ``read`` accepts (a DataError
    skips to the next older one); (None, None) when none does."""
    try:
        ckpts = checkpoint_dirs(run_dir / "checkpoints")
    except DataError:  # a linked checkpoints/ folder: nothing in it is read
        ckpts = []
    for ckpt in reversed(ckpts):
        try:
            return ckpt, read(ckpt)
        except DataError:
            continue
    return None, None


def _saved_run_config(run_dir: Path) -> tuple[RunConfig | None, Path | None]:
    """(run config, its trainer_state.json) of the newest checkpoint of ``run_dir`` that holds one and reads back
    (admitted, checked against its manifest); (None, None) when none does."""

    def read(ckpt: Path) -> RunConfig:
        check_folder(ckpt, run_dir)
        return _checkpoint_run_config(ckpt, run_dir)

    ckpt, cfg = _newest_readable(run_dir, read)
    return (cfg, ckpt / "trainer_state.json") if ckpt is not None else (None, None)


def _instead(run_dir: Path, run_cfg: RunConfig | None) -> str:
    """What to load when ``run_dir/final`` is refused: its newest checkpoint that loads (each read and checked, newest
    first), or that there is none."""
    ckpt, _ = _newest_readable(run_dir, lambda p: _read_checkpoint(p, run_dir, run_cfg))
    if ckpt is not None:
        return f"; the run's newest intact checkpoint is {ckpt}: pass --checkpoint {ckpt} (info {ckpt}) to load it"
    return "; the run has no intact checkpoint to load instead" if (run_dir / "checkpoints").is_dir() else ""


def _load_checkpoint_model(ckpt: Path, run_cfg, tensors: dict, from_yaml: bool):
    config = model_config(run_cfg.model, vocab_size=vocab_size_of(tensors))
    described_by = "the run's config.yaml (model)" if from_yaml else f"{ckpt / 'trainer_state.json'} (config.model)"
    _fits_on_meta(config, tensors, ckpt, described_by)
    model = HybridForCausalLM(config)
    check_fits(ckpt, tensors, model)
    model.load_state_dict(tensors)
    return model


def check_tokenizer_fits(tok: PreTrainedTokenizerBase, tok_dir: Path | None, model, source: Path,
                         run_cfg=None) -> None:
    """CheckpointMismatch (one line, both sizes) when ``tok`` cannot belong to ``model``: more tokens than the
    embedding has rows, or (for a run whose config leaves vocab_size to the tokenizer) a different count."""
    vocab = int(model.config.vocab_size)
    follows_tokenizer = run_cfg is not None and "vocab_size" not in (run_cfg.model.options or {})
    if len(tok) > vocab or (follows_tokenizer and len(tok) != vocab):
        where = f" in {tok_dir}" if tok_dir is not None else ""
        raise CheckpointMismatch(f"the tokenizer{where} has {len(tok)} tokens but the model in {source} has "
                                 f"vocab_size {vocab}: they do not belong together")


def load_model(path: str | Path, device: str | torch.device = "cpu",
               log: Callable[[str], None] | None = None) -> LoadedModel:
    """Load for evaluation. Raises DataError with the path when nothing loadable is there (CheckpointError when
    something is there but damaged or not fitting); ``log`` gets the note / warning lines (default: stderr).

    ``path``: a run directory (``final/`` is preferred, else the newest intact checkpoint), a checkpoint directory
    (``<run>/checkpoints/step-…``) or any Hugging Face model directory saved by ``save_pretrained``. ``device``: where
    the model is moved. A run directory without ``config.yaml`` is told by its layout (``final/``, ``checkpoints/``):
    ``final/`` loads on its own, a checkpoint is built from the run config its ``trainer_state.json`` holds, and one
    note line says where the run config came from; a checkpoint holding none is one DataError naming what to restore
    or load instead. A refused or damaged ``final/`` of a run names the run's newest intact checkpoint in its line.

    Every folder read here (model, checkpoint, tokenizer) first passes
    :func:`hybrid_attention.checkpoints.model_folder.admit`: no code hooks (``auto_map``, ``*.py``), safetensors
    only, no symlink out of the run directory (or out of the folder when it is not part of a run), ``manifest.json``
    verified when present, no ``manifest.json`` or ``config.json`` of a newer version of the library
    (``NewerFormat``, or a ``config_revision`` ValueError as one CheckpointError line). No code from a folder is ever
    run (``trust_remote_code=False``, no prompt).

    Every problem is one :class:`CheckpointError` / :class:`FolderRefused` line (DataErrors, so the CLI prints
    ``error: ...``): a refused folder, a file failing its ``manifest.json`` check (size, sha256), an unreadable
    safetensors / config.json / tokenizer, missing weights, non-finite weights, or a tokenizer whose vocabulary does
    not fit the model. A folder without a manifest (a plain HF directory) is loaded without checksums, with the same
    warning line on every path (final/, HF directory, checkpoint). A run directory without ``final/`` uses its
    newest intact checkpoint and notes the damaged newer ones.
    """
    log = log or _stderr
    path = Path(path)
    if not path.exists():
        raise DataError(f"no such checkpoint or run directory: {path}")
    run_dir = run_folder(path)
    has_cfg = run_dir is not None and (run_dir / "config.yaml").exists()
    run_cfg = load_config(run_dir / "config.yaml", training=False) if has_cfg else None
    scope = run_dir  # no symlink may lead out of the run (None: out of the model folder, see default_scope)
    final = run_dir / "final" if run_dir is not None else None

    if _is_hf_dir(path) or (path == run_dir and _is_hf_dir(final)):
        source = path if _is_hf_dir(path) else final
        try:
            model, verified = _load_hf(source, scope)
        except DataError as e:
            if source == final:  # a refused or damaged final/: name the checkpoint that loads instead
                e.args = (f"{e}{_instead(run_dir, run_cfg)}",)
            raise
        if path == run_dir and run_cfg is None:
            run_cfg, where = _saved_run_config(run_dir)
            log(f"note: {run_dir} has no config.yaml: loaded {final} (model and tokenizer) with the run config "
                f"saved in {where}" if run_cfg is not None else
                f"note: {run_dir} has no config.yaml and no checkpoint holding the run config: loaded {final} on its "
                "own (model and tokenizer); evaluation uses the default data settings")
    elif _is_checkpoint_dir(path):
        from_yaml = run_cfg is not None
        _, tensors, verified, run_cfg = _read_checkpoint(path, run_dir, run_cfg)
        model, source = _load_checkpoint_model(path, run_cfg, tensors, from_yaml), path
    else:
        root = path / "checkpoints"
        if run_dir is None or not root.is_dir():
            raise DataError(f"{path} holds no model: expected config.json, final/ or checkpoints/step-*")
        check_folder(root, scope)
        found, damaged = newest_intact(root, reader=lambda p: _read_checkpoint(p, run_dir, run_cfg))
        if found is None:
            if not damaged:
                raise DataError(f"{path} holds no model: expected config.json, final/ or checkpoints/step-*")
            raise CheckpointError(f"no intact checkpoint in {root}: " + "; ".join(d.short for d in damaged))
        from_yaml = run_cfg is not None
        ckpt, tensors, verified, run_cfg = found
        if damaged:
            log(f"note: newest checkpoint damaged: {'; '.join(d.short for d in damaged)}; using {ckpt.name}")
        model, source = _load_checkpoint_model(ckpt, run_cfg, tensors, from_yaml), ckpt
    extra = (run_dir / "tokenizer", run_dir / "final") if run_dir is not None else ()
    tok, tok_dir = _find_tokenizer(scope, source, path, *extra)
    if tok is None:
        if model.config.vocab_size != BYTE_VOCAB_SIZE:
            raise DataError(f"no tokenizer found next to {path} (vocab {model.config.vocab_size})")
        tok = byte_tokenizer()
    check_tokenizer_fits(tok, tok_dir, model, source, run_cfg)
    model.to(device).eval()
    if not verified:  # after every check passed, so a refused folder prints its error line alone
        log(unverified_warning(source))
    return LoadedModel(model, tok, run_cfg, source, verified, run_dir)
