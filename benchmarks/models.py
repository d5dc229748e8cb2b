"""Model-level GPU benchmark: prefill, decode and training step of whole models, side by side in one run.

    hybrid-attention bench models [--quick]     (or: python -m benchmarks.models)

Sections (each guarded; random weights, bf16, B=1 unless stated):
  1. prefill: `natsl-hybrid-340m` (routing as produced by the random router, and forced to softmax
     fractions 0.25 and 0.5), `gdn-340m`, `transformer-340m` at T = 4K, 16K, 64K, 128K: one forward pass that builds
     the decode state (`model(ids, use_cache=True, logits_to_keep=1)`), median wall time (CUDA events) and peak memory
     above the weights;
  2. decode: ms/token of one greedy step through `hybrid_attention.serving.StaticDecoder`, captured
     in CUDA graphs on both sides, contexts 1K…128K (states filled at random to the context: the costs of a real
     context), for the three 340M presets (NAtS-L at fractions 0.25 / 0.5) and the `interdomain-1.3b` /
     `softmax-1.3b` pair (B = 1 and 8);
  3. training: tokens/s of a full training step (forward, backward, AdamW) at T = 4K, B = 4, bf16
     autocast over float32 weights;
  4. Table 12 (spec interdomain §5.6): peak prefill memory (GB, weights included, as the paper reports it)
     of `interdomain-1.3b` (one pass, and chunked prefill with C = 2048) vs `softmax-1.3b`, bf16, at the paper's
     (B, L) pairs.
Prints one table per section plus the issue targets (met / missed with the number) and writes
``<--out>/models_gpu.json`` (default ``$OUT`` or .). ``--dryrun`` (or ``BENCH_DRYRUN=1``) runs it on the CPU with
2-layer stand-ins and tiny lengths.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from benchmarks.common import BenchSettings, bench_parser, elapsed, exit_status, log, peak_mb, section, sync
from hybrid_attention.layers.natsl.routing import RoutingRecorder, force_routing
from hybrid_attention.models import HybridConfig, HybridForCausalLM

NAN = float("nan")
_TINY = dict(vocab_size=259, hidden_size=64, num_heads=2, head_dim=32, state_size=16, chunk_size=16)
_PRESETS = ("natsl-hybrid-340m", "gdn-340m", "transformer-340m", "interdomain-1.3b", "softmax-1.3b")
# the run's models and lengths by BenchSettings.dryrun. True: 2-layer stand-ins with the same mixer pattern, tiny
# lengths (a smoke test of this file, not a measurement); False: the presets (configs None) at the issues' lengths,
# table12: spec interdomain §5.6, Table 12's (B, L) pairs (the paper's peak prefill GB in PAPER_TABLE12)
SIZES = {
    True: dict(
        configs={
            "natsl-hybrid-340m": dict(_TINY, layers=["gdn", "natsl"], mixer_options={"natsl": {"num_attn_heads": 4}}),
            "gdn-340m": dict(_TINY, layers=["gdn", "gdn"]),
            "transformer-340m": dict(_TINY, layers=["softmax", "softmax"]),
            "interdomain-1.3b": dict(_TINY, layers=["interdomain", "interdomain"]),
            "softmax-1.3b": dict(_TINY, layers=["softmax", "softmax"]),
        },
        prefill_t=[64, 96], decode_ctx=[32, 64], train_t=64, train_b=2, table12=[(2, 64), (1, 128)],
        table12_chunk=32,
    ),
    False: dict(
        configs={name: None for name in _PRESETS},
        prefill_t=[4096, 16384, 65536, 131072], decode_ctx=[1024, 4096, 16384, 65536, 131072], train_t=4096,
        train_b=4, table12=[(8, 4096), (8, 8192), (8, 16384), (16, 4096), (32, 2048), (64, 512)], table12_chunk=2048,
    ),
}
# the paper's peak prefill GB of Table 12 (softmax SDPA, Interdomain non-chunked, Interdomain chunked C=2048; None =
# OOM on the paper's card)
PAPER_TABLE12 = {
    (8, 4096): (14.65, 24.45, 17.58),
    (8, 8192): (21.42, None, 19.90),
    (8, 16384): (None, None, 25.78),
    (16, 4096): (21.21, None, 26.54),
    (32, 2048): (21.16, 40.97, 36.62),
    (64, 512): (14.59, 24.77, 21.39),
}
NATSL_VARIANTS = [("as produced", None), ("forced 0.25", 0.25), ("forced 0.5", 0.5)]


def build(s: BenchSettings, name: str, dtype: torch.dtype | None = None) -> HybridForCausalLM:
    """Random-weight model of a preset (or its dry-run stand-in) on the benchmark device, eval mode; ``dtype``
    defaults to bf16 on CUDA, float32 on the CPU."""
    overrides = SIZES[s.dryrun]["configs"][name]
    cfg = HybridConfig(**overrides) if overrides is not None else HybridConfig.from_preset(name)
    if dtype is None:
        dtype = torch.bfloat16 if s.device == "cuda" else torch.float32
    torch.manual_seed(0)
    return HybridForCausalLM(cfg).to(s.device, dtype).eval()


def set_fraction(model: HybridForCausalLM, fraction: float | None) -> None:
    """Force every NAtS-L layer's softmax fraction (None: the router decides)."""
    force_routing(model, fraction)


