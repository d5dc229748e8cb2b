"""lm-evaluation-harness on our checkpoints (optional ``eval`` extra: ``pip install 'hybrid_attention[eval]'``),
from Python (:func:`run_lm_eval`) or lm-eval's own command line (:func:`main`), with a small offline toy task."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from hybrid_attention.errors import DataError

TOY_TASK = "hybrid_toy_mc"
_TASK_DIR = Path(__file__).parent / "lm_eval_tasks"

_TOY_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: question
doc_to_choice: choices
doc_to_target: answer
target_delimiter: ""
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


class LMEvalMissing(ImportError):
    """lm-eval (with its ``hf`` extra) is not installed."""


class LMEvalTaskError(DataError):
    """A task that lm-eval does not know, or whose data cannot be loaded (one line naming ``--tasks``)."""


def _import_lm_eval():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise LMEvalMissing(f"lm-eval is not installed ({e}); pip install 'hybrid_attention[eval]'") from e
    return lm_eval, HFLM, TaskManager


def toy_task_dir(where: Path | None = None) -> Path:
    """A directory holding the toy task's YAML (pointing at the bundled JSONL); pass it as ``include_path``.

    The toy task (``hybrid_toy_mc``) is a small offline multiple-choice task of Python-flavoured completions that
    ships with the package; its YAML is written here at run time so that it points at the bundled JSONL file by
    absolute path. ``where``: the directory to write to (None: a new temporary directory).
    """
    where = Path(where or tempfile.mkdtemp(prefix="hybrid_lm_eval_"))
    where.mkdir(parents=True, exist_ok=True)
    data = (_TASK_DIR / "toy_mc.jsonl").resolve()
    (where / f"{TOY_TASK}.yaml").write_text(_TOY_YAML.format(task=TOY_TASK, data=data))
    return where


def run_lm_eval(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[str] = (TOY_TASK,),
    include_path: str | Path | None = None,
    batch_size: int = 8,
    limit: int | None = None,
    device: str = "cpu",
) -> dict:
    """``lm_eval.simple_evaluate`` on a loaded model; returns lm-eval's ``results`` dict (metrics per task).

    Registers the ``hybrid_attention`` model type first (``import hybrid_attention``), then wraps ``model`` and
    ``tokenizer`` in lm-eval's ``HFLM``. ``tasks``: lm-eval task names or YAML files (the toy task by default);
    ``include_path``: a directory of further task YAMLs; ``batch_size``, ``limit`` (examples per task, None: all) and
    ``device`` go to lm-eval.
    """
    import hybrid_attention  # noqa: F401  (registers the model type)

    lm_eval, HFLM, TaskManager = _import_lm_eval()
    paths = [str(toy_task_dir())]
    if include_path:
        paths.append(str(include_path))
    manager = TaskManager(include_path=paths)
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not manager.match_tasks([t]) and not Path(t).is_file()]
    if unknown:
        raise LMEvalTaskError(f"--tasks: lm-eval has no task {', '.join(unknown)} (its list: lm-eval ls tasks; "
                              f"the bundled offline task: {TOY_TASK}; your own YAMLs: --include-path DIR)")
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=device)
    try:
        out = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), limit=limit, task_manager=manager)
    except OSError as e:  # datasets' ConnectionError offline or without a network, a data file that is missing
        raise LMEvalTaskError(f"--tasks {' '.join(tasks)}: the task data could not be loaded ({e}); lm-eval reads it "
                              "from the Hugging Face Hub or its local cache (HF_DATASETS_OFFLINE=1 needs it cached)"
                              ) from e
    return out["results"]


def main() -> None:
    """lm-eval's command line, with our model type registered and the toy task on the include path.

    ``python -m hybrid_attention.evaluation.lm_eval_adapter --model hf --model_args pretrained=<run>/final ...``:
    lm-eval's own ``cli_evaluate`` after the registration (``import hybrid_attention``), as fla does.
    """
    import sys

    import hybrid_attention  # noqa: F401

    _import_lm_eval()
    from lm_eval.__main__ import cli_evaluate

    if "--include_path" not in sys.argv:
        sys.argv += ["--include_path", str(toy_task_dir())]
    cli_evaluate()


if __name__ == "__main__":
    main()
