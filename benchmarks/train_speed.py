"""Training speed on the GPU: tokens/s, step time, model TFLOP/s and peak memory of a full training step.

    hybrid-attention bench train [--quick]      (or: python -m benchmarks.train_speed [options])

Rows, all in one run and one table (random weights, float32 master weights, bf16 autocast, fused AdamW):
  * every mixer of ``MIXER_BUILDERS`` (read at run time) as the ``small`` preset with all layers that mixer, at
    B×T = 16×2048 and 32×512;
  * the 340M presets ``transformer-340m``, ``gdn-340m``, ``natsl-hybrid-340m`` at B×T = 4×4096 (not with ``--quick``);
  * the long-context rows (``LONG``, not with ``--quick``): the 340M presets at 2×16384 and 1×32768, and the
    Interdomain paper's 125M pair ``softmax-125m`` / ``interdomain-125m`` plus ``s4d-125m`` at 8×2048 and 1×32768,
    by default only as ``compiled+blocks`` (``LONG_VARIANTS``; ``--variants`` picks others, e.g. the checkpointed
    ``compiled+blocks+ckpt`` where memory needs it, for both sides of a ratio).
Column ``vs base``: tokens/s over that of the row's baseline in the same run (same B×T and variant): ``softmax`` for
the small rows, ``transformer-340m`` for the 340M presets, ``softmax-125m`` for the 125M presets.
Variants per row: ``eager``, ``compiled`` (``torch.compile(model)``; a compile / run failure is caught, printed on
one line and recorded for that row only), ``compiled+graphs`` (mode "reduce-overhead": CUDA graphs), for the 340M
and long rows ``eager+ckpt``, ``compiled+ckpt`` and ``compiled+blocks+ckpt`` (``train.checkpointing``: every decoder
block under torch.utils.checkpoint), whose peak memory is the point, and for the first small shape ``eager+varlen`` and
``compiled+varlen`` (packed documents of a realistic length mix, ``VARIANTS`` below).

Step = forward (LM loss) + backward + ``AdamW(fused=True).step()`` + ``zero_grad``. ``warmup`` untimed steps (the
compiled variant compiles in the first), then ``steps`` steps timed together with CUDA events: step ms = total / steps
(``SIZES``: 3 and 10, 4 with ``--quick``).
Peak memory = ``torch.cuda.max_memory_allocated()`` over the timed steps (weights, gradients, AdamW states and
activations), GB = 2^30 bytes; ``reserved GB`` = ``torch.cuda.max_memory_reserved()`` over the same steps. Read the
reserved column for ``compiled+graphs``: there the allocated counter reads 0.24 GB for every mixer (H200),
less than the `small` model's weights + AdamW states alone, so it misses what the CUDA-graph pools hold.

FLOP model (column ``flops``): 6·N·tokens, N = parameters without the input embedding (the LM head counts), plus
3× each mixer's forward FLOPs (``benchmarks/mixer_flops.py``: the matmul-class work of its chunked algorithm, softmax
attention causal QKᵀ and PV; NAtS-L's routed softmax chunks are not counted, a lower bound) (``6N+mixers``).

Options: ``--quick`` (fewer steps, only the small presets), ``--models a b`` (row names: a mixer name for the small
rows, a 340M or 125M preset), ``--variants eager compiled compiled+blocks compiled+graphs eager+ckpt compiled+ckpt
compiled+blocks+ckpt eager+varlen compiled+varlen``, ``--shapes 1x32768 ...``, ``--profile N`` (after timing a row,
N more steps under ``torch.profiler``: kernel time vs GPU idle, launches per step and the top kernels, printed after
the table and kept in the JSON; ``benchmarks/profile_train.py``), ``--steps N``,
``--warmup N``, ``--compile-backend`` (default ``BENCH_COMPILE_BACKEND``). The soft budget ``--budget-s`` (default
``BENCH_BUDGET_S`` or ``common.DEFAULT_BUDGET_S``, 540 s) skips the remaining rows when spent (recorded as skipped);
split a full run over several invocations with ``--models``. Prints a markdown table at the end and writes
``<--out>/train_speed.json`` when ``--out`` or ``$OUT`` is set (rewritten after every row). ``--dryrun`` (or
``BENCH_DRYRUN=1``) runs it on the CPU with toy widths / lengths (compiled rows use the ``eager`` Dynamo backend
there unless ``--compile-backend`` says otherwise): a smoke test of this file, not a measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch
import torch._dynamo

from benchmarks.common import (
    BenchSettings,
    bench_parser,
    cuda_steps_ms,
    elapsed,
    exit_status,
    log,
    require_cuda,
    sync,
    training_step,
)
from benchmarks.mixer_flops import mixer_forward_flops
from hybrid_attention.device import set_tf32
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.training.compile import compile_model

__all__ = ["main", "plan", "flops_per_step"]

LARGE = ("transformer-340m", "gdn-340m", "natsl-hybrid-340m")
PAPER_125M = ("softmax-125m", "interdomain-125m", "s4d-125m")
VARIANTS = ("eager", "compiled", "compiled+blocks", "compiled+graphs", "eager+ckpt", "compiled+ckpt",
            "compiled+blocks+ckpt", "eager+varlen", "compiled+varlen")
# the long-context rows' default variant: per-block compilation, the fastest measured 340M path (H200, 4×4096, `bench
# train` rows compiled and compiled+blocks: gdn-340m 116.8k tok/s with blocks vs 92.0k whole-model, transformer-340m
# 156.7k vs 157.6k, warm-up 12–17 s vs 49–167 s)
LONG_VARIANTS = ("compiled+blocks",)
# the baseline of each row's "vs base" ratio: the softmax model of the same size
BASELINE = {**{name: "transformer-340m" for name in LARGE}, **{name: "softmax-125m" for name in PAPER_125M}}
# compiled+blocks: train.compile_scope "blocks" (training/compile.py: each decoder block and the loss compiled on
# their own, one graph per distinct block); its warm-up column holds the compile time to compare with "compiled".
# compiled+graphs: torch.compile(mode="reduce-overhead"), the forward and backward replayed as CUDA graphs
# (``train.compile_mode``); the optimizer step stays outside, as in the trainer.
# *+varlen: the same step on packed documents (``data.pack: varlen``), one row [1, B·T] cut into documents of a
# web-like length mix (log-normal, median 256 tokens, clipped to [16, T]; seed 0), on the first small shape only. It
# shows the price of states reset per document: the Triton kernels take the chunk table of the documents (no host
# read of the offsets, except NAtS-L's chunk layout, so its compiled row has graph breaks).
DOC_MEDIAN, DOC_SIGMA = 256, 1.0
_TINY = dict(vocab_size=259, hidden_size=64, num_heads=2, head_dim=32, state_size=16, chunk_size=16)
# the run's sizes by BenchSettings.dryrun (True: toy widths / lengths on the CPU; the large rows are 2-layer stand-ins
# of the 340M presets with the same mixer pattern, None = the preset itself); compile_backend: the default Dynamo
# backend of the compiled rows (--compile-backend / BENCH_COMPILE_BACKEND override it)
SIZES = {
    True: dict(
        small_shapes=[(2, 64), (4, 32)], large_shapes=[(1, 64)], warmup=1, steps=1, quick_steps=1,
        compile_backend="eager",
        long_shapes={**{name: [(1, 128)] for name in LARGE}, **{name: [(2, 32), (1, 128)] for name in PAPER_125M}},
        paper_cfg={name: dict(_TINY, layers=[name.split("-")[0]] * 2) for name in PAPER_125M},
        large_cfg={
            "transformer-340m": dict(_TINY, layers=["softmax", "softmax"]),
            "gdn-340m": dict(_TINY, layers=["gdn", "gdn"]),
            "natsl-hybrid-340m": dict(_TINY, layers=["gdn", "natsl"],
                                      mixer_options={"natsl": {"num_attn_heads": 4}}),
        },
    ),
    False: dict(
        small_shapes=[(16, 2048), (32, 512)], large_shapes=[(4, 4096)], warmup=3, steps=10, quick_steps=4,
        compile_backend="inductor", large_cfg={name: None for name in LARGE},
        long_shapes={**{name: [(2, 16384), (1, 32768)] for name in LARGE},
                     **{name: [(8, 2048), (1, 32768)] for name in PAPER_125M}},
        paper_cfg={name: None for name in PAPER_125M},
    ),
}


def config_of(row_name: str, dryrun: bool = False) -> HybridConfig:
    """The HybridConfig of a row: a mixer name -> ``small`` with all layers that mixer; else a 340M or 125M preset
    (their toy stand-ins with ``dryrun``)."""
    if row_name in LARGE or row_name in PAPER_125M:
        over = SIZES[dryrun]["large_cfg" if row_name in LARGE else "paper_cfg"][row_name]
        return HybridConfig(**over) if over is not None else HybridConfig.from_preset(row_name)
    if dryrun:
        return HybridConfig.from_preset("small", layers=[row_name, row_name], **_TINY)
    return HybridConfig.from_preset("small", layers=row_name)


def plan(quick: bool = False, models: list[str] | None = None, variants: list[str] | None = None,
         dryrun: bool = False, shapes: list[tuple[int, int]] | None = None) -> list[dict]:
    """The rows to run: (name, B, T, variant) dicts in table order (the dry run's shapes with ``dryrun``);
    ``shapes``: keep only the rows of these (B, T)."""
    from hybrid_attention.models.mixers import MIXER_BUILDERS

    sizes = SIZES[dryrun]
    long_variants = [v for v in variants or LONG_VARIANTS if not v.endswith("+varlen")]
    variants = list(variants or VARIANTS)
    rows = []
    for mixer in MIXER_BUILDERS:
        for i, (B, T) in enumerate(sizes["small_shapes"]):
            rows += [dict(name=mixer, B=B, T=T, variant=v) for v in variants
                     if not v.endswith("+ckpt") and (not v.endswith("+varlen") or i == 0)]
    if not quick:
        for name in LARGE:
            for B, T in sizes["large_shapes"]:
                rows += [dict(name=name, B=B, T=T, variant=v) for v in variants if not v.endswith("+varlen")]
        for name, shapes_of in sizes["long_shapes"].items():
            rows += [dict(name=name, B=B, T=T, variant=v) for B, T in shapes_of for v in long_variants]
    if models:
        allowed = sorted(set(MIXER_BUILDERS) | set(LARGE) | set(PAPER_125M))
        unknown = [m for m in models if m not in allowed]
        if unknown:
            raise ValueError(f"--models accepts {allowed}, got {unknown}")
        rows = [r for r in rows if r["name"] in models]
    if shapes:
        rows = [r for r in rows if (r["B"], r["T"]) in set(shapes)]
    return rows


def add_ratios(rows: list[dict]) -> list[dict]:
    """Set ``vs_base`` on every measured row: its tokens/s over that of its baseline (``BASELINE``; ``softmax`` for
    the small rows) at the same B×T and variant in ``rows``; None where that baseline row is missing or failed."""
    tok = {(r["name"], r["B"], r["T"], r["variant"]): r.get("tok_s") for r in rows}
    for r in rows:
        base = tok.get((BASELINE.get(r["name"], "softmax"), r["B"], r["T"], r["variant"]))
        r["vs_base"] = r["tok_s"] / base if base and r.get("tok_s") else None
    return rows


def _shape(text: str) -> tuple[int, int]:
    """'16x2048' -> (16, 2048)."""
    try:
        b, t = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes takes BxT such as 16x2048, got {text!r}") from None
    return b, t


def document_mix(total: int, max_len: int, seed: int = 0) -> torch.Tensor:
    """cu_seqlens [N + 1] (int32) of ``total`` tokens cut into documents of log-normal lengths (median
    ``DOC_MEDIAN``, σ ``DOC_SIGMA`` in log space) clipped to [16, max_len]; the last document takes the rest."""
    g = torch.Generator().manual_seed(seed)
    lengths, left = [], total
    while left > 0:
        n = int(torch.exp(torch.randn((), generator=g) * DOC_SIGMA).item() * DOC_MEDIAN)
        n = min(max(n, 16), max_len, left)
        lengths.append(n)
        left -= n
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def flops_per_step(model: HybridForCausalLM, B: int, T: int,
                   cu_seqlens: torch.Tensor | None = None) -> tuple[float, str]:
    """Training FLOPs of one step under the model documented above, and its label. With ``cu_seqlens`` (the varlen
    rows: B·T tokens packed into documents) every mixer is counted per document (softmax: Σ len² instead of B·T²)."""
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    flops = 6.0 * n * B * T
    lengths = [T] * B if cu_seqlens is None else (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    mixers, uncounted = 0.0, set()
    for blk in model.model.layers:
        per_doc = [mixer_forward_flops(blk.mixer_type, blk.mixer, int(t)) for t in lengths]
        if per_doc and per_doc[0] is None:
            uncounted.add(blk.mixer_type)
            continue
        mixers += 3.0 * sum(per_doc)  # forward + backward: 3x the forward, as 6N = 3 * 2N
    label = "6N+mixers" if not uncounted else f"6N+mixers (not: {', '.join(sorted(uncounted))})"
    return flops + mixers, label


def _free() -> None:
    gc.collect()
    sync()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _one_line(exc: BaseException, limit: int = 240) -> str:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "OutOfMemoryError"
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg[:limit]}{'...' if len(msg) > limit else ''}"


def measure(s: BenchSettings, spec: dict, steps: int, warmup: int, compile_backend: str,
            profile_steps: int = 0, profile_top: int = 10) -> dict:
    """Build, (compile with ``compile_backend``,) warm up and time one row, then profile ``profile_steps`` more steps
    (``row["profile"]`` with its ``profile_top`` largest kernels, see ``benchmarks.profile_train.profile_steps``);
    raises on failure (the caller records it)."""
    from hybrid_attention.modules.activation_checkpointing import enable_block_checkpointing

    dev = s.device
    name, B, T, variant = spec["name"], spec["B"], spec["T"], spec["variant"]
    cfg = config_of(name, s.dryrun)
    for mixer, opts in spec.get("mixer_options", {}).items():  # --mixer-options: merged into the preset's
        cfg.mixer_options = {**cfg.mixer_options, mixer: {**cfg.mixer_options.get(mixer, {}), **opts}}
    torch.manual_seed(0)
    model = HybridForCausalLM(cfg).to(dev).float().train()
    row = dict(spec)
    row["layers"] = _describe(cfg.mixer_types)
    row["params_m"] = sum(p.numel() for p in model.parameters()) / 1e6
    if variant.endswith("+ckpt"):
        enable_block_checkpointing(model)
    graphs = variant == "compiled+graphs"
    if variant.startswith("compiled"):
        torch._dynamo.reset()
        compile_model(model, "blocks" if variant.startswith("compiled+blocks") else "model",
                      mode="reduce-overhead" if graphs else None, backend=compile_backend)
    fwd = model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
    extra, cu = {}, None
    if variant.endswith("+varlen"):
        ids = ids.reshape(1, B * T)
        cu = document_mix(B * T, T)  # on the host: the FLOP count reads it
        extra["cu_seqlens"] = cu.to(dev)
        row["documents"] = int(cu.numel() - 1)
    flops, row["flops_model"] = flops_per_step(model, B, T, cu)
    amp = dev == "cuda"

    step = training_step(fwd, opt, ids, amp, graphs=graphs, **extra)

    t0 = time.time()
    for _ in range(warmup):
        loss = step()
    sync()
    row["warmup_s"] = time.time() - t0
    row["loss"] = float(loss.detach().float())
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
        total_ms = cuda_steps_ms(step, steps) * steps
        row["peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
        row["reserved_gb"] = torch.cuda.max_memory_reserved() / 2**30
    else:
        t1 = time.perf_counter()
        for _ in range(steps):
            step()
        total_ms = (time.perf_counter() - t1) * 1e3
        row["peak_gb"] = row["reserved_gb"] = float("nan")
    row["step_ms"] = total_ms / steps
    row["tok_s"] = B * T / row["step_ms"] * 1e3
    row["tflops"] = flops / (row["step_ms"] * 1e-3) / 1e12
    row["steps"] = steps
    if profile_steps > 0:
        from benchmarks.profile_train import profile_steps as split

        row["profile"] = split(step, profile_steps, row["step_ms"], top=profile_top)
    return row


def _describe(mixers: list[str]) -> str:
    runs: list[list] = []
    for m in mixers:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    if len(runs) > 3:  # interleaved (the NAtS-L Hybrid): totals per mixer
        totals: dict[str, int] = {}
        for m in mixers:
            totals[m] = totals.get(m, 0) + 1
        return " + ".join(f"{m} x{n}" for m, n in totals.items()) + " (interleaved)"
    return ", ".join(f"{m} x{n}" for m, n in runs)


def run_rows(s: BenchSettings, specs: list[dict], steps: int, warmup: int, compile_backend: str,
             profile_steps: int = 0, on_row=None, profile_top: int = 10) -> dict:
    """Measure every row of ``specs``: this run's results ``{"errors": [...], "rows": [...]}`` (a failed row records
    its error; rows past the budget are recorded as skipped). ``on_row(results)`` runs after every row (the partial
    JSON, so that a run stopped from outside keeps its finished rows)."""
    results: dict = {"errors": [], "rows": []}
    for spec in specs:
        label = f"{spec['name']} B={spec['B']} T={spec['T']} {spec['variant']}"
        if s.budget_left() < 30:
            results["rows"].append({**spec, "error": "skipped (BENCH_BUDGET_S spent)"})
            log(f"train {label}: skipped (budget spent)")
            continue
        _free()
        t0 = time.time()
        try:
            row = measure(s, spec, steps, warmup, compile_backend, profile_steps, profile_top)
            log(f"train {label}: {row['step_ms']:9.1f} ms/step {row['tok_s']:10.0f} tok/s {row['tflops']:7.1f} "
                f"TFLOP/s ({row['flops_model']}) peak {row['peak_gb']:.2f} GB reserved {row['reserved_gb']:.2f} GB  "
                f"warm-up {row['warmup_s']:.1f} s [{time.time() - t0:.0f} s]")
        except Exception as exc:  # noqa: BLE001 - one row's failure (compile, OOM) must not stop the table
            row = {**spec, "error": _one_line(exc)}
            results["errors"].append(f"{label}: {row['error']}")
            log(f"train {label}: FAILED {row['error']}")
        results["rows"].append(row)
        if on_row is not None:
            on_row(results)
        if spec["variant"].startswith("compiled"):
            torch._dynamo.reset()
        _free()
    return results


def table(rows: list[dict]) -> str:
    def f(r, k, fmt):
        v = r.get(k)
        return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"

    lines = ["| model | layers | B×T | variant | step ms | tokens/s | vs base | TFLOP/s | FLOPs counted | peak GB "
             "| reserved GB | warm-up s | note |", "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in add_ratios(rows):
        ratio = f"{r['vs_base']:.2f}×" if r.get("vs_base") else "-"
        lines.append(f"| {r['name']} | {r.get('layers', '-')} | {r['B']}×{r['T']} | {r['variant']} | "
                     f"{f(r, 'step_ms', '.1f')} | {f(r, 'tok_s', '.0f')} | {ratio} | {f(r, 'tflops', '.1f')} | "
                     f"{r.get('flops_model', '-')} | {f(r, 'peak_gb', '.2f')} | {f(r, 'reserved_gb', '.2f')} | "
                     f"{f(r, 'warmup_s', '.1f')} | {r.get('error', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the rows of ``plan`` and print the table (flags: ``common.bench_parser`` and the options above); returns
    the exit status (1 when a row failed)."""
    p = bench_parser("training-step speed", prog="hybrid-attention bench train")
    p.set_defaults(out=os.environ.get("OUT"))  # JSON only when asked for
    p.add_argument("--models", nargs="+", help="row names: mixers (small preset) and/or 340M presets")
    p.add_argument("--variants", nargs="+", choices=VARIANTS)
    p.add_argument("--shapes", nargs="+", type=_shape, help="only these BxT rows (e.g. 16x2048 4x4096)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="profile N more steps of every row: kernel time vs GPU idle, launches, top kernels")
    p.add_argument("--profile-top", type=int, default=10, metavar="K", help="kernels listed per profiled row")
    p.add_argument("--steps", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--compile-backend", default=os.environ.get("BENCH_COMPILE_BACKEND"),
                   help="Dynamo backend of the compiled rows (default: BENCH_COMPILE_BACKEND, else inductor; eager "
                        "in the dry run)")
    p.add_argument("--mixer-options", type=json.loads, default={}, metavar="JSON",
                   help='mixer options merged into every row\'s config, e.g. \'{"gdn": {"conv_backend": "auto"}}\'')
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    require_cuda(a.dryrun)
    s = BenchSettings(dryrun=a.dryrun, budget_s=a.budget_s, out=a.out or ".")
    sizes = SIZES[s.dryrun]
    backend = a.compile_backend or sizes["compile_backend"]
    steps = a.steps or (sizes["quick_steps"] if a.quick else sizes["steps"])
    warmup = a.warmup or sizes["warmup"]
    if a.profile < 0:
        raise SystemExit(f"error: --profile takes a number of steps >= 0, got {a.profile}")
    try:
        specs = plan(a.quick, a.models, a.variants, dryrun=s.dryrun, shapes=a.shapes)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    if a.mixer_options:
        specs = [{**spec, "mixer_options": a.mixer_options} for spec in specs]
    cuda = s.device == "cuda"
    set_tf32(torch.device(s.device), True)  # as the trainer's default train.tf32
    log(f"train-speed bench: device={s.device} dryrun={s.dryrun} torch={torch.__version__}"
        + (f" ({torch.cuda.get_device_name()})" if cuda else "")
        + f"; {len(specs)} rows, {warmup} warm-up + {steps} timed steps, compile backend {backend}")
    header = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "dryrun": s.dryrun, "steps": steps, "warmup": warmup, "compile_backend": backend}

    def save(results: dict) -> None:
        if not a.out:
            return
        os.makedirs(a.out, exist_ok=True)
        path = s.out_path("train_speed.json")
        with open(path + ".tmp", "w") as fh:  # whole file or none: written aside, then renamed
            json.dump({**header, **results}, fh, indent=1, default=str)
        os.replace(path + ".tmp", path)

    results = run_rows(s, specs, steps, warmup, backend, a.profile, on_row=save, profile_top=a.profile_top)
    log(f"\ntraining step (bf16 autocast on CUDA, fused AdamW), {elapsed():.0f} s:")
    log(table(results["rows"]))
    if a.profile:
        from benchmarks.profile_train import profile_table

        for r in results["rows"]:
            if "profile" in r:
                log("\n" + profile_table(f"{r['name']} {r['B']}×{r['T']} {r['variant']}: step {r['step_ms']:.1f} ms",
                                          r["profile"]))
    add_ratios(results["rows"])
    save(results)
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