def _free(s: BenchSettings) -> None:
    dev = s.device
    sync()
    if dev == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _time_ms(s: BenchSettings, fn, reps: int) -> float:
    """Median wall milliseconds of fn() over `reps` calls after one warm-up call (CUDA events on the GPU)."""
    dev = s.device
    fn()
    sync()
    times = []
    for _ in range(reps):
        if dev == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _peak_gb(s: BenchSettings, fn, relative: bool = False) -> float:
    """Peak allocated GB while fn() runs (see ``peak_mb``; absolute unless `relative`)."""
    _free(s)
    return peak_mb(fn, relative=relative) / 1024


def _natsl_fraction(routing: RoutingRecorder) -> float:
    """Mean softmax fraction over the NAtS-L layers of the last pass ``routing`` saw (nan without NAtS-L)."""
    fr = [f.float().mean().item() for f in routing.fractions().values()]
    return sum(fr) / len(fr) if fr else NAN


# ------------------------------------------------------------------------------------------------------------ prefill
PREFILL_MODELS = ("natsl-hybrid-340m", "gdn-340m", "transformer-340m")


@section("prefill")
def prefill(results: dict, s: BenchSettings, lengths: list[int], models: list[str] | None = None,
            compiled: bool = False) -> None:
    """models: a subset of PREFILL_MODELS (default: all); compiled: the forward under ``torch.compile`` (the glue —
    norms, gates, short convolutions, projections' epilogues — fused by inductor; one compile per length, in the
    timing's warm-up call; the rows' variant label gets a "compiled" prefix)."""
    dev = s.device
    for name in models or PREFILL_MODELS:
        model = build(s, name)
        fwd = torch.compile(model, dynamic=False) if compiled else model
        routing = RoutingRecorder()  # the NAtS-L chunk types of this model's passes
        variants = NATSL_VARIANTS if name.startswith("natsl") else [("", None)]
        for label, fraction in variants:
            set_fraction(model, fraction)
            if compiled:
                label = f"compiled {label}".strip()
            for T in lengths:
                if s.budget_left() < 60:
                    log(f"prefill: budget spent, skipping {name} {label} T={T}")
                    continue
                ids = torch.randint(0, model.config.vocab_size, (1, T), device=dev)

                def run(ids=ids, fwd=fwd):
                    with torch.no_grad():
                        return fwd(ids, use_cache=True, logits_to_keep=1)

                try:
                    ms = _time_ms(s, run, reps=3 if T <= 16384 else 2)
                    gb = _peak_gb(s, run, relative=True)
                    # the routing of one more call, eager and outside the timed ones: a recorder attached to the
                    # compiled model would make it recompile (its `recorders` are guarded) around an eager break
                    with routing.attach(model):
                        run(fwd=model)
                except torch.OutOfMemoryError:
                    ms, gb = NAN, NAN
                    log(f"prefill {name} T={T}: out of memory")
                row = dict(model=name, variant=label, T=T, ms=ms, peak_gb=gb, fraction=_natsl_fraction(routing))
                results["prefill"].append(row)
                log(
                    f"prefill {name:<18} {label:<12} T={T:>6}: {ms:9.1f} ms  peak {gb:6.2f} GB  "
                    f"softmax fraction {row['fraction']:.3f}"
                )
                del run
                _free(s)
        del model, fwd
        if compiled:
            torch._dynamo.reset()
        _free(s)


