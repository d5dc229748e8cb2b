"""GPU benchmarks: correctness against the float64 references plus timings, one invocation per target.

``hybrid-attention bench ops [--only interdomain natsl s4d_bilinear causal_conv] [--quick]`` runs the op-level sections,
``hybrid-attention bench models [--quick]`` the model-level ones (prefill, decode, training step). Each section
prints its table and writes a JSON file to ``$OUT`` (or the working directory; a dry run writes none without
``$OUT``) and returns its exit status (non-zero when a section raised or a check failed). Every measured version is
recorded in ``benchmarks/NOTES.md``. Without a CUDA GPU every target and its section scripts stop with one ``error:``
line before any work, unless ``--dryrun`` (``BENCH_DRYRUN=1``; the CLI runs it under the Triton interpreter,
``TRITON_INTERPRET=1``) runs them at tiny shapes as a smoke test of the benchmark code. Every script is
``main(argv)``; the environment (``BENCH_DRYRUN``, ``BENCH_BUDGET_S``, ``OUT``) is read there, as the defaults of
``--dryrun`` / ``--budget-s`` / ``--out`` (``common.bench_parser``), never at import.
``hybrid-attention bench train [--quick]``: the training-speed table (``train_speed``; JSON only with ``$OUT``).
"""

from __future__ import annotations

import importlib

__all__ = ["TARGETS", "run_target", "section_names"]

# target -> {section name: module under benchmarks exposing main(argv)}
TARGETS: dict[str, dict[str, str]] = {
    "ops": {"interdomain": "interdomain_ops", "natsl": "natsl_ops", "s4d_bilinear": "s4d_bilinear_ops",
            "causal_conv": "causal_conv"},
    "models": {"models": "models"},
    "train": {"train": "train_speed"},  # training-step tokens/s, TFLOP/s, peak memory; eager vs compiled
}
TARGETS["inference"] = TARGETS["models"]  # the name DESIGN.md uses for the whole-model benchmark


def section_names(target: str, only: list[str] | None = None) -> list[str]:
    """The sections of ``target`` to run (all, or those named in ``only``); ValueError naming the allowed ones."""
    if target not in TARGETS:
        raise ValueError(f"bench target must be one of {sorted(TARGETS)}, got {target!r}")
    sections = TARGETS[target]
    names = list(sections) if not only else only
    unknown = [n for n in names if n not in sections]
    if unknown:
        raise ValueError(f"--only for '{target}' accepts {sorted(sections)}, got {unknown}")
    return names


def run_target(target: str, only: list[str] | None = None, argv: list[str] | None = None) -> list[str]:
    """Run the sections of ``target`` ("ops", "models", "inference" or "train"), optionally only those named in
    ``only``; ``argv`` is passed to every section's ``main``. Returns the names of the sections whose ``main``
    returned a non-zero status (a section that raised or a check that failed); every section runs either way."""
    sections, failed = TARGETS[target], []
    for name in section_names(target, only):
        module = importlib.import_module(f"{__name__}.{sections[name]}")
        if module.main(list(argv or [])):
            failed.append(name)
    return failed
