"""The ``hybrid-attention`` command: demo, train, eval, generate, info, bench; user errors end as one ``error: ...``
line in :func:`main`.

    hybrid-attention demo [--minutes 10] [--device auto|cpu|cuda] [--out runs/demo]
    hybrid-attention train CONFIG.yaml [key=value ...] [--resume]
    hybrid-attention eval {ppl,length,mqar,passkey,ruler,lm-eval} ...
    hybrid-attention generate --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] ...
    hybrid-attention info DIR
    hybrid-attention compare RUN_DIR RUN_DIR ... [--tokens N] [--out DIR]
    hybrid-attention bench ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path


class CLIError(ValueError):
    """A bad command-line argument; the message is one line naming the flag."""


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (not the usage block) and raised, so that :func:`main` reports them."""

    def error(self, message: str):
        raise CLIError(f"{self.prog}: {message}")


def _number(kind: type, low: float | None = None, high: float | None = None, low_open: bool = False):
    """An argparse ``type``: a finite ``kind`` in [low, high] (``low_open``: low excluded)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(f"must be {'>' if low_open else '>='} {low:g}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


POSITIVE_INT = _number(int, 1)
MAX_NEW_TOKENS = 65536  # generate --max-new-tokens ceiling, equal to evaluation.generation.MAX_NEW_TOKENS (tested);
# not imported from there because the parser is built without importing torch
NON_NEGATIVE_INT = _number(int, 0)
POSITIVE_FLOAT = _number(float, 0, low_open=True)
FINITE_FLOAT = _number(float)
FRACTION = _number(float, 0, 1)
TOP_P = _number(float, 0, 1, low_open=True)


def _cuda_missing() -> bool:
    import torch

    return not torch.cuda.is_available()


def _check_args(a: argparse.Namespace) -> None:
    """Checks that need more than one argument, or the machine, before any work starts."""
    if getattr(a, "device", None) == "cuda" and _cuda_missing():
        raise CLIError("--device cuda: CUDA is not available on this machine; use --device cpu")
    if a.command == "eval" and a.task == "passkey" and not a.synthetic and not a.checkpoint:
        raise CLIError("eval passkey needs --checkpoint DIR (or --synthetic for train-and-evaluate)")
    if a.command == "generate" and not a.greedy and a.temperature <= 0:
        raise CLIError(f"--temperature {a.temperature:g}: must be > 0 for sampling (or pass --greedy)")


def _cmd_demo(a: argparse.Namespace) -> int:
    from hybrid_attention.training.demo import DemoOptions, run_demo

    opts = DemoOptions(minutes=a.minutes, device=a.device, out=a.out, mixers=tuple(a.mixers) if a.mixers else None,
                       seq_len=a.seq_len, batch_size=a.batch_size, preset=a.preset)
    res = run_demo(opts)
    print()
    print(f"demo: {len(res['rows'])} models, each trained for an equal share of the time budget (steps and training "
          "tokens in the table)")
    print(res["table"])
    print(f"\nplots and runs in {a.out}/ (length_sweep.png, train_loss.png, <mixer>/loss.png ...)")
    print(f"\nsample from the best model ({res['best']}):\n{'-' * 60}\n{res['sample']}\n{'-' * 60}")
    print(f"demo wall time: {res['seconds']:.0f} s")
    return 0


def _cmd_train(a: argparse.Namespace) -> int:
    from hybrid_attention.config.run_config import load_config
    from hybrid_attention.training.trainer import train

    cfg = load_config(a.config, a.overrides)
    if cfg.train.device == "cuda" and _cuda_missing():
        given = next((o for o in reversed(a.overrides) if o.replace(" ", "").startswith("train.device=")), None)
        where = given or f"train.device: cuda in {a.config}"
        raise CLIError(f"{where}: CUDA is not available on this machine; use train.device=cpu")
    try:
        res = train(cfg, resume=a.resume)
    except KeyboardInterrupt:
        from hybrid_attention.rank_errors import claim_error_report

        if claim_error_report():  # under torchrun every rank is interrupted: the first one reports
            print(_interrupted_line(a, Path(cfg.train.out_dir)), file=sys.stderr)
        return 130
    v = res.val
    main_rank = os.environ.get("RANK", "0") == "0"  # under torchrun every rank returns the result: rank 0 prints it
    if v is not None and res.out_dir is not None and main_rank:
        bpb = f", {v.bpb:.4f} bits/byte" if v.bpb is not None else ""
        print(f"done: {res.steps} steps, validation loss {v.loss:.4f}, ppl {v.ppl:.3f}{bpb}; run in {res.out_dir}")
    return 0


def _interrupted_line(a: argparse.Namespace, out_dir: Path) -> str:
    """The one line of a training run stopped by Ctrl-C: the last checkpoint on disk and the command that resumes."""
    import shlex

    from hybrid_attention.checkpoints.step_checkpoints import CheckpointError, latest_checkpoint

    try:
        last = latest_checkpoint(out_dir / "checkpoints")
    except CheckpointError:
        last = None
    saved = f"the last saved checkpoint is {last.name} (step {int(last.name.split('-')[1])})" if last else \
        "no checkpoint was saved"
    args = ["hybrid-attention", "train", *([a.config] if a.config else []), *a.overrides, "--resume"]
    return f"interrupted: {saved} in {out_dir}; resume with: {shlex.join(args)}"


def _val_tokens(loaded, tokens: int | None):
    from hybrid_attention.data.config import DataConfig
    from hybrid_attention.data.lm_data import validation_tokens

    data_cfg = loaded.run_config.data if loaded.run_config is not None else DataConfig()
    if tokens:
        data_cfg.val_tokens = tokens
    return validation_tokens(data_cfg, loaded.tokenizer), data_cfg


def _check_writable_folder(flag: str, folder: Path) -> None:
    """CLIError naming ``flag`` unless a file can be created in ``folder`` (or, when it does not exist yet, in its
    nearest existing parent, where it will be created); checked before any work, so that a long evaluation does not
    end in an unwritable folder. Nothing is left on disk (the probe file is removed, no folder is created)."""
    import tempfile

    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise CLIError(f"{flag} {folder}: {existing} is not a folder")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-check-"):
            pass
    except OSError as e:
        raise CLIError(f"{flag} {folder}: not writable ({e.strerror or e})") from e


def _cmd_eval(a: argparse.Namespace) -> int:
    from hybrid_attention.device import resolve_device

    if a.task == "mqar" or (a.task == "passkey" and a.synthetic):
        return _eval_recall(a)
    from hybrid_attention.data.tokenizer import token_byte_lengths
    from hybrid_attention.evaluation.loading import load_model

    if a.task in ("length", "lm-eval", "passkey", "ruler") and a.out:
        _check_writable_folder("--out", Path(a.out))
    if a.task == "ruler":
        a.tasks = _ruler_tasks(a.tasks)
    if a.task == "ppl" and a.tokens and a.seq_len and a.tokens < a.seq_len:
        raise CLIError(f"--seq-len {a.seq_len}: longer than --tokens {a.tokens}; one window needs --tokens >= "
                       "--seq-len")
    device = resolve_device(a.device)
    loaded = load_model(a.checkpoint, device)
    if a.task == "ppl":
        from hybrid_attention.evaluation.perplexity import evaluate_lm

        tokens, data_cfg = _val_tokens(loaded, a.tokens)
        seq_len, scored = a.seq_len or data_cfg.seq_len, min(len(tokens), a.tokens or data_cfg.val_tokens)
        if scored < seq_len:
            raise CLIError(f"--seq-len {seq_len}: longer than the {scored:,} validation tokens to score; pass a "
                           "shorter --seq-len or more --tokens")
        s = evaluate_lm(loaded.model, tokens, a.seq_len or data_cfg.seq_len, device=device,
                        byte_lengths=token_byte_lengths(loaded.tokenizer), max_tokens=a.tokens or data_cfg.val_tokens)
        bpb = f", bits/byte {s.bpb:.4f}" if s.bpb is not None else ""
        print(json.dumps(s.as_dict()) if a.json else
              f"validation loss {s.loss:.4f}, ppl {s.ppl:.3f}{bpb} ({s.tokens:,} tokens, windows of {s.seq_len})")
    elif a.task == "length":
        from hybrid_attention.evaluation.length_sweep import length_sweep, length_table, plot_length_sweep

        tokens, data_cfg = _val_tokens(loaded, None)
        base = a.seq_len or data_cfg.seq_len
        rows = length_sweep(loaded.model, tokens, base, a.multipliers, max_tokens=a.tokens, device=device,
                            byte_lengths=token_byte_lengths(loaded.tokenizer))
        print(length_table(rows))
        _write_plot(a, plot_length_sweep, {str(Path(a.checkpoint).name): rows},
                    _results_folder(a, loaded) / "length_sweep.png", "perplexity vs context length")
    elif a.task == "passkey":
        from hybrid_attention.evaluation.checkpoint_plots import plot_passkey
        from hybrid_attention.evaluation.passkey import passkey_accuracy, passkey_table

        try:
            rows = passkey_accuracy(loaded.model, loaded.tokenizer, a.lengths, a.depths, a.trials, device)
        except ValueError as e:  # a length shorter than the bare prompt
            raise CLIError(f"--lengths: {e}") from e
        print(passkey_table(rows))
        _write_plot(a, plot_passkey, rows, _results_folder(a, loaded) / "passkey.png",
                    f"passkey retrieval: {Path(a.checkpoint).name}")
    elif a.task == "ruler":
        _eval_ruler(a, loaded, device)
    elif a.task == "lm-eval":
        import re

        from hybrid_attention.evaluation.lm_eval_adapter import run_lm_eval

        res = run_lm_eval(loaded.model, loaded.tokenizer, a.tasks, a.include_path, a.batch_size, a.limit, str(device))
        print(json.dumps(res, indent=1, default=str))
        name = "lm_eval_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", "+".join(a.tasks))[:100] + ".json"
        _save_json(a, _results_folder(a, loaded), name,
                   {"tasks": a.tasks, "limit": a.limit, "checkpoint": str(a.checkpoint), "results": res})
    return 0


def _results_folder(a: argparse.Namespace, loaded) -> Path:
    """Where ``eval`` and ``info --plot`` write their plots and results: ``--out``, else the run folder of the model
    (the one holding its config.yaml, where ``train`` writes its plots), else the model folder itself (a bare Hugging
    Face folder). One rule for every command, whichever folder of the run ``--checkpoint`` names."""
    return Path(a.out) if a.out else (loaded.run_dir or loaded.source)


def _ruler_tasks(tasks: list[str] | None) -> list[str]:
    """``eval ruler --tasks``: the names given (each once, in order), or every task; CLIError for an unknown name."""
    from hybrid_attention.data.ruler import TASKS

    unknown = [t for t in tasks or [] if t not in TASKS]
    if unknown:
        raise CLIError(f"--tasks {' '.join(unknown)}: not a RULER task; allowed values: {', '.join(TASKS)}")
    return list(dict.fromkeys(tasks)) if tasks else list(TASKS)


def _eval_ruler(a: argparse.Namespace, loaded, device) -> None:
    """``eval ruler``: the samples (all sized before the model runs), the scores, ``ruler.json`` and ``ruler.png``."""
    from hybrid_attention.data.tokenizer import is_byte_tokenizer
    from hybrid_attention.evaluation.checkpoint_plots import plot_ruler
    from hybrid_attention.evaluation.generation import position_limit
    from hybrid_attention.evaluation.ruler import build_samples, evaluate_ruler, load_haystack, ruler_table

    lengths = sorted(set(a.lengths))
    haystack = load_haystack(a.corpus, max(lengths))
    try:
        samples = build_samples(loaded.tokenizer, a.tasks, lengths, a.samples, haystack, a.seed, a.max_new_tokens)
    except ValueError as e:
        raise CLIError(f"--lengths: {e}; raise the length or leave those tasks out of --tasks") from e
    limit = position_limit(loaded.model)
    if limit is not None and max(lengths) > limit:
        print(f"note: lengths above the model's max_position_embeddings ({limit:,}) test it beyond its configured "
              "positions", file=sys.stderr)
    res = evaluate_ruler(loaded.model, loaded.tokenizer, samples, device,
                         log=lambda line: print(line, file=sys.stderr))
    print(ruler_table(res))
    doc = {"checkpoint": str(a.checkpoint), "tasks": list(a.tasks), "lengths": lengths, "samples": a.samples,
           "seed": a.seed, "haystack": haystack.source,
           "tokenizer": {"tokens": len(loaded.tokenizer), "byte_level": is_byte_tokenizer(loaded.tokenizer)},
           "metric": "string_match_all: the fraction of a sample's expected answers in its greedy generation",
           **res}
    folder = _results_folder(a, loaded)
    _save_json(a, folder, "ruler.json", doc)
    _write_plot(a, plot_ruler, res, folder / "ruler.png", f"RULER: {Path(a.checkpoint).name}")


def _write_plot(a: argparse.Namespace, plot, data, png: Path, title: str) -> None:
    """``plot(data, png, title)``; with --out a failure is an error, next to the model only a note (the printed
    table is the result, a read-only model folder only loses the plot; the exit status stays 0). The plot is drawn
    into a partial file renamed when complete and removed on failure, so no half-written plot is left."""
    partial = png.with_name(f".{png.stem}.partial{png.suffix}")
    try:
        plot(data, partial, title)
        os.replace(partial, png)
    except OSError as e:
        with contextlib.suppress(OSError):
            partial.unlink()
        if a.out:
            raise CLIError(f"--out {a.out}: cannot write {png.name} ({e.strerror or e})") from e
        print(f"note: plot not written: cannot write {png} ({e.strerror or e}); pass --out DIR to save it elsewhere",
              file=sys.stderr)
    else:
        print(f"plot: {png}")


def _save_json(a: argparse.Namespace, folder: Path, name: str, doc: dict) -> None:
    """``doc`` as ``name`` in ``folder`` (:func:`_results_folder`), written whole or not at all; an unwritable model
    folder only loses the file (a note), an unwritable --out is an error."""
    import tempfile

    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=f".{name}.", delete=False) as f:
            tmp = f.name
            json.dump(doc, f, indent=1, default=str)
        os.replace(tmp, folder / name)
    except OSError as e:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if a.out:
            raise CLIError(f"--out {a.out}: cannot write {name} ({e.strerror or e})") from e
        print(f"note: results not saved: cannot write {folder / name} ({e.strerror or e}); pass --out DIR",
              file=sys.stderr)
        return
    print(f"results: {folder / name}")


def _eval_recall(a: argparse.Namespace) -> int:
    from hybrid_attention.config.schema import from_dict, merge, parse_overrides, read_yaml_mapping
    from hybrid_attention.evaluation.recall import recall_table
    from hybrid_attention.training.recall import RecallConfig, recall_sweep

    data = read_yaml_mapping(a.config) if a.config else {}
    data = merge(data, parse_overrides(a.overrides))
    if a.task == "passkey":
        data["task"] = "passkey"
    cfg = from_dict(RecallConfig, data)
    if cfg.device == "cuda" and _cuda_missing():
        given = next((o for o in reversed(a.overrides) if o.replace(" ", "").startswith("device=")), None)
        raise CLIError(f"{given or f'device: cuda in {a.config}'}: CUDA is not available on this machine; "
                       "use device=cpu")
    rows = recall_sweep(cfg, log=print)
    print(recall_table(rows))
    print(f"results and plot in {cfg.out_dir}/")
    return 0


def _cmd_generate(a: argparse.Namespace) -> int:
    from hybrid_attention.device import resolve_device
    from hybrid_attention.evaluation.generation import (
        PromptError,
        check_prompt,
        generate_text,
        max_new_tokens_allowed,
        position_limit,
        prompt_ids,
    )
    from hybrid_attention.evaluation.loading import load_model

    try:
        check_prompt(a.prompt)
    except PromptError as e:
        raise CLIError(f"--prompt: {e}") from None
    device = resolve_device(a.device)
    loaded = load_model(a.checkpoint, device)
    n_prompt = len(prompt_ids(loaded.tokenizer, a.prompt))
    allowed = max_new_tokens_allowed(loaded.model, n_prompt)
    if allowed < 1:
        raise CLIError(f"--prompt: {n_prompt} tokens (with the separator) fill the model's position limit "
                       f"(max_position_embeddings {position_limit(loaded.model)}); shorten the prompt")
    if a.max_new_tokens > allowed:
        raise CLIError(f"--max-new-tokens {a.max_new_tokens}: at most {allowed} for this model and prompt "
                       f"(max_position_embeddings {position_limit(loaded.model)} minus the prompt's {n_prompt} tokens)")

    def write(piece: str) -> None:  # every piece as soon as it is final, so a long generation shows progress
        sys.stdout.write(piece)
        sys.stdout.flush()

    if hasattr(sys.stdout, "reconfigure"):  # a terminal or pipe that cannot show a character gets an escape for it
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        write(a.prompt)
        generate_text(loaded.model, loaded.tokenizer, a.prompt, a.max_new_tokens, not a.greedy, a.temperature,
                      a.top_k, a.top_p, a.seed, device, stream=write)
        write("\n")
    except BrokenPipeError:
        # the reader closed the pipe (``generate ... | head``): it has what it wanted, so generation stops quietly;
        # stdout goes to /dev/null so that the interpreter's final flush does not fail a second time
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _cmd_info(a: argparse.Namespace) -> int:
    from hybrid_attention.data.corpus import stdlib_root
    from hybrid_attention.evaluation.info import format_info, model_info
    from hybrid_attention.evaluation.loading import load_model

    loaded = load_model(a.dir, "cpu")
    sample = (stdlib_root() / "functools.py").read_text(encoding="utf-8")
    info = model_info(loaded.model, loaded.tokenizer, a.seq_lens, sample_text=sample)
    info["verified"] = loaded.verified
    print(json.dumps(info) if a.json else f"{loaded.source}\n{format_info(info)}")
    if a.plot:
        from hybrid_attention.evaluation.checkpoint_plots import plot_routing

        if not info["routing"]:
            raise CLIError(f"info --plot: {a.dir} has no NAtS-L layer, so there is no routing to plot")
        _write_plot(a, plot_routing, info["routing"], _results_folder(a, loaded) / "routing.png",
                    f"{Path(a.dir).name}: NAtS-L softmax fraction (functools.py sample)")
    return 0


def _cmd_compare(a: argparse.Namespace) -> int:
    from hybrid_attention.experiments.compare import compare_runs

    _check_writable_folder("--out", Path(a.out))
    res = compare_runs(a.runs, a.out, tokens=a.tokens, plots=not a.no_plots)
    if a.json:
        print(json.dumps({k: res[k] for k in ("tokens", "state_len", "rows")}))
        return 0
    print(f"{len(res['rows'])} runs at {res['tokens']:,} training tokens"
          + (" (the largest count at which every run has a validation result)" if a.tokens is None else ""))
    print(res["table"])
    print(f"table, compare.json{' and plots' if not a.no_plots else ''} in {a.out}/")
    return 0


def _benchmarks_checkout() -> Path | None:
    """The repository checkout whose ``benchmarks/`` ``bench`` runs: the clone this package is installed from (an
    editable install), else the working directory; None when neither holds one."""
    import hybrid_attention

    for root in (Path(hybrid_attention.__file__).resolve().parents[1], Path.cwd()):
        if (root / "benchmarks" / "__init__.py").is_file():
            return root
    return None


def _bench_argv(a: argparse.Namespace) -> list[str]:
    """The command line of ``a`` again (``bench TARGET [--only ...] [flags]``)."""
    flags = [f"--{name}" for name in ("quick", "sweep", "dryrun", "debug") if getattr(a, name, False)]
    return ["bench", a.target, *(["--only", *a.only] if a.only else []), *flags]


def _bench_under_interpreter(a: argparse.Namespace, root: Path) -> int:
    """Run the same ``bench`` command in a new Python process with ``TRITON_INTERPRET=1`` and return its exit status.

    Triton reads that variable when a kernel is defined, and ``import hybrid_attention`` (which runs before any
    command) has defined them all, so it cannot be switched on in this process."""
    import subprocess

    import hybrid_attention

    paths = [str(Path(hybrid_attention.__file__).resolve().parents[1]), str(root), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run([sys.executable, "-m", "hybrid_attention.cli", *_bench_argv(a)], env=env).returncode


def _cmd_bench(a: argparse.Namespace) -> int:
    import importlib.util

    root = _benchmarks_checkout()  # the benchmarks live in the repository, not in the installed package
    if root is None:
        raise CLIError("bench: needs the benchmarks/ folder of a repository checkout: run it in the root folder of a "
                       "clone, or install the package from a clone (pip install -e .)")
    if str(root) not in sys.path:  # a console script's sys.path holds neither the clone nor the working directory
        sys.path.insert(0, str(root))
    from benchmarks import run_target, section_names

    try:  # a bad --only name first: the message lists the allowed sections
        section_names(a.target, a.only)
    except ValueError as e:
        raise CLIError(str(e)) from e
    if _cuda_missing() and not a.dryrun:
        raise CLIError(f"bench {a.target}: needs a CUDA GPU and none is visible; --dryrun runs it at tiny shapes "
                       "on the CPU (a smoke test of the benchmark code, not a measurement)")
    if a.dryrun and importlib.util.find_spec("triton") is None:
        raise CLIError(f"bench {a.target} --dryrun: needs the triton package (its interpreter runs the kernels on the "
                       "CPU): pip install triton (or the `test` / `gpu` extra)")
    if a.dryrun and os.environ.get("TRITON_INTERPRET") != "1":  # the dry run's CPU tensors need the interpreter
        return _bench_under_interpreter(a, root)
    argv = (["--quick"] if a.quick else []) + (["--sweep"] if a.sweep else []) + (["--dryrun"] if a.dryrun else [])
    failed = run_target(a.target, a.only, argv)
    if failed:
        print(f"error: bench {a.target}: {len(failed)} section(s) failed: {', '.join(failed)} (their errors are "
              "printed above)", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hybrid-attention", description="Train and evaluate long-context token mixers.")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error instead of one line")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="small models of every mixer on the embedded corpus, sized to a time budget")
    d.add_argument("--minutes", type=POSITIVE_FLOAT, default=10.0, help="total time budget (default 10)")
    d.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    d.add_argument("--out", default="runs/demo", help="output directory (its per-mixer runs are replaced)")
    d.add_argument("--mixers", nargs="+", help="subset of mixers (default: all available)")
    d.add_argument("--preset", help="model preset (default tiny on CPU, small on CUDA)")
    d.add_argument("--seq-len", type=POSITIVE_INT, help="training length (default 256 on CPU, 1024 on CUDA)")
    d.add_argument("--batch-size", type=POSITIVE_INT, help="sequences per step (default 8 on CPU, 32 on CUDA)")
    d.set_defaults(func=_cmd_demo)

    t = sub.add_parser("train", help="train from a YAML config")
    from hybrid_attention.config.examples import example_names

    t.add_argument("config", help="YAML config, or the name of a shipped example: " + ", ".join(example_names())
                   + " (configs/ in a clone)")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.steps=100 model.layers=softmax")
    t.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in train.out_dir")
    t.set_defaults(func=_cmd_train)

    e = sub.add_parser("eval", help="evaluate a checkpoint or run a recall sweep")
    es = e.add_subparsers(dest="task", required=True)

    def with_ckpt(q: argparse.ArgumentParser) -> argparse.ArgumentParser:
        q.add_argument("--checkpoint", required=True, help="run directory, checkpoint directory or HF model directory")
        q.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
        return q

    q = with_ckpt(es.add_parser("ppl", help="validation perplexity and bits per byte"))
    q.add_argument("--seq-len", type=POSITIVE_INT, help="window length (default: the run's training length)")
    q.add_argument("--tokens", type=POSITIVE_INT,
                   help="validation tokens to score (default: the run's data.val_tokens)")
    q.add_argument("--json", action="store_true")
    q = with_ckpt(es.add_parser("length", help="perplexity at multiples of the training length: table + PNG"))
    q.add_argument("--seq-len", type=POSITIVE_INT, help="training length (default: the run's)")
    q.add_argument("--multipliers", type=POSITIVE_INT, nargs="+", default=[1, 2, 4, 8])
    q.add_argument("--tokens", type=POSITIVE_INT, default=65536, help="tokens scored at every length")
    q.add_argument("--out", help="directory for length_sweep.png (default: the run folder of the model)")
    for name, helptext in (("mqar", "train-and-evaluate MQAR over mixers (zoology-style)"),
                           ("passkey", "passkey retrieval of a checkpoint (or --synthetic train-and-evaluate)")):
        q = es.add_parser(name, help=helptext)
        q.add_argument("--config", help="YAML sweep config (e.g. configs/mqar_cpu.yaml)")
        q.add_argument("overrides", nargs="*", help="key=value overrides, e.g. mixers=[softmax,s4d] seq_len=128")
        if name == "passkey":
            q.add_argument("--synthetic", action="store_true", help="train-and-evaluate on synthetic passkey tokens")
            q.add_argument("--checkpoint", help="run directory or HF model directory")
            q.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
            q.add_argument("--lengths", type=POSITIVE_INT, nargs="+", default=[256, 512, 1024])
            q.add_argument("--depths", type=FRACTION, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
            q.add_argument("--trials", type=POSITIVE_INT, default=4)
            q.add_argument("--out", help="folder of passkey.png for --checkpoint (default: the run folder of the "
                           "model)")
    q = with_ckpt(es.add_parser("ruler", help="RULER's synthetic long-context tasks, offline: results JSON + PNG"))
    q.add_argument("--tasks", nargs="+", default=None,
                   help="niah_single_1..3, niah_multikey_1..3, niah_multivalue, niah_multiquery, vt, cwe "
                        "(default: all)")
    q.add_argument("--lengths", type=POSITIVE_INT, nargs="+", default=[2048, 4096, 8192],
                   help="context lengths in the model's tokens, prompt and answer budget (default 2048 4096 8192)")
    q.add_argument("--samples", type=POSITIVE_INT, default=20, help="samples per task and length (default 20)")
    q.add_argument("--seed", type=int, default=0, help="the seed the samples derive from (default 0)")
    q.add_argument("--corpus", nargs="+", metavar="PATH",
                   help="haystack files or folders (default: the embedded standard-library corpus)")
    q.add_argument("--max-new-tokens", type=POSITIVE_INT,
                   help="answer budget per sample (default: RULER's per task, or twice the answer's tokens if more)")
    q.add_argument("--out", help="folder of ruler.json and ruler.png (default: the run folder of the model)")
    q = with_ckpt(es.add_parser("lm-eval", help="lm-evaluation-harness tasks (needs the eval extra)"))
    q.add_argument("--tasks", nargs="+", default=["hybrid_toy_mc"], help="default: the bundled offline toy task")
    q.add_argument("--include-path", help="directory of extra task YAMLs")
    q.add_argument("--batch-size", type=POSITIVE_INT, default=8)
    q.add_argument("--limit", type=POSITIVE_INT)
    q.add_argument("--out", help="folder of lm_eval_<tasks>.json (default: the run folder of the model)")
    e.set_defaults(func=_cmd_eval)

    g = with_ckpt(sub.add_parser("generate", help="sample text from a checkpoint"))
    g.add_argument("--prompt", default="", help="text to continue")
    g.add_argument("--max-new-tokens", type=_number(int, 1, MAX_NEW_TOKENS), default=200,
                   help=f"at most {MAX_NEW_TOKENS} and at most the model's max_position_embeddings minus the prompt")
    g.add_argument("--temperature", type=FINITE_FLOAT, default=0.8, help="> 0 (sampling)")
    g.add_argument("--top-k", type=NON_NEGATIVE_INT, default=50, help="0: no top-k filter")
    g.add_argument("--top-p", type=TOP_P, default=0.95, help="in (0, 1]")
    g.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(func=_cmd_generate)

    i = sub.add_parser("info", help="parameters, state size, NAtS-L softmax fractions")
    i.add_argument("dir", help="run directory, checkpoint directory or HF model directory")
    i.add_argument("--seq-lens", type=POSITIVE_INT, nargs="+", default=[1024, 4096, 16384])
    i.add_argument("--json", action="store_true")
    i.add_argument("--plot", action="store_true", help="also write routing.png: NAtS-L softmax fraction per layer "
                   "and head")
    i.add_argument("--out", help="folder of routing.png (default: the run folder of the model)")
    i.set_defaults(func=_cmd_info)

    c = sub.add_parser("compare", help="training runs side by side at equal training tokens: one table, one plot set")
    c.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders (train.out_dir of each run)")
    c.add_argument("--tokens", type=POSITIVE_INT,
                   help="training tokens to compare at (default: the largest count every run validated at)")
    c.add_argument("--out", default="runs/compare", help="folder of table.txt, compare.json and the plots "
                   "(default runs/compare)")
    c.add_argument("--no-plots", action="store_true", help="only the table and compare.json")
    c.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    c.set_defaults(func=_cmd_compare)

    b = sub.add_parser("bench", help="GPU benchmarks: correctness vs the references + timings (benchmarks/NOTES.md)")
    b.add_argument("target", choices=["ops", "models", "inference", "train"],
                   help="op-level kernels, whole models (inference = models), or training speed")
    b.add_argument("--only", nargs="+",
                   help="sections: ops: interdomain natsl s4d_bilinear; models: models; train: train")
    b.add_argument("--quick", action="store_true", help="fewer lengths, no launch-config sweep")
    b.add_argument("--sweep", action="store_true", help="also sweep launch configurations where a section has one")
    b.add_argument("--dryrun", action="store_true",
                   help="tiny shapes on the CPU (Triton interpreter: needs triton): a smoke test of the code, not a "
                        "measurement; no JSON unless OUT is set; without it, bench needs a CUDA GPU")
    b.set_defaults(func=_cmd_bench)
    from hybrid_attention.experiments.cli import add_parser as add_experiment_parser

    add_experiment_parser(sub)  # hybrid-attention experiment SUITE.yaml [key=value ...]
    _add_debug_everywhere(p)
    return p


def _add_debug_everywhere(parser: argparse.ArgumentParser) -> None:
    """``--debug`` after the subcommand too (SUPPRESS: a subcommand does not reset the global flag)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sp in action.choices.values():
                if not any("--debug" in a.option_strings for a in sp._actions):
                    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
                _add_debug_everywhere(sp)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hybrid-attention`` script; returns the exit status. Every user error ends here as one
    ``error: ...`` line on stderr (status 2; 1 for a diverged training run); ``--debug`` re-raises it instead. Under
    torchrun the first rank to fail reports, once (``rank_errors``).

    User errors (bad arguments, bad config, missing data, diverged training) exit with status 2
    (arguments/configuration/data) or 1 (training stopped); ``--debug`` may stand anywhere on the command line.
    """
    from hybrid_attention.config.schema import ConfigError
    from hybrid_attention.errors import DataError
    from hybrid_attention.rank_errors import claim_error_report, world_rank

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv

    def report(e: BaseException, status: int) -> int:  # under torchrun: the first failing rank's line, once
        if claim_error_report():
            print(f"error: {_one_line(e)}", file=sys.stderr)
        return status

    try:
        args = build_parser().parse_args(argv)
        debug = bool(getattr(args, "debug", False))
        _check_args(args)
        return args.func(args)
    except (CLIError, ConfigError, DataError) as e:
        if debug:
            raise
        return report(e, 2)
    except KeyboardInterrupt:  # Ctrl-C outside a training run (which reports its own line): one line, status 130
        if debug:
            raise
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        if isinstance(e, ImportError) and type(e).__name__ == "LMEvalMissing":
            return report(e, 2)
        if isinstance(e, RuntimeError) and type(e).__name__ == "TrainingDiverged":
            return report(e, 1)
        if isinstance(e, RuntimeError) and "CUDA is not available" in str(e):  # a device set in a file that the
            return report(e, 2)  # checks above do not read
        world, rank = world_rank()
        if world > 1 and not claim_error_report():  # another rank failed first and reported; this is the aftermath
            print(f"error: rank {rank} stopped after another rank's error ({type(e).__name__})", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