# ------------------------------------------------------------------------------------------------------------ decode
# HBM bandwidth of the H200 (~4.3 TB/s achievable of the 4.8 TB/s peak, a device-to-device copy), the
# yardstick of the decode rows' GB/s
HBM_GB_S = 4300.0


def stream_floor_gb(model: HybridForCausalLM, context: int, batch_size: int, fraction: float | None) -> float:
    """GB one decode step must read at least: every parameter except the input embedding (one row of it is read) in
    its dtype, plus each row's mixer state after ``context`` tokens (``state_size`` at the NAtS-L softmax fraction,
    0.5 when the router decides) at 2 bytes a number (bf16 KV caches; the recurrent states are float32, so for them
    this is a floor)."""
    from hybrid_attention.evaluation.info import state_size

    emb = model.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if emb is not model.lm_head.weight:  # a tied embedding is read whole by the LM head
        weights -= emb.numel() * emb.element_size()
    state = state_size(model, context, 0.5 if fraction is None else fraction) * batch_size * 2
    return (weights + state) / 1e9


@section("decode")
def decode(results: dict, s: BenchSettings, contexts: list[int], models: list[str] | None = None,
           batch_sizes: list[int] | None = None) -> None:
    """models: a subset of the plan's preset names, run in the order given (default: all, in the plan's order);
    batch_sizes: only the plan's rows of these batch sizes (default: every row)."""
    dev = s.device
    from benchmarks.decode_latency import decode_latency

    plan = [
        ("natsl-hybrid-340m", 0.25, [1, 8]),
        ("natsl-hybrid-340m", 0.5, [1]),
        ("gdn-340m", None, [1, 8]),
        ("transformer-340m", None, [1, 8]),
        ("interdomain-1.3b", None, [1, 8]),
        ("softmax-1.3b", None, [1, 8]),
    ]
    if models is not None:
        unknown = sorted(set(models) - {name for name, _, _ in plan})
        if unknown:
            raise ValueError(f"--decode-models: unknown {unknown}; allowed: {sorted({n for n, _, _ in plan})}")
        # in the caller's order, so that a time limit drops the last-named preset
        plan = [row for name in dict.fromkeys(models) for row in plan if row[0] == name]
    if batch_sizes is not None:
        plan = [(n, f, [b for b in bs if b in batch_sizes]) for n, f, bs in plan]
        plan = [row for row in plan if row[2]]
    for name, fraction, row_batches in plan:
        if s.budget_left() < 60:
            log(f"decode: budget spent, skipping {name}")
            continue
        model = build(s, name)
        for bsz in row_batches:
            # softmax KV at B=8 and 128K would not fit next to everything else: B=8 stops at 16K
            ctx = contexts if bsz == 1 else [c for c in contexts if c <= max(16384, contexts[0])]
            kwargs = {} if fraction is None else {"natsl_softmax_fraction": fraction}
            try:
                rows = decode_latency(model, ctx, [bsz], graphs=dev == "cuda", **kwargs)
            except torch.OutOfMemoryError as exc:
                log(f"decode {name} B={bsz}: out of memory ({exc})")
                rows = []
            for r in rows:
                r.update(model=name, fraction=fraction)
                r["stream_gb"] = stream_floor_gb(model, r["context"], bsz, fraction)
                ms = r["graph_ms"] or r["eager_ms"]
                r["gb_s"] = r["stream_gb"] / (ms / 1e3) if ms else None
                results["decode"].append(r)
                log(f"decode {name:<18} frac={fraction} {json.dumps({k: v for k, v in r.items() if k != 'model'})}")
        del model
        _free(s)


