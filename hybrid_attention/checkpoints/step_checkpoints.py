"""Training checkpoints without pickle: tensors in safetensors, everything else in JSON, written atomically
(``save_checkpoint``) and verified on load (``read_checkpoint``, ``newest_intact``)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybrid_attention.checkpoints.model_folder import admit, check_folder, refuse_links

from .integrity import (
    CheckpointDamaged,
    CheckpointError,
    CheckpointMismatch,
    NonFiniteState,
    delete_tree,
    first_nonfinite,
    publish_folder,
    verify_manifest,
)

__all__ = [
    "CheckpointData", "CheckpointDamaged", "CheckpointError", "CheckpointMismatch", "NonFiniteState",
    "checkpoint_dirs", "latest_checkpoint", "load_checkpoint", "newest_intact", "read_checkpoint",
    "read_model_tensors", "read_trainer_state", "save_checkpoint", "saved_vocab_size", "vocab_size_of",
]

REQUIRED_FILES = ("model.safetensors", "optimizer.safetensors", "trainer_state.json", "rng-rank0.safetensors")

_STEP_DIR = re.compile(r"^step-(\d+)$")
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


LINK_REFUSAL = ("a run's checkpoints are never loaded, rotated or deleted through a link; replace it with the "
                "folder itself")


def _refuse_links(root: Path) -> None:
    """CheckpointError (one line) when ``root`` or anything under it is a symbolic link: loading, rotating or deleting
    through it would reach outside the run folder (another run's step read as this run's, or another run's
    checkpoints rotated away). The check is :func:`.model_folder.refuse_links` with no scope."""
    refuse_links(root, None, LINK_REFUSAL, CheckpointError)


def checkpoint_dirs(root: Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first; CheckpointError when ``root`` is or holds a symbolic link
    (:func:`_refuse_links`)."""
    _refuse_links(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    dirs = checkpoint_dirs(root)
    return dirs[-1] if dirs else None


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors sharing storage (tied weights): copy the second and later aliases."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for k, v in state.items():
        v = v.detach()
        key = (v.untyped_storage().data_ptr(), v.storage_offset())
        out[k] = v.clone().contiguous() if key in seen else v.contiguous()
        seen.add(key)
    return out


def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensor states, JSON states) of every random generator the training loop may touch."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    py = random.getstate()
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return tensors, {"python": [py[0], list(py[1]), py[2]], "numpy": [name, keys.tolist(), pos, has_gauss, gauss]}


