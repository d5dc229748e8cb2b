"""A Weights & Biases run of a training run (``train.wandb``): the tracked scalars, in ``<out_dir>/wandb/``.

Offline by default: the run is recorded on disk with no network and no login (``wandb sync`` uploads it later); the
mode comes from ``train.wandb.mode``, else the ``WANDB_MODE`` environment variable, else ``offline``. The W&B run id is
kept in ``<out_dir>/wandb/run_id``, so a ``--resume`` continues the same W&B run.
"""

from __future__ import annotations

import os
import secrets
import shutil
import string
from pathlib import Path
from typing import Any

from hybrid_attention.config.run_config import WandbSection, check_wandb
from hybrid_attention.config.schema import ConfigError

WANDB_DIR = "wandb"  # in the run folder
RUN_ID_FILE = "run_id"  # in WANDB_DIR: the W&B run id that a resume continues
MODES = ("offline", "online", "disabled")
LOGIN_TIMEOUT_S = 30.0


def wandb_mode(section: WandbSection) -> str:
    """The mode of the W&B run: ``train.wandb.mode``, else ``WANDB_MODE`` (one of :data:`MODES`), else offline;
    ConfigError for another ``WANDB_MODE``."""
    if section.mode is not None:
        return section.mode
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    if not env:
        return "offline"
    if env not in MODES:
        raise ConfigError(f"config error: train.wandb: the environment variable WANDB_MODE = {env!r} is not allowed; "
                          f"allowed values: {', '.join(MODES)} (or set train.wandb.mode)")
    return env


def new_run_id(length: int = 8) -> str:
    """A fresh W&B run id: ``length`` random lowercase letters and digits (the form W&B gives its own ids)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length))


def _remove_new(folder: Path, before: set[Path] | None) -> None:
    """Remove what appeared in ``folder`` since its listing ``before`` (None: the folder itself was new)."""
    if before is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for p in set(folder.iterdir()) - before if folder.is_dir() else ():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class WandbTracker:
    """One W&B run: :meth:`log` sends scalars at a step, :meth:`close` finishes the run.

    Args:
        section: the ``train.wandb`` settings.
        out_dir: the run folder; W&B writes into ``out_dir/wandb/``.
        config: the resolved run config (a dict), recorded as the W&B run's config.
        resume: continue the W&B run whose id ``out_dir/wandb/run_id`` holds (a new run when there is none).
    """

    def __init__(self, section: WandbSection, out_dir: Path, config: dict[str, Any], resume: bool = False):
        check_wandb()
        import wandb

        mode = wandb_mode(section)
        folder = Path(out_dir) / WANDB_DIR
        before = set(folder.iterdir()) if folder.is_dir() else None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            id_file = folder / RUN_ID_FILE
            run_id = id_file.read_text().strip() if resume and id_file.is_file() else ""
            if not run_id:
                run_id = new_run_id()
                tmp = id_file.with_name(f".{RUN_ID_FILE}.tmp")
                tmp.write_text(run_id + "\n")
                os.replace(tmp, id_file)
            # console "off": W&B does not wrap stdout / stderr (the progress bar and error lines stay as they are);
            # online without a stored key, W&B's login prompt gives up after LOGIN_TIMEOUT_S (then one error line)
            self.run = wandb.init(project=section.project, entity=section.entity,
                                  name=section.name or Path(out_dir).resolve().name, group=section.group,
                                  tags=list(section.tags) or None, notes=section.notes, config=config,
                                  dir=str(Path(out_dir)), id=run_id, resume="allow", mode=mode,
                                  settings=wandb.Settings(console="off", disable_git=True,
                                                           login_timeout=LOGIN_TIMEOUT_S), reinit="create_new")
        except BaseException as e:
            _remove_new(folder, before)  # a run that cannot start its W&B run leaves no W&B files
            if isinstance(e, (wandb.errors.Error, OSError, TimeoutError)):
                raise ConfigError(f"config error: train.wandb: W&B could not start a run in {mode} mode: "
                                  f"{_one_line(e)}; train.wandb.mode=offline needs no network or login") from e
            raise
        self.run_id, self.mode = run_id, mode

    def log(self, scalars: dict[str, float], step: int) -> None:
        """Send ``scalars`` ({tag: value}) at training step ``step``."""
        if scalars:
            self.run.log(scalars, step=step)

    def close(self, failed: bool = False) -> None:
        """Finish the run (``failed``: marked as crashed, exit code 1); idempotent."""
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None