# ------------------------------------------------------------------------------------------------------------ training
@section("train")
def train(results: dict, s: BenchSettings, T: int, bsz: int) -> None:
    dev = s.device
    for name, fraction in (("natsl-hybrid-340m", None), ("gdn-340m", None), ("transformer-340m", None)):
        if s.budget_left() < 60:
            log(f"train: budget spent, skipping {name}")
            continue
        model = build(s, name, dtype=torch.float32).train()
        set_fraction(model, fraction)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev == "cuda")
        ids = torch.randint(0, model.config.vocab_size, (bsz, T), device=dev)

        def step(model=model, opt=opt, ids=ids):
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
                loss = model(ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()  # compile the kernels
        routing = RoutingRecorder()
        with routing.attach(model):
            ms = _time_ms(s, step, reps=5 if dev == "cuda" else 1)
            peak = _peak_gb(s, step)
        row = dict(
            model=name, T=T, B=bsz, ms=ms, tok_s=bsz * T / ms * 1e3, peak_gb=peak, fraction=_natsl_fraction(routing)
        )
        results["train"].append(row)
        log(
            f"train {name:<18} B={bsz} T={T}: {ms:8.1f} ms/step  {row['tok_s']:10.0f} tok/s  peak {peak:.1f} GB  "
            f"softmax fraction {row['fraction']:.3f}"
        )
        del model, opt, step  # the closure holds both
        _free(s)


# ------------------------------------------------------------------------------------------------------------ table 12
@section("table12")
def table12(results: dict, s: BenchSettings, pairs: list[tuple[int, int]], chunk: int) -> None:
    dev = s.device
    for name in ("softmax-1.3b", "interdomain-1.3b"):
        model = build(s, name)
        modes = [("one pass", None)] + ([(f"chunked C={chunk}", chunk)] if name.startswith("interdomain") else [])
        for label, c in modes:
            for bsz, L in pairs:
                if s.budget_left() < 45:
                    log(f"table12: budget spent, skipping {name} {label} B={bsz} L={L}")
                    continue
                ids = torch.randint(0, model.config.vocab_size, (bsz, L), device=dev)

                def run(ids=ids, c=c, model=model):
                    with torch.no_grad():
                        if c is None:
                            return model(ids, use_cache=True, logits_to_keep=1)
                        return model.prefill(ids, chunk_size=c)

                try:
                    gb = _peak_gb(s, run)  # weights included, as in the paper
                    ms = _time_ms(s, run, reps=1)
                except torch.OutOfMemoryError:
                    gb, ms = NAN, NAN
                results["table12"].append(dict(model=name, mode=label, B=bsz, L=L, peak_gb=gb, ms=ms))
                log(f"table12 {name:<16} {label:<14} B={bsz:>2} L={L:>6}: peak {gb:6.2f} GB  {ms:8.1f} ms")
                del run
                _free(s)
        del model
        _free(s)


# ------------------------------------------------------------------------------------------------------------ summary
def _get(rows, **kw):
    for r in rows:
        if all(r.get(k) == v for k, v in kw.items()):
            return r
    return None


def _f(x) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) else "  -   "


