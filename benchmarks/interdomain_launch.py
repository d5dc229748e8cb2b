"""Launch configurations of the Interdomain Triton op at given shapes, forward and forward+backward, beside causal
SDPA of the same heads (GPU only):

    python -m benchmarks.interdomain_launch [--shapes 16x2048x8 1x4096x16 1x32768x16] [--variants default split_w8 ...]
    python -m benchmarks.interdomain_launch --variants default --fla    # + fla's chunked GLA and linear attention
    TRITON_INTERPRET=1 python -m benchmarks.interdomain_launch --dryrun --variants default bf16_dots

Shapes are B×T×H with R = D = M = 64 (the `small` training step is 16×2048×8; the op target is 1×T×16). Every variant
is first checked against the default configuration on the same inputs (relative RMS of o and of the 6 gradients;
the default itself is checked against float64 by tests/ops and benchmarks/interdomain_ops.py). SDPA is timed first
at each shape, so the GPU is warm before the first variant. Prints one table: milliseconds (median of
``triton.testing.do_bench``), SDPA's time over the variant's (``vs SDPA``; > 1: faster) and the forward+backward's
per-stage split (CUDA events around each launch group: state scans, chunk kernels, host-side reductions).
``--dryrun`` (or ``BENCH_DRYRUN=1``) with
``TRITON_INTERPRET=1``: every variant once at a tiny shape on the CPU (R = D = M = 16) against the default, no
timings: a smoke test of the variants, not a measurement. ``--fla`` adds rows for flash-linear-attention's
``chunk_gla`` (per-channel decays) and ``chunk_linear_attn`` at the same B×T×H with K = V = 64, bf16, when fla is
installed (an optional comparison baseline); a backward that raises is reported as such, with the forward's time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch
import torch.nn.functional as F

from benchmarks.common import require_cuda
from benchmarks.interdomain_ops import make_inputs, make_params

VARIANTS = {
    "default": {},
    "fused_w8": {"bwd_split": False, "warps_chunk_bwd": 8},
    "fused_w4": {"bwd_split": False, "warps_chunk_bwd": 4},
    "split_w8": {"warps_chunk_bwd": 8},
    "stages2": {"stages": 2},
    "fwd_w8": {"warps_chunk_fwd": 8},
    "L64_BC32": {"max_chunk": 64},
    "scan_c16": {"BCH": 16},
    "scan_m16_c16": {"BMS": 16, "BCH": 16},
    "recompute_states": {"save_states": False},
    "bf16_dots": {"chunk_dots": "bf16"},
    "fp32_dots": {"chunk_dots": "fp32"},
    "bf16_dots_bwd_w8": {"chunk_dots": "bf16", "warps_chunk_bwd": 8},
    "bf16_dots_w8": {"chunk_dots": "bf16", "warps_chunk_fwd": 8, "warps_chunk_bwd": 8},
    "bf16_states": {"state_dtype": "bf16"},
    "bf16_buffers": {"buffer_dtype": "bf16"},
    "fp32_buffers": {"buffer_dtype": "fp32"},
    "fp32_states": {"state_dtype": "fp32"},
    "bf16_dots_states_w8": {"chunk_dots": "bf16", "state_dtype": "bf16", "warps_chunk_fwd": 8, "warps_chunk_bwd": 8},
    "L64_BC64_w8": {"max_chunk": 64, "BC": 64, "warps_chunk_fwd": 8, "warps_chunk_bwd": 8},
    "bf16_dots_L64_BC64_w8": {"chunk_dots": "bf16", "max_chunk": 64, "BC": 64, "warps_chunk_fwd": 8,
                              "warps_chunk_bwd": 8},
}


def _shape(text: str) -> tuple[int, int, int]:
    try:
        b, t, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes takes BxTxH such as 16x2048x8, got {text!r}") from None
    return b, t, h


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = torch.view_as_real(a) if a.is_complex() else a, torch.view_as_real(b) if b.is_complex() else b
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _sdpa_ms(B: int, T: int, H: int, d: int, dev: torch.device) -> float:
    """Causal SDPA forward+backward at B x H x T x d, bf16, median ms (its long warm-up also brings the clocks up)."""
    from triton.testing import do_bench

    qs, ks, vs = (torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dos = torch.randn(B, H, T, d, device=dev, dtype=torch.bfloat16)
    return do_bench(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).backward(dos),
                    warmup=25, rep=100, grad_to_none=[qs, ks, vs], return_mode="median")


def _fla_rows(B: int, T: int, H: int, d: int, sdpa: float) -> list[dict]:
    """fla's chunked GLA and plain chunked linear attention at B×T×H×d, bf16: forward and forward+backward ms."""
    from triton.testing import do_bench

    try:
        from fla.ops.gla import chunk_gla
        from fla.ops.linear_attn import chunk_linear_attn
    except ImportError:
        print("fla is not installed: no fla rows", flush=True)
        return []
    q, k, v = (torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    g = F.logsigmoid(torch.randn(B, T, H, d, device="cuda")).div(16).to(torch.bfloat16).requires_grad_()
    do = torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16)
    ops = {"fla chunk_gla": (lambda: chunk_gla(q, k, v, g)[0], [q, k, v, g]),
           "fla chunk_linear_attn": (lambda: chunk_linear_attn(q, k, v, normalize=False)[0], [q, k, v])}
    rows = []
    for name, (fn, leaves) in ops.items():
        with torch.no_grad():
            fwd = do_bench(fn, warmup=5, rep=40, return_mode="median")
        try:
            fb = do_bench(lambda fn=fn: fn().backward(do), warmup=5, rep=40, return_mode="median", grad_to_none=leaves)
        except Exception as e:  # noqa: BLE001 - a baseline's failure is reported, not fatal
            print(f"{name}: backward raised {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            fb = None
        rows.append({"shape": f"{B}x{T}x{H}", "variant": name, "sdpa_fb_ms": sdpa, "max_rel_vs_default": None,
                     "fwd_ms": fwd, "fb_ms": fb, "stages_ms": {}})
        print(rows[-1], flush=True)
    return rows


def _one_shape(B: int, T: int, H: int, variants: list[str], dryrun: bool = False, fla: bool = False) -> list[dict]:
    """The rows of one shape: every variant's error vs the default, forward and forward+backward ms, and SDPA's
    (``dryrun``: on the CPU at R = D = M = 16, the errors only)."""
    from triton.testing import do_bench

    from benchmarks.profiling import StageProfiler
    from hybrid_attention.ops.interdomain.triton.config import DEFAULT_CONFIG
    from hybrid_attention.ops.interdomain.triton.ops import triton_interdomain

    dev = torch.device("cpu" if dryrun else "cuda")
    R = D = M = 16 if dryrun else 64
    sdpa = None if dryrun else _sdpa_ms(B, T, H, R, dev)

    def bench(fn, **kw) -> float | None:
        return None if dryrun else do_bench(fn, warmup=5, rep=40, return_mode="median", **kw)

    log_lam, Bp, C = make_params(H, M, 7, dev)
    leaves = [t.to(torch.complex64).requires_grad_() for t in (log_lam, Bp, C)]
    q, k, v = (t.requires_grad_() for t in make_inputs(B, T, H, R, D, 5, dev))
    do = torch.randn(B, T, H, D, device=dev, dtype=torch.bfloat16)
    inputs = [q, k, v, *leaves]
    rows, ref = [], None
    for name in variants:
        cfg = dataclasses.replace(DEFAULT_CONFIG, **VARIANTS[name])

        def fwd(cfg=cfg):
            with torch.no_grad():
                return triton_interdomain(q, k, v, *leaves, config=cfg)[0]

        def fwdbwd(cfg=cfg):
            triton_interdomain(q, k, v, *leaves, config=cfg)[0].backward(do)

        for t in inputs:
            t.grad = None
        o = triton_interdomain(q, k, v, *leaves, config=cfg)[0]
        o.backward(do)
        got = [o.detach()] + [t.grad.detach().clone() for t in inputs]
        ref = ref or got
        prof = StageProfiler()
        for _ in range(0 if dryrun else 3):  # per-stage CUDA events: nothing to record on the CPU
            triton_interdomain(q, k, v, *leaves, config=cfg, hooks=prof)[0].backward(do)
        rows.append({"shape": f"{B}x{T}x{H}", "variant": name, "sdpa_fb_ms": sdpa,
                     "max_rel_vs_default": max(_rel(a, b) for a, b in zip(got, ref)),
                     "fwd_ms": bench(fwd), "fb_ms": bench(fwdbwd, grad_to_none=inputs),
                     "stages_ms": {s: round(t / 3, 3) for s, t in prof.summary().items()}})
        print(rows[-1], flush=True)
    return rows + (_fla_rows(B, T, H, R, sdpa) if fla and not dryrun else [])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", type=_shape, nargs="+", default=[(16, 2048, 8), (1, 4096, 16), (1, 32768, 16)])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--dryrun", action="store_true", default=os.environ.get("BENCH_DRYRUN") == "1",
                   help="every variant once at a tiny shape on the CPU (needs TRITON_INTERPRET=1), no timings")
    p.add_argument("--fla", action="store_true", help="add fla's chunk_gla and chunk_linear_attn rows (fla installed)")
    args = p.parse_args(argv)
    require_cuda(args.dryrun)
    if args.dryrun:
        from hybrid_attention.ops.common.triton import interpreting

        if not interpreting():
            raise SystemExit("error: --dryrun runs the kernels on the CPU and needs TRITON_INTERPRET=1")
        args.shapes = [(2, 45, 2)]  # a partial last chunk of 32
    rows = []
    for B, T, H in args.shapes:
        rows += _one_shape(B, T, H, args.variants, args.dryrun, args.fla)
        if not args.dryrun:
            torch.cuda.empty_cache()
    print("| B×T×H | variant | max rel vs default | fwd ms | fwd+bwd ms | SDPA fwd+bwd ms | vs SDPA "
          "| fwd+bwd stages ms |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["stages_ms"].items(), key=lambda kv: -kv[1]))
        err = "-" if r["max_rel_vs_default"] is None else f"{r['max_rel_vs_default']:.1e}"
        if r["fwd_ms"] is None:  # a dry run: no timings
            print(f"| {r['shape']} | {r['variant']} | {err} | - | - | - | - | - |")
            continue
        fb, ratio = ("-", "-") if r["fb_ms"] is None else (f"{r['fb_ms']:.3f}", f"{r['sdpa_fb_ms'] / r['fb_ms']:.2f}×")
        print(f"| {r['shape']} | {r['variant']} | {err} | {r['fwd_ms']:.3f} | {fb} | {r['sdpa_fb_ms']:.3f} | {ratio} "
              f"| {stages} |")


if __name__ == "__main__":
    main()
