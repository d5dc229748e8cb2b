"""The split-KV decode attention kernel alone (``hybrid_attention.ops.decode_attention``): correctness and a launch
sweep, for the decode steps (one query per row and head over a static K/V buffer).

    python -m benchmarks.decode_attention_ops [--dryrun] [--budget-s S] [--out DIR]

1. Correctness: the Triton op against ``decode_attention_reference`` in float32 (the kernel accumulates in fp32), for
   one key range (softmax) and two (NAtS-L: the kept prefix and the current chunk), at every swept configuration.
   Bar: 2e-2 relative RMS for bf16 inputs (fp32 inputs under the interpreter: 1e-5).
2. Sweep (CUDA only): time per call, captured in a CUDA graph of 20 calls (as in a decode step: launch latency
   excluded), for the transformer-340m layer shape (H = 16, D = 64, bf16) at B = 1 and contexts 1K / 8K / 32K / 128K,
   and B = 8 at 128K; ``num_splits`` from the library default (``default_num_splits``) up to 4× it, and BLOCK_N
   32 / 64 / 128. Reports µs per call and the achieved GB/s of the K / V bytes read (the card's ≈ 4.3 TB/s copy rate
   is the roof).
Prints one table per part; JSON in ``<out>/decode_attention_ops.json``.
"""

from __future__ import annotations

import functools
import time

import torch

from benchmarks.common import DECODE_ATTENTION_BUDGET_S, BenchSettings, bench_parser, log
from hybrid_attention.ops.decode_attention import decode_attention, decode_attention_reference, default_num_splits

SHAPES_GPU = [(1, 1024), (1, 8192), (1, 32768), (1, 131072), (8, 131072)]  # (B, context)
SHAPES_DRY = [(1, 40), (2, 100)]
BLOCKS = (32, 64, 128)


def _problem(B: int, H: int, L: int, D: int, dtype: torch.dtype, device: str, two_ranges: bool, seed: int = 0):
    """q [B, H, D], k / v [B, H, L, D] and the lengths: keys [0, L - 3) (one range), or the first half and the last
    quarter of the buffer (two ranges, as a NAtS-L kept prefix plus its current chunk)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(*s, generator=g).to(device, dtype) for s in ((B, H, D), (B, H, L, D), (B, H, L, D)))
    if two_ranges:
        len1, start2, len2 = L // 2, L - L // 4, L // 4
    else:
        len1, start2, len2 = L - 3, 0, 0
    lens = [torch.full((1, 1), n, dtype=torch.long, device=device) for n in (len1, start2, len2)]
    return q, k, v, lens


def _configs(device: torch.device, B: int, H: int, L: int) -> list[tuple[int, int]]:
    base = default_num_splits(device, B * H, L)
    splits = sorted({base, 2 * base, 4 * base})
    return [(s, bn) for s in splits for bn in BLOCKS]


def correctness(s: BenchSettings) -> list[dict]:
    dev = torch.device(s.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    bar = 2e-2 if dtype == torch.bfloat16 else 1e-5
    rows = []
    for B, L in (SHAPES_DRY if s.dryrun else [(1, 1000), (8, 4096)]):
        for two in (False, True):
            q, k, v, lens = _problem(B, 4 if s.dryrun else 16, L, 64 if not s.dryrun else 16, dtype, dev.type, two)
            ref = decode_attention_reference(q.float(), k.float(), v.float(), *lens, q.shape[-1] ** -0.5)
            for splits, bn in _configs(dev, B, q.shape[1], L):
                o = decode_attention(q, k, v, *lens, q.shape[-1] ** -0.5, splits, bn)
                err = ((o.float() - ref).norm() / ref.norm()).item()
                rows.append(dict(B=B, L=L, two_ranges=two, num_splits=splits, block_n=bn, rel_err=err,
                                 ok=err <= bar))
    log("| B | L | ranges | num_splits | BLOCK_N | rel. error | result |\n|---|---|---|---|---|---|---|")
    for r in rows:
        log(f"| {r['B']} | {r['L']} | {2 if r['two_ranges'] else 1} | {r['num_splits']} | {r['block_n']} | "
            f"{r['rel_err']:.2e} | {'PASS' if r['ok'] else 'FAIL'} |")
    return rows


def _graph_us(fn, calls: int = 20) -> float:
    """µs per call of ``fn`` replayed from one CUDA graph of ``calls`` calls (median of 5 replays)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def sweep(s: BenchSettings) -> list[dict]:
    if s.device != "cuda":
        log("sweep: CUDA only (skipped)")
        return []
    dev = torch.device("cuda")
    rows = []
    for B, L in SHAPES_GPU:
        if s.budget_left() < 20:
            log(f"sweep: budget spent, stopping before B={B} L={L}")
            break
        q, k, v, _ = _problem(B, 16, L + 64, 64, torch.bfloat16, "cuda", False)  # a buffer with 64 spare slots
        lens = [torch.full((1, 1), x, dtype=torch.long, device="cuda") for x in (L, 0, 0)]  # L valid keys
        gb = 2 * B * 16 * L * 64 * 2 / 1e9  # K and V of the L valid keys, bf16
        base = default_num_splits(dev, B * 16, L + 64)
        for splits, bn in _configs(dev, B, 16, L + 64):
            us = _graph_us(functools.partial(decode_attention, q, k, v, *lens, 0.125, splits, bn))
            rows.append(dict(B=B, L=L, num_splits=splits, block_n=bn, default=(splits == base and bn == 64),
                             us=us, gb_s=gb / (us * 1e-6)))
    log("| B | context | num_splits | BLOCK_N | µs / call | GB/s | |\n|---|---|---|---|---|---|---|")
    for r in rows:
        log(f"| {r['B']} | {r['L']} | {r['num_splits']} | {r['block_n']} | {r['us']:.1f} | {r['gb_s']:.0f} | "
            f"{'default' if r['default'] else ''} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    args = bench_parser(__doc__.splitlines()[0], budget_s=DECODE_ATTENTION_BUDGET_S).parse_args(argv)
    s = BenchSettings.from_args(args)
    t0 = time.time()
    log("## decode attention: correctness against the float32 reference")
    results = {"correctness": correctness(s)}
    log("\n## decode attention: launch sweep (CUDA graph of 20 calls, H = 16, D = 64, bf16)")
    results["sweep"] = sweep(s)
    s.write_json("decode_attention_ops.json", results)
    log(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
