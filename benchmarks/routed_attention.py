"""NAtS-L's routed softmax branch (``triton_chunk_attention``) against causal SDPA per unit of work (GPU only):

    python -m benchmarks.routed_attention [--shapes 4x4096x12x64x128 16x2048x16x32x64] [--fractions 0.3 1]
                                          [--variants default one_pass ...]
    TRITON_INTERPRET=1 python -m benchmarks.routed_attention --dryrun     # every variant once on the CPU

Shapes are B×T×Hs×Dk×Dv with decision groups of 2 heads and chunk 64, bf16: ``4x4096x12x64x128`` is the softmax branch
of natsl-hybrid-340m's NAtS-L layer at 4×4096, ``16x2048x16x32x64`` that of the `small` natsl layer. Each chunk is
routed to softmax with probability ``fraction`` (a fixed draw per shape); the routing bias takes a gradient, as in
training. A query reads its own chunk causally and every earlier routed chunk, so the attended (query, key) pairs P
count the work: forward FLOPs 2·P·(Dk + Dv), forward+backward 3.5× that (two products forward, five backward).
``TFLOP/s`` divides those by the median ``triton.testing.do_bench`` time; SDPA is causal at the same B, T, Hs with
head dim Dk for q, k and Dv for v where a fused backend takes it (else head dim Dv throughout), counted the same way.
``vs SDPA`` is the routed kernel's TFLOP/s over SDPA's: 1.0 is FlashAttention's efficiency per routed chunk. The
kernel columns sum the profiler's CUDA kernel time per call (``_kernel_ms``: without the host's launch gaps, which
``do_bench`` counts when the op runs alone).
The variants change ``chunk_attention.triton.DEFAULT_CONFIG`` (``VARIANTS``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import torch
import torch.nn.functional as F

from benchmarks.common import kernel_split, require_cuda

VARIANTS = {
    "default": {},
    "one_pass": {"bwd_mode": "one_pass"},  # dq by fp32 atomics from the dk/dv programs
    "fwd_w8": {"fwd_warps": 8},
    "fwd_qc2": {"fwd_qc": 2, "fwd_warps": 8},  # 128 query rows per forward program
    "dq_qc2": {"dq_qc": 2, "dq_warps": 8},
    "dkv_w8": {"dkv_warps": 8},
}
GROUP, CHUNK = 2, 64


def _shape(text: str) -> tuple[int, int, int, int, int]:
    try:
        b, t, h, dk, dv = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--shapes takes BxTxHsxDkxDv such as 4x4096x12x64x128, got {text!r}") from None
    return b, t, h, dk, dv


def attended_pairs(routing: torch.Tensor, T: int, C: int, group: int) -> int:
    """(query, key) pairs read over all heads: each query its own chunk up to itself plus C keys per earlier chunk
    routed for its decision group. routing: [B, N, Hs // group] of 0 / 1."""
    B, N, Hn = routing.shape
    lengths = torch.full((N,), C, dtype=torch.float64)
    lengths[-1] = T - (N - 1) * C
    own = (lengths * (lengths + 1) / 2).sum() * B * Hn
    earlier = routing.double().cumsum(1) - routing.double()  # routed chunks before chunk n
    cross = (earlier * lengths[None, :, None]).sum() * C
    return int((own + cross).item()) * group


def _time(fn, leaves: list[torch.Tensor], dryrun: bool) -> float:
    if dryrun:
        fn()
        return float("nan")
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=60, grad_to_none=leaves, return_mode="median")