def summary(results: dict, dryrun: bool = False) -> None:
    """Print the tables and the targets' verdicts (a dry run's tiny CPU shapes judge none: "not judged")."""

    def _verdict(ok: bool) -> str:
        return "not judged (dry run)" if dryrun else "MET" if ok else "MISSED"

    log("\n================ models (random weights, bf16) ================")
    if results["prefill"]:
        log("prefill (one pass building the decode state, B=1): ms / peak GB above the weights")
        for r in results["prefill"]:
            log(
                f"  {r['model']:<18} {r['variant']:<12} T={r['T']:>6}  {r['ms']:9.1f} ms  {r['peak_gb']:6.2f} GB"
                f"  fraction {r['fraction']:.3f}"
            )
    if results["decode"]:
        log("decode ms/token (graph):")
        for r in results["decode"]:
            log(
                f"  {r['model']:<18} frac={r['fraction']} B={r['batch_size']} ctx={r['context']:>6}: graph "
                f"{_f(r['graph_ms'])} (mean {_f(r['graph_mean_ms'])})  eager {_f(r['eager_ms'])}"
                + (f"  {r['gb_s']:.0f} GB/s = {r['gb_s'] / HBM_GB_S:.0%} of {HBM_GB_S / 1e3:.1f} TB/s "
                   f"({r['stream_gb']:.2f} GB floor)" if r.get("gb_s") else "")
                + (f"  error: {r['error']}" if r.get("error") else "")
            )
    if results["train"]:
        log("training step (B x T tokens, bf16 autocast, AdamW):")
        for r in results["train"]:
            log(f"  {r['model']:<18} {r['tok_s']:10.0f} tok/s  ({r['ms']:.1f} ms, peak {r['peak_gb']:.1f} GB)")
    if results["table12"]:
        log("Table 12 (peak prefill GB incl. weights; paper: softmax / interdomain one pass / chunked):")
        for r in results["table12"]:
            paper = PAPER_TABLE12.get((r["B"], r["L"]))
            log(
                f"  {r['model']:<16} {r['mode']:<14} B={r['B']:>2} L={r['L']:>6}: {r['peak_gb']:6.2f} GB "
                f"({r['ms']:.0f} ms)  paper {paper}"
            )
    # issue targets
    P, D, Tr = results["prefill"], results["decode"], results["train"]
    T_top = max((r["T"] for r in P), default=None)
    if T_top:
        tf = _get(P, model="transformer-340m", T=T_top)
        gd = _get(P, model="gdn-340m", T=T_top)
        if gd and T_top == 131072:  # target: gdn-340m prefill at 128K <= 400 ms
            log(f"target prefill@{T_top} gdn-340m: {gd['ms']:.1f} ms (<= 400: {_verdict(gd['ms'] <= 400)})")
        for label, _ in NATSL_VARIANTS:
            na = _get(P, model="natsl-hybrid-340m", variant=label, T=T_top)
            if tf and gd and na:  # target: >= 4x faster than the Transformer, <= 1.3x GDN's time
                s_tf, s_gd = tf["ms"] / na["ms"], na["ms"] / gd["ms"]
                log(
                    f"target prefill@{T_top} ({label}): {s_tf:.2f}x faster than Transformer (>= 4: "
                    f"{_verdict(s_tf >= 4)}), {s_gd:.2f}x GDN's time (<= 1.3: {_verdict(s_gd <= 1.3)})"
                )
    if D:
        c_top = max(r.get("context", 0) for r in D)
        tf = _get(D, model="transformer-340m", context=c_top, batch_size=1)
        for fr in (0.25, 0.5):
            na = _get(D, model="natsl-hybrid-340m", fraction=fr, context=c_top, batch_size=1)
            if tf and na and tf["graph_mean_ms"] and na["graph_mean_ms"]:
                s = tf["graph_mean_ms"] / na["graph_mean_ms"]  # means: chunk-final steps included
                log(
                    f"target decode@{c_top} (fraction {fr}): {s:.2f}x faster than Transformer "
                    f"(>= 5: {_verdict(s >= 5)})"
                )
        ids = sorted(
            (r for r in D if r["model"] == "interdomain-1.3b" and r.get("batch_size") == 1), key=lambda r: r["context"]
        )
        if len(ids) >= 2 and all(r["graph_ms"] for r in ids):
            lat = [r["graph_ms"] for r in ids]
            spread = max(lat) / min(lat) - 1
            log(
                f"target interdomain-1.3b decode flat within 5% over contexts: spread {spread * 100:.1f}% "
                f"({_verdict(spread <= 0.05)})"
            )
    na, gd = _get(Tr, model="natsl-hybrid-340m"), _get(Tr, model="gdn-340m")
    if na and gd:
        s = na["tok_s"] / gd["tok_s"]
        log(f"target training tok/s NAtS-L Hybrid / GDN = {s:.2f} (>= 0.8: {_verdict(s >= 0.8)})")
    if results["errors"]:
        log("ERRORS: " + " | ".join(results["errors"]))
    log(f"total {elapsed():.0f} s")