def set_rng_state(tensors: dict[str, torch.Tensor], js: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    if torch.cuda.is_available():
        cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
        if cuda:
            torch.cuda.set_rng_state_all(cuda)
    v, keys, gauss = js["python"]
    random.setstate((v, tuple(keys), gauss))
    name, keys, pos, has_gauss, gauss = js["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))


def one_line(e: BaseException) -> str:
    """An exception as one short line (OSError: its strerror and errno; others: their message, whitespace folded)."""
    if isinstance(e, OSError) and e.strerror:
        import errno as _errno

        code = _errno.errorcode.get(e.errno, str(e.errno)) if e.errno else ""
        return f"{e.strerror}" + (f" ({code})" if code else "")
    return " ".join(str(e).split()) or type(e).__name__


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    keep: int,
    rank: int = 0,
    barrier: Callable[[], None] = lambda: None,
    gather: Callable[[Any], list[Any] | None] = lambda obj: [obj],
    check_finite: bool = True,
) -> Path:
    """Write checkpoint ``step`` (collective under torch.distributed: every rank must call it). Returns its path.

    ``state`` holds JSON-able trainer state (scheduler, data position, counters). ``gather(obj)`` returns every rank's
    ``obj`` in rank order on rank 0 (``DistContext.gather_to_main``); ``barrier`` holds every rank until the checkpoint
    is in place. Rank 0 alone touches the disk: it receives the ranks' RNG states and writes every file, so an
    interrupt on any rank leaves no file of another rank behind.

    Raises NonFiniteState (nothing written; rank 0 checks, so under torch.distributed check collectively first, as
    the trainer does) and CheckpointError for an I/O error (the partial directory is removed, older checkpoints stay).

    Layout of ``<out_dir>/checkpoints/step-00000100/``::

        model.safetensors        full (unsharded) model state dict
        optimizer.safetensors    optimizer state tensors, keys "<param fqn>/<name>" (e.g. "lm_head.weight/exp_avg")
        rng-rank<r>.safetensors  torch CPU (and CUDA) generator states of rank r
        trainer_state.json       step, optimizer param groups, scheduler, data position, counters, Python/NumPy RNG
        manifest.json            size and sha256 of every file above (written last; see ``integrity``)

    Writing: everything goes into ``.tmp-step-…`` (each file fsynced), the manifest last (tmp + fsync + ``os.replace``),
    then the directory is renamed with ``os.replace``, so a crash or ``kill -9`` never leaves a half-written ``step-…``
    directory, and an exception or Ctrl-C anywhere in between removes ``.tmp-step-…``; leftovers of a killed process
    are removed on the next save. A checkpoint holding a NaN/inf tensor is never written (:class:`NonFiniteState`).
    An I/O error (disk full, ...) raises one :class:`CheckpointError` line; the earlier checkpoints are untouched. The
    last ``keep`` checkpoints are kept (only once the new one is complete).
    """
    final = root / f"step-{step:08d}"
    model_sd = get_model_state_dict(model, options=_FULL)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=_FULL)
    rng_tensors, rng_json = rng_state()
    ranks_rng = gather(rng_tensors)
    if rank == 0:
        assert ranks_rng is not None, "gather returns every rank's object on rank 0"
        model_t = _unshared(model_sd)
        optim_t = {f"{fqn}/{name}": torch.as_tensor(v).contiguous()
                   for fqn, s in optim_sd["state"].items() for name, v in s.items()}
        if check_finite:
            for label, tensors in (("model", model_t), ("optimizer state", optim_t)):
                bad = first_nonfinite(tensors)
                if bad is not None:
                    raise NonFiniteState(f"step {step}: {bad[1]} non-finite value(s) in {label} tensor {bad[0]}; "
                                         f"checkpoint {final.name} was not written")
        groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in optim_sd["param_groups"]]
        files: dict[str, dict[str, torch.Tensor]] = {"model.safetensors": model_t, "optimizer.safetensors": optim_t}
        for r, tensors in enumerate(ranks_rng):
            files[f"rng-rank{r}.safetensors"] = {k: v.contiguous() for k, v in tensors.items()}
        _commit(root, final, files, {"step": step, "param_groups": groups, "rng": rng_json, **state})
        for old in checkpoint_dirs(root)[:-keep] if keep > 0 else []:
            if old != final:
                _remove(old)
    barrier()
    return final