def _sdpa_at(B: int, T: int, H: int, dk: int, d_v: int, dev: str, dryrun: bool) -> tuple[float, float]:
    """(fwd ms, f+b ms) of causal SDPA with q, k of head dim dk and v of head dim d_v."""
    q, k = (torch.randn(B, H, T, dk, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, T, d_v, device=dev, dtype=torch.bfloat16).requires_grad_()
    do = torch.randn(B, H, T, d_v, device=dev, dtype=torch.bfloat16)
    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    with torch.no_grad():
        fwd_ms = _time(fwd, [], dryrun)
    return fwd_ms, _time(lambda: fwd().backward(do), [q, k, v], dryrun)


def _sdpa(B: int, T: int, H: int, dk: int, dv: int, dev: str, dryrun: bool) -> tuple[float, float, int]:
    """(fwd ms, f+b ms, v head dim used) of causal SDPA; v takes head dim dv where the backend allows it, else dk."""
    try:
        return (*_sdpa_at(B, T, H, dk, dv, dev, dryrun), dv)
    except RuntimeError:
        return (*_sdpa_at(B, T, H, dk, dk, dev, dryrun), dk)


def _kernel_ms(fn, leaves: list[torch.Tensor], dryrun: bool) -> float:
    """GPU kernel time per call of fn (``common.kernel_split`` summed): the op's small host-side launches (the
    routing lists) leave the GPU idle between kernels when the op runs alone, which ``do_bench``'s wall time counts
    and a training step, whose host runs ahead of the GPU, hides."""
    if dryrun:
        return float("nan")
    fn()
    torch.cuda.synchronize()
    return sum(kernel_split(fn, leaves).values())


def _routed_ms(q, k, v, do, routing, bias, cfg, dryrun: bool) -> tuple[float, float, float, float]:
    """(fwd ms, f+b ms, fwd kernel ms, f+b kernel ms) of the routed branch with launch configuration cfg."""
    from hybrid_attention.ops.chunk_attention.triton import triton_chunk_attention

    fwd = lambda: triton_chunk_attention(q, k, v, routing, chunk_size=CHUNK, group_size=GROUP,  # noqa: E731
                                         routing_bias=bias, config=cfg)
    fb = lambda: fwd().backward(do)  # noqa: E731
    with torch.no_grad():
        fwd_ms = _time(fwd, [], dryrun)
        fwd_k = _kernel_ms(fwd, [], dryrun)
    return fwd_ms, _time(fb, [q, k, v, bias], dryrun), fwd_k, _kernel_ms(fb, [q, k, v, bias], dryrun)


def run(shapes, fractions, variants, dryrun: bool) -> list[dict]:
    """One SDPA row per shape, then one row per (routed fraction, variant): wall and kernel ms, TFLOP/s and the
    ratios to SDPA (or the error of a launch that failed)."""
    from hybrid_attention.ops.chunk_attention.triton import DEFAULT_CONFIG

    dev = "cpu" if dryrun else "cuda"
    act = torch.float32 if dryrun else torch.bfloat16
    rows = []
    for B, T, H, dk, dv in shapes:
        shape = f"{B}x{T}x{H}x{dk}x{dv}"
        N = math.ceil(T / CHUNK)
        gen = torch.Generator().manual_seed(T + H)
        fwd_s, fb_s, dv_s = _sdpa(B, T, H, dk, dv, dev, dryrun)
        pairs_causal = B * H * T * (T + 1) // 2
        sdpa_flops = 2 * pairs_causal * (dk + dv_s)
        sdpa = {"fwd": sdpa_flops / fwd_s / 1e9, "fb": 3.5 * sdpa_flops / fb_s / 1e9}
        rows.append({"shape": shape, "fraction": 1.0, "variant": f"SDPA causal (v dim {dv_s})",
                     "fwd_ms": fwd_s, "fb_ms": fb_s, "fwd_tflops": sdpa["fwd"], "fb_tflops": sdpa["fb"]})
        print(rows[-1], flush=True)
        q, k = (torch.randn(B, T, H, dk, device=dev, dtype=act).requires_grad_() for _ in range(2))
        v = torch.randn(B, T, H, dv, device=dev, dtype=act).requires_grad_()
        do = torch.randn(B, T, H, dv, device=dev, dtype=act)
        for fraction in fractions:
            routing = (torch.rand(B, N, H // GROUP, generator=gen) < fraction).float().to(dev)
            bias = torch.zeros(B, N, H // GROUP, device=dev, requires_grad=True)
            pairs = attended_pairs(routing.cpu(), T, CHUNK, GROUP)
            flops = 2 * pairs * (dk + dv)
            for name in variants:
                cfg = dataclasses.replace(DEFAULT_CONFIG, **VARIANTS[name])
                try:
                    f_ms, fb_ms, f_k, fb_k = _routed_ms(q, k, v, do, routing, bias, cfg, dryrun)
                except Exception as exc:  # a launch that fails is one row, not the run
                    rows.append({"shape": shape, "fraction": fraction, "variant": name,
                                 "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"})
                    print(rows[-1], flush=True)
                    continue
                r = {"shape": shape, "fraction": fraction, "variant": name, "fwd_ms": f_ms,
                     "fb_ms": fb_ms, "fwd_tflops": flops / f_ms / 1e9, "fb_tflops": 3.5 * flops / fb_ms / 1e9,
                     "fwd_kernel_ms": f_k, "fb_kernel_ms": fb_k, "work": pairs / pairs_causal}
                r["fwd_vs_sdpa"], r["fb_vs_sdpa"] = r["fwd_tflops"] / sdpa["fwd"], r["fb_tflops"] / sdpa["fb"]
                r["fb_kernel_vs_sdpa"] = 3.5 * flops / fb_k / 1e9 / sdpa["fb"]
                rows.append(r)
                print(r, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| B×T×Hs×Dk×Dv | fraction | variant | pairs vs causal | fwd ms | fwd TFLOP/s | f+b ms | f+b TFLOP/s | "
           "fwd vs SDPA | f+b vs SDPA | kernels fwd / f+b ms | f+b kernels vs SDPA |",
           "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['shape']} | {r['fraction']} | {r['variant']} | {r['error']} | | | | | | | | |")
            continue
        work = f"{r['work']:.2f}" if "work" in r else "1"
        vs = (f"{r['fwd_vs_sdpa']:.2f}× | {r['fb_vs_sdpa']:.2f}×" if "fwd_vs_sdpa" in r else "1 | 1")
        kern = (f"{r['fwd_kernel_ms']:.3f} / {r['fb_kernel_ms']:.3f} | {r['fb_kernel_vs_sdpa']:.2f}×"
                if "fb_kernel_ms" in r else " | ")
        out.append(f"| {r['shape']} | {r['fraction']} | {r['variant']} | {work} | {r['fwd_ms']:.3f} | "
                   f"{r['fwd_tflops']:.0f} | {r['fb_ms']:.3f} | {r['fb_tflops']:.0f} | {vs} | {kern} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="routed softmax branch vs causal SDPA per unit of work")
    p.add_argument("--shapes", nargs="+", type=_shape, default=None)
    p.add_argument("--fractions", nargs="+", type=float, default=[0.3, 1.0])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--dryrun", action="store_true", help="tiny shapes on the CPU (TRITON_INTERPRET=1), no timings")
    a = p.parse_args(argv)
    require_cuda(a.dryrun)
    for f in a.fractions:
        if not 0.0 <= f <= 1.0:
            raise SystemExit(f"error: --fractions takes values in [0, 1], got {f}")
    shapes = a.shapes or ([(1, 80, 4, 16, 32)] if a.dryrun else [(4, 4096, 12, 64, 128), (16, 2048, 16, 32, 64)])
    rows = run(shapes, a.fractions, a.variants, a.dryrun)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