def main(argv: list[str] | None = None) -> int:
    """Run every section (``--quick``: the two shortest lengths of each; ``--sections a,b``: only those of prefill,
    decode, train, table12; the shared flags: ``common.bench_parser``); returns the exit status (1 when a section
    raised)."""
    p = bench_parser(__doc__.splitlines()[0])
    p.add_argument("--sections", type=lambda v: set(v.split(",")), help="comma-separated subset of the sections")
    p.add_argument("--decode-models", type=lambda v: v.split(","), help="comma-separated presets of the decode plan")
    p.add_argument("--decode-contexts", type=lambda v: [int(c) for c in v.split(",")],
                   help="comma-separated decode contexts (default: the run's list)")
    p.add_argument("--decode-batch-sizes", type=lambda v: [int(c) for c in v.split(",")],
                   help="comma-separated batch sizes of the decode plan's rows (default: all: 1 and 8)")
    p.add_argument("--prefill-models", type=lambda v: v.split(","),
                   help=f"comma-separated presets of the prefill rows (default: {','.join(PREFILL_MODELS)})")
    p.add_argument("--prefill-lengths", type=lambda v: [int(c) for c in v.split(",")],
                   help="comma-separated prefill lengths (default: the run's list)")
    p.add_argument("--prefill-compile", action="store_true", help="prefill through torch.compile(model)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    # this run's JSON (every section appends its rows to it; local to the run, not module state)
    results: dict = {"errors": [], "prefill": [], "decode": [], "train": [], "table12": []}
    bad = sorted(set(args.prefill_models or ()) - set(PREFILL_MODELS))
    if bad:
        p.error(f"--prefill-models accepts {', '.join(PREFILL_MODELS)}, got {', '.join(bad)}")
    s, quick, only = BenchSettings.from_args(args), args.quick, args.sections
    sizes = SIZES[s.dryrun]
    log(
        f"models bench: device={s.device} dryrun={s.dryrun} torch={torch.__version__}"
        + (f" ({torch.cuda.get_device_name()})" if s.device == "cuda" else "")
    )
    lengths = args.prefill_lengths or (sizes["prefill_t"][:2] if quick else sizes["prefill_t"])
    if only is None or "prefill" in only:
        prefill(results, s, lengths, args.prefill_models, args.prefill_compile)
    if only is None or "train" in only:
        train(results, s, sizes["train_t"], sizes["train_b"])
    if only is None or "decode" in only:
        contexts = args.decode_contexts or (sizes["decode_ctx"][:3] if quick else sizes["decode_ctx"])
        decode(results, s, contexts, args.decode_models, args.decode_batch_sizes)
    if only is None or "table12" in only:
        table12(results, s, sizes["table12"][:2] if quick else sizes["table12"], sizes["table12_chunk"])
    s.write_json("models_gpu.json", results)
    summary(results, s.dryrun)
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