def _commit(root: Path, final: Path, files: dict[str, dict[str, torch.Tensor]], doc: dict[str, Any]) -> None:
    """Publish ``files`` and ``trainer_state.json`` as folder ``final`` (:func:`.integrity.publish_folder`), after
    removing the leftovers of killed saves; OSError and SafetensorError become one CheckpointError line."""
    _refuse_links(root)

    def fill(tmp: Path) -> None:
        for name, tensors in files.items():
            save_file(tensors, str(tmp / name))
            _fsync_file(tmp / name)
        with open(tmp / "trainer_state.json", "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())

    try:
        root.mkdir(parents=True, exist_ok=True)
        for old in [*root.glob(".tmp-step-*"), *root.glob(".old-step-*")]:
            shutil.rmtree(old, ignore_errors=True)
        publish_folder(final, fill, kind="checkpoint", step=doc["step"])
    except (OSError, SafetensorError) as e:
        raise _write_error(root, final, e) from e


def _remove(path: Path) -> None:
    """Delete checkpoint ``path``: renamed to a hidden name first (atomic), so a kill mid-delete leaves no half
    checkpoint."""
    gone = path.with_name(f".old-{path.name}")
    os.replace(path, gone)
    delete_tree(gone)


def _write_error(root: Path, final: Path, e: BaseException) -> CheckpointError:
    prev = [p for p in checkpoint_dirs(root) if p != final]
    kept = f"; the previous checkpoint {prev[-1]} is intact" if prev else "; no earlier checkpoint exists"
    return CheckpointError(f"could not write checkpoint {final.name} in {root}: {one_line(e)}; the partial "
                           f"checkpoint was removed{kept}")


@dataclass
class CheckpointData:
    """A checkpoint read into memory and checked (nothing applied yet)."""

    path: Path
    doc: dict[str, Any]
    model: dict[str, torch.Tensor]
    optimizer: dict[str, dict[str, torch.Tensor]]
    rng: dict[str, torch.Tensor]
    verified: bool  # False: no manifest (an older checkpoint), sizes/checksums not checked

    @property
    def step(self) -> int:
        return int(self.doc["step"])


def _read_tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path / name))
    except FileNotFoundError as e:
        raise CheckpointDamaged(path, name, "missing") from e
    except (OSError, SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointDamaged(path, name, f"not a readable safetensors file ({one_line(e)})") from e


def _check_finite(path: Path, name: str, tensors: dict[str, torch.Tensor]) -> None:
    bad = first_nonfinite(tensors)
    if bad is not None:
        raise CheckpointDamaged(path, name, f"{bad[1]} non-finite value(s) (NaN/inf) in {bad[0]}")


def read_model_tensors(path: Path) -> tuple[dict[str, torch.Tensor], bool]:
    """(model state dict, verified) of a checkpoint directory: manifest entry of model.safetensors, parse, finiteness.
    Only the model file is checked (evaluation does not need the optimizer)."""
    path = Path(path)
    verified = verify_manifest(path, required=("model.safetensors",), only=("model.safetensors",))
    tensors = _read_tensors(path, "model.safetensors")
    _check_finite(path, "model.safetensors", tensors)
    return tensors, verified


def read_trainer_state(path: Path) -> object:
    """The parsed ``trainer_state.json`` of checkpoint ``path`` (not checked against the manifest here: callers admit
    the folder first); CheckpointDamaged when it is missing or not JSON."""
    name = "trainer_state.json"
    try:
        return json.loads((Path(path) / name).read_text())
    except FileNotFoundError as e:
        raise CheckpointDamaged(path, name, "missing") from e
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointDamaged(path, name, f"not valid JSON ({one_line(e)})") from e


def read_checkpoint(path: Path, rank: int = 0, state_keys: Iterable[str] = (),
                    scope: Path | None = None) -> CheckpointData:
    """Admit, verify and read every file of checkpoint ``path`` (no side effects). Raises FolderRefused (the folder
    fails :func:`.model_folder.admit`: code, pickles, a link out of ``scope``, default the folder) and
    CheckpointDamaged.

    ``state_keys``: keys of ``trainer_state.json`` the caller needs besides step, param_groups and rng; ``scope``:
    the run folder the checkpoint belongs to.

    Reading (:func:`read_checkpoint`) verifies the manifest, parses every file and checks that the tensors are finite
    before anything is applied to the model; any failure is a :class:`CheckpointDamaged` naming the file and the check.
    :func:`newest_intact` walks the checkpoints newest first and returns the first intact one plus what was wrong with
    the newer ones, so a resume falls back to an older intact checkpoint.

    Checkpoints without ``manifest.json`` are loaded, with a warning: their files are still parsed and checked for
    finiteness, but bit flips inside tensor data cannot be detected (:attr:`CheckpointData.verified` is False; the
    trainer prints the warning line).
    """
    path = Path(path)
    verified = admit(path, scope, required=REQUIRED_FILES)
    name = "trainer_state.json"
    doc = read_trainer_state(path)
    missing = [k for k in ("step", "param_groups", "rng", *state_keys) if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise CheckpointDamaged(path, name, "no " + ", ".join(missing))
    model_sd = _read_tensors(path, "model.safetensors")
    _check_finite(path, "model.safetensors", model_sd)
    flat = _read_tensors(path, "optimizer.safetensors")
    _check_finite(path, "optimizer.safetensors", flat)
    optim: dict[str, dict[str, torch.Tensor]] = {}
    for key, v in flat.items():
        if "/" not in key:
            raise CheckpointDamaged(path, "optimizer.safetensors", f"unexpected key {key!r}")
        fqn, n = key.rsplit("/", 1)
        optim.setdefault(fqn, {})[n] = v
    rng_name = f"rng-rank{rank}.safetensors"
    if not (path / rng_name).exists():
        rng_name = "rng-rank0.safetensors"
    rng = _read_tensors(path, rng_name)
    saved = rng_state()
    try:  # a dry run: the generator states must be accepted (restored right after)
        set_rng_state(rng, doc["rng"])
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as e:
        raise CheckpointDamaged(path, f"{rng_name} / {name}", f"random generator state rejected ({one_line(e)})") \
            from e
    finally:
        set_rng_state(*saved)
    return CheckpointData(path, doc, model_sd, optim, rng, verified)


EMBEDDING_KEYS = ("embeddings.weight", "embed_tokens.weight")


def vocab_size_of(state: dict[str, torch.Tensor]) -> int | None:
    """Rows of the token embedding in a model state dict (None when there is none)."""
    for k, v in state.items():
        if k.endswith(EMBEDDING_KEYS) and v.dim() == 2:
            return int(v.shape[0])
    return None


def saved_vocab_size(path: Path, scope: Path | None = None) -> int | None:
    """Rows of the token embedding in checkpoint ``path``'s ``model.safetensors``, read from the file's header alone
    (no tensor data); None when the file cannot be read (the full read, :func:`read_checkpoint`, reports why). The
    folder passes :func:`hybrid_attention.checkpoints.model_folder.check_folder` (``scope``: the run folder) first."""
    check_folder(path, scope)
    try:
        with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
            for k in f.keys():
                shape = f.get_slice(k).get_shape()
                if k.endswith(EMBEDDING_KEYS) and len(shape) == 2:
                    return int(shape[0])
    except (OSError, SafetensorError, ValueError, RuntimeError):
        return None
    return None


def check_fits(data_path: Path, tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """CheckpointMismatch (one line) when the checkpoint's model tensors do not match ``model``'s keys and shapes."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in tensors.items()}
    ckpt_vocab, model_vocab = vocab_size_of(tensors), getattr(getattr(model, "config", None), "vocab_size", None)
    if ckpt_vocab is not None and model_vocab is not None and ckpt_vocab != model_vocab:
        raise CheckpointMismatch(f"{data_path} was trained with vocab_size {ckpt_vocab} but the model built for it "
                                 f"has vocab_size {model_vocab} (a different tokenizer?)")
    missing = sorted(set(expected) - set(got))
    unexpected = sorted(set(got) - set(expected))
    shapes = [f"{k} {got[k]} vs {expected[k]}" for k in sorted(set(got) & set(expected)) if got[k] != expected[k]]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s) (e.g. {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s) (e.g. {unexpected[0]})")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es) (e.g. {shapes[0]})")
    if problems:
        raise CheckpointMismatch(f"{data_path} does not fit the model built from the config: " + "; ".join(problems)
                                 + " (was the model config changed?)")


def apply_checkpoint(data: CheckpointData, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Load ``data`` into model, optimizer and this process's RNG; returns the JSON trainer state."""
    check_fits(data.path, data.model, model)
    set_model_state_dict(model, data.model, options=_FULL)
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in data.doc["param_groups"]]
    try:
        set_optimizer_state_dict(model, optimizer, {"state": data.optimizer, "param_groups": groups}, options=_FULL)
    except (KeyError, ValueError, RuntimeError) as e:
        raise CheckpointMismatch(f"{data.path}: the optimizer state does not fit the optimizer built from the config "
                                 f"({one_line(e)})") from e
    set_rng_state(data.rng, data.doc["rng"])
    return data.doc


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int = 0) -> dict:
    """Verify and restore model, optimizer and this rank's RNG from ``path``; returns the JSON trainer state."""
    return apply_checkpoint(read_checkpoint(path, rank), model, optimizer)


def newest_intact(root: Path, rank: int = 0, state_keys: Iterable[str] = (),
                  reader: Callable[..., Any] | None = None,
                  scope: Path | None = None) -> tuple[Any, list[CheckpointDamaged]]:
    """(the newest checkpoint under ``root`` that reads back intact or None, the damaged newer ones, newest first).

    ``reader(path)`` defaults to :func:`read_checkpoint` (admitted with ``scope``, the run folder); evaluation passes
    :func:`read_model_tensors`. A refused folder (FolderRefused) is not damage: it ends the walk with its one line.
    """
    read = reader or (lambda p: read_checkpoint(p, rank, state_keys, scope))
    damaged: list[CheckpointDamaged] = []
    for p in reversed(checkpoint_dirs(root)):
        try:
            return read(p), damaged
        except CheckpointDamaged as e:
            damaged.append(e)
    return None, damaged


def move_aside(damaged: Iterable[CheckpointDamaged]) -> list[Path]:
    """Rename damaged checkpoints to ``damaged-step-…`` (kept for inspection, never loaded or rotated away)."""
    moved = []
    for d in damaged:
        target = d.path.with_name(f"damaged-{d.path.name}")
        i = 1
        while target.exists():
            i += 1
            target = d.path.with_name(f"damaged-{d.path.name}.{i}")
        try:
            os.replace(d.path, target)
            moved.append(target)
        except OSError:
            pass
    return moved
