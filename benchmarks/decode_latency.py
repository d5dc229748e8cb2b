"""Per-token decode latency at long contexts, graph vs graph.

    rows = decode_latency(model, contexts=[1024, 4096, 131072], batch_sizes=[1, 8])

For each (batch size, context c): a `StaticDecoder` with max_length = c + the timed steps is filled with RANDOM states
and K/V as if c tokens had been seen (`StaticDecoder.fill_random`: the costs of a step depend on the buffer sizes and
the NAtS-L kept-chunk counts, not on the values; a real prefill of 128K tokens would dominate the benchmark's time).
NAtS-L layers keep `natsl_softmax_fraction` of the complete chunks in every row and decision head, and their cache
capacity is sized to that fraction (plus the chunk ends of the timed steps). Then the eager
`step` and (CUDA, `graphs=True`) the captured graphs are timed; the median over `iters` steps is reported. The steps
are consecutive tokens, so 1 in C of them (NAtS-L) is a chunk-final step: the median is the inside-chunk cost, the
mean includes the chunk ends. On the CPU the function runs at tiny sizes without graphs (smoke tests).
"""

from __future__ import annotations

import statistics
import time

import torch

from hybrid_attention.layers.natsl import NatsLAttention
from hybrid_attention.models.modeling import HybridForCausalLM
from hybrid_attention.serving.decoder import StaticDecoder


def _time_steps(dec: StaticDecoder, iters: int, warmup: int) -> list[float]:
    """Milliseconds of each of `iters` consecutive steps (CUDA events on the GPU, perf_counter on the CPU)."""
    tok = torch.zeros(dec.batch_size, 1, dtype=torch.long, device=dec.device)
    for _ in range(warmup):
        dec.step(tok)
    times = []
    cuda = dec.device.type == "cuda"
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dec.step(tok)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            dec.step(tok)
            times.append((time.perf_counter() - t) * 1e3)
    return times


def _natsl_capacity(model: HybridForCausalLM, context: int, steps: int, fraction: float) -> int | None:
    """NAtS-L cache capacity for a timing run: the chunks kept at `context` (fraction of the complete chunks) plus one
    per chunk end the timed steps can reach, so the attention of a step costs what the fraction implies (a full
    capacity would make every step attend over max_length masked keys). None when the model has no NAtS-L layer."""
    sizes = [blk.mixer.chunk_size for blk in model.model.layers if isinstance(blk.mixer, NatsLAttention)]
    if not sizes:
        return None
    c = min(sizes)
    return max(round(fraction * (context // s)) for s in sizes) + -(-steps // c) + 1


def decode_latency(model: HybridForCausalLM, contexts: list[int], batch_sizes: list[int], graphs: bool = True,
                   iters: int = 50, warmup: int = 5, natsl_softmax_fraction: float = 0.5,
                   compile_mode: str | None = None, fused_gemv: bool | None = None) -> list[dict]:
    """Rows {"batch_size", "context", "eager_ms", "eager_mean_ms", "graph_ms", "graph_mean_ms", "natsl_cache_chunks",
    "error"} (ms per decoded token for the whole batch; graph_* None without CUDA or graphs=False; "error" set, e.g.
    on OOM, instead of failing the sweep). model: a HybridForCausalLM in eval mode on its device and dtype.
    compile_mode: the StaticDecoder's torch.compile mode (None: its default); fused_gemv: its fused decode GEMVs
    (None: its default)."""
    if iters < 1 or warmup < 0:
        raise ValueError(f"iters must be >= 1 and warmup >= 0, got iters={iters}, warmup={warmup}")
    use_graphs = graphs and model.lm_head.weight.is_cuda
    rows = []
    for b in batch_sizes:
        for c in contexts:
            row = {"batch_size": b, "context": c, "eager_ms": None, "eager_mean_ms": None, "graph_ms": None,
                   "graph_mean_ms": None, "error": None}
            dec = None
            try:
                capacity = _natsl_capacity(model, c, iters + warmup, natsl_softmax_fraction)
                row["natsl_cache_chunks"] = capacity
                mode = {} if compile_mode is None else {"compile_mode": compile_mode}
                if fused_gemv is not None:
                    mode["fused_gemv"] = fused_gemv
                dec = StaticDecoder(model, b, c + iters + warmup, natsl_cache_chunks=capacity, **mode)
                dec.fill_random(c, softmax_fraction=natsl_softmax_fraction)
                t = _time_steps(dec, iters, warmup)
                row["eager_ms"], row["eager_mean_ms"] = statistics.median(t), statistics.fmean(t)
                if use_graphs:
                    dec.fill_random(c, softmax_fraction=natsl_softmax_fraction)  # back to c tokens, same counts
                    dec.capture()
                    t = _time_steps(dec, iters, warmup)
                    row["graph_ms"], row["graph_mean_ms"] = statistics.median(t), statistics.fmean(t)
            except torch.OutOfMemoryError as e:  # a too-large (B, context) must not end the whole sweep
                row["error"] = f"OOM: {str(e).splitlines()[0]}"
            except Exception as e:  # noqa: BLE001 -- nor any other failure of one point: it is reported in its row
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            finally:
                del dec
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    """python -m benchmarks.decode_latency --preset gdn-340m --contexts 1024,131072 --batch-sizes 1,8
    Random-weight model of a preset (bf16 on CUDA, float32 on the CPU); prints one JSON row per point."""
    import argparse
    import json

    from hybrid_attention.models import HybridConfig, HybridForCausalLM

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True)
    ap.add_argument("--contexts", default="1024,4096,16384,65536,131072")
    ap.add_argument("--batch-sizes", default="1")
    ap.add_argument("--natsl-softmax-fraction", type=float, default=0.5)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--compile-mode", default=None,
                    help='StaticDecoder compile mode, e.g. "max-autotune-no-cudagraphs" (default: the decoder\'s)')
    ap.add_argument("--fused-gemv", action="store_true", help="the StaticDecoder's fused decode GEMVs (opt-in)")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset(args.preset)).eval()
    model = model.to("cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32)
    rows = decode_latency(model, [int(c) for c in args.contexts.split(",")],
                          [int(b) for b in args.batch_sizes.split(",")], graphs=not args.no_graphs, iters=args.iters,
                          natsl_softmax_fraction=args.natsl_softmax_fraction, compile_mode=args.compile_mode,
                          fused_gemv=args.fused_gemv or None)
    for row in rows:
        print(json.dumps({"preset": args.preset, "compile_mode": args.compile_mode, "fused_gemv": args.fused_gemv,
                          **row}))


if __name__ == "__main__":
    main()
