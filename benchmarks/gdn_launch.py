"""Launch configurations of the Triton gated delta rule at given shapes, forward and forward+backward, beside causal
SDPA of the same heads, with each kernel's share (GPU only):

    python -m benchmarks.gdn_launch [--shapes 16x2048x8x64x128 4x4096x6x128x256] [--variants default par_w8 ...]
    TRITON_INTERPRET=1 python -m benchmarks.gdn_launch --dryrun      # every variant once on the CPU, no timings

Shapes are B×T×H×K×V, chunk 64, bf16 activations, no commit mask: ``16x2048x8x64x128`` is the GDN layer of the `small`
training step, ``4x4096x6x128x256`` the layer of gdn-340m at 4×4096. Every variant is checked against the default
configuration on the same inputs (relative RMS of o and of the five gradients; the default itself is checked against
float64 by tests/ops). Milliseconds are medians of ``triton.testing.do_bench``; ``vs SDPA`` is SDPA's forward+backward
time (causal, head dim K) over the variant's; the kernel split is the profiler's CUDA time per kernel over 3
forward+backward calls. ``--glue`` adds the layer's glue that the op's kernels could absorb, compiled as in the training
step (inductor): the decay g and β from their projections, and the output RMSNorm with the swish gate, each
forward+backward (inductor's fusion, the ``ops.gated_norm`` Triton op and fla's ``FusedRMSNormGated`` when fla is
installed; eager too): the ceiling of what fusing it into the op's prep and output kernels saves; and the fused input
projection at its width and padded to a multiple of 64. ``--norm-tiles`` sweeps the output norm op's tile size and
backward program count. The variants change launch settings of ``DEFAULT_CONFIG`` (``previous``: the launch before the
pipelining stages of the output, bwd_local and key-side backward kernels), each compiling without spills at both shapes
but ``bwdk_bk128`` (``benchmarks/aot_regs_gdn.py --set ...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch
import torch.nn.functional as F

from benchmarks.common import kernel_split, rel_rms, require_cuda

VARIANTS = {
    "default": {},
    "previous": {"par_stages": 1, "bwdk_bv": 64, "bwdk_stages": 1},  # the launch before the pipelining stages
    "narrow_state": {"seq_wide_grid": 0},
    "wide_state": {"seq_wide_grid": 1},
    "fin_bk32": {"fin_bk": 32},
    "par_w8": {"par_warps": 8},
    "par_bv128_w8": {"par_bv": 128, "par_warps": 8},
    "seqb_w4": {"seqb_warps": 4},
    "fin_w8": {"fin_warps": 8},
    "fin_bv64": {"fin_bv": 64},
    "fin_bv64_w8": {"fin_bv": 64, "fin_warps": 8},
    "bwd_local": {"local_dv": "bwd_local"},  # bwd_local writes dvn_local, [T, V] float32, for the state backward
    "bwdk_bf16": {"bwdk_dots": "bf16"},  # bwd_k's products on bf16 operands, dh stored bf16
    "bwdk_bv64_s1": {"bwdk_bv": 64, "bwdk_stages": 1},  # the key-side backward without pipelining
    "bwdk_bv64_s2": {"bwdk_bv": 64, "bwdk_stages": 2},
    "bwdk_bk128": {"bwdk_bk": 128, "bwdk_stages": 1},  # one K slice: dO, vn, dvn read once; spills for sm_90
    "fin_s2": {"fin_stages": 2},
    "fin_w8_s2": {"fin_warps": 8, "fin_stages": 2},
    "par_s1": {"par_stages": 1},  # output and bwd_local without pipelining
    "prep_s2": {"prep_stages": 2},
}


def _shape(text: str) -> tuple[int, int, int, int, int]:
    try:
        b, t, h, k, v = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shapes takes BxTxHxKxV such as 16x2048x8x64x128, got {text!r}") from None
    return b, t, h, k, v


def _sdpa_ms(B: int, T: int, H: int, d: int) -> float:
    """Causal SDPA forward+backward at B × H × T × d, bf16, median ms (its warm-up also brings the clocks up)."""
    from triton.testing import do_bench

    qs, ks, vs = (torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16).requires_grad_() for _ in range(3))
    dos = torch.randn(B, H, T, d, device="cuda", dtype=torch.bfloat16)
    return do_bench(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).backward(dos),
                    warmup=25, rep=100, grad_to_none=[qs, ks, vs], return_mode="median")


def _projection(H: int, K: int, V: int) -> tuple[int, int]:
    """(model width, ``project_inputs`` product width) of the GDN layer with these heads: the model width of the
    `small` or gdn-340m preset whose GDN heads they are, else H·K; the product's width from the layer's projections."""
    from hybrid_attention.layers.gated_deltanet import GatedDeltaNet
    from hybrid_attention.models.configuration import PRESETS

    hidden = next((p["hidden_size"] for p in (PRESETS["small"], PRESETS["gdn-340m"])
                   if (p["num_heads"], p["head_dim"]) == (H, K)), H * K)
    layer = GatedDeltaNet(hidden, num_heads=H, head_dim=K, expand_v=V / K)
    return hidden, sum(lin.out_features for lin in layer._linears().values())


def _norm_tile_rows(B: int, T: int, H: int, V: int) -> list[dict]:
    """Forward+backward ms of the ``ops.gated_norm`` Triton op at the output norm's shape for each tile size (values
    per program, ``ops.ELEMENTS``) and backward program count (``ops.BWD_PROGRAMS``); the module's values are restored
    afterwards."""
    from triton.testing import do_bench

    from hybrid_attention.ops.gated_norm import triton_gated_rms_norm
    from hybrid_attention.ops.gated_norm.triton import ops as norm_ops

    dev, act = "cuda", torch.bfloat16
    x, gate = (torch.randn(B, T, H, V, device=dev, dtype=act).requires_grad_() for _ in range(2))
    weight = torch.ones(V, device=dev, requires_grad=True)
    dy = torch.randn_like(x)
    saved, rows = (norm_ops.ELEMENTS, norm_ops.BWD_PROGRAMS), []
    try:
        for elements in (2048, 4096, 8192):
            for programs in (512, 1024, 2048):
                norm_ops.ELEMENTS, norm_ops.BWD_PROGRAMS = elements, programs
                fn = lambda: triton_gated_rms_norm(x, gate, weight).backward(dy)  # noqa: E731
                fn()
                rows.append({"shape": f"{B}x{T}x{H}x{V}", "variant": f"norm tiles: {elements} values, "
                             f"{programs} backward programs" + (" (default)" if (elements, programs) == saved else ""),
                             "sdpa_fb_ms": None, "max_rel_vs_default": None, "kernels_ms": {},
                             "fb_ms": do_bench(fn, warmup=5, rep=40, return_mode="median",
                                               grad_to_none=[x, gate, weight])})
                print(rows[-1], flush=True)
    finally:
        norm_ops.ELEMENTS, norm_ops.BWD_PROGRAMS = saved
    return rows


def _glue_rows(B: int, T: int, H: int, K: int, V: int) -> list[dict]:
    """Forward+backward ms of the GDN layer's glue around the op: g and β from the a / b projections (``gdn_decay``,
    the sigmoid) compiled alone; the head RMSNorm times swish(W_g x) on o, compiled, as the Triton op, eager and as
    fla's when installed; and the fused input projection at its width and padded to a multiple of 64."""
    from triton.testing import do_bench

    from hybrid_attention.layers.gated_deltanet import gdn_decay, init_decay_params
    from hybrid_attention.modules import RMSNorm
    from hybrid_attention.ops.gated_norm import gated_rms_norm

    dev, act = "cuda", torch.bfloat16
    a_log, dt_bias = torch.empty(H, device=dev), torch.empty(H, device=dev)
    init_decay_params(a_log, dt_bias)
    a_log.requires_grad_(), dt_bias.requires_grad_()
    norm = RMSNorm(V).to(dev)
    a, b = (torch.randn(B, T, H, device=dev, dtype=act).requires_grad_() for _ in range(2))
    o, gate = (torch.randn(B, T, H * V, device=dev, dtype=act).requires_grad_() for _ in range(2))
    dgb = [torch.randn(B, T, H, device=dev) for _ in range(2)]
    dy = torch.randn(B, T, H, V, device=dev, dtype=act)

    @torch.compile
    def gates():
        return gdn_decay(a, a_log, dt_bias), torch.sigmoid(b.float())

    def out_norm_eager():
        return norm(o.view(B, T, H, V)) * F.silu(gate.view(B, T, H, V))

    out_norm = torch.compile(out_norm_eager)

    @torch.compile
    def out_norm_triton():
        return gated_rms_norm(o.view(B, T, H, V), gate.view(B, T, H, V), norm.weight, norm.eps, backend="triton")

    norm_leaves = [o, gate, *norm.parameters()]
    jobs = {"glue: g, β": (lambda: torch.autograd.backward(gates(), dgb), [a, b, a_log, dt_bias]),
            "glue: output norm ⊙ swish gate": (lambda: out_norm().backward(dy), norm_leaves),
            "glue: output norm ⊙ swish gate, triton": (lambda: out_norm_triton().backward(dy), norm_leaves),
            "glue: output norm ⊙ swish gate, eager": (lambda: out_norm_eager().backward(dy), norm_leaves)}
    # project_inputs' one product (q, k, v, g and the a / b columns) at its own width and padded to a multiple of 64,
    # float32 weights under bf16 autocast as in the step
    hidden, width = _projection(H, K, V)
    xs = torch.randn(B * T, hidden, device=dev, dtype=act, requires_grad=True)
    for w in sorted({width, width + (-width % 64)}):
        wt = torch.randn(w, hidden, device=dev, requires_grad=True)
        dz = torch.randn(B * T, w, device=dev, dtype=act)

        def proj(wt=wt, dz=dz):
            with torch.autocast("cuda", dtype=act):
                F.linear(xs, wt).backward(dz)

        jobs[f"glue: fused input projection, {hidden} -> {w}"] = (proj, [xs, wt])
    try:
        from fla.modules import FusedRMSNormGated

        fla_norm = FusedRMSNormGated(V, eps=norm.eps).to(dev)
        jobs["glue: fla FusedRMSNormGated"] = (
            lambda: fla_norm(o.view(B, T, H, V), gate.view(B, T, H, V)).backward(dy), [o, gate, fla_norm.weight])
    except ImportError:
        print("fla is not installed: no FusedRMSNormGated row", flush=True)
    rows = []
    for name, (fn, leaves) in jobs.items():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - a baseline's failure is reported, not fatal
            print(f"{name}: raised {type(e).__name__}: {str(e).splitlines()[0][:160]}", flush=True)
            continue
        rows.append({"shape": f"{B}x{T}x{H}x{K}x{V}", "variant": name, "sdpa_fb_ms": None, "max_rel_vs_default": None,
                     "fb_ms": do_bench(fn, warmup=5, rep=40, return_mode="median", grad_to_none=leaves),
                     "kernels_ms": kernel_split(fn, leaves)})
        print(rows[-1], flush=True)
    return rows


def _one_shape(B: int, T: int, H: int, K: int, V: int, variants: list[str], dryrun: bool) -> list[dict]:
    """The rows of one shape: every variant's error vs the default, forward and forward+backward ms, the kernel split
    and SDPA's time (``dryrun``: the errors only, on the CPU)."""
    from triton.testing import do_bench

    from hybrid_attention.ops.gated_delta.triton import triton_gated_delta
    from hybrid_attention.ops.gated_delta.triton.config import DEFAULT_CONFIG

    dev = torch.device("cpu" if dryrun else "cuda")
    act = torch.float32 if dryrun else torch.bfloat16  # the interpreter runs fp32
    gen = torch.Generator(device=dev).manual_seed(3)
    q, k = (torch.randn(B, T, H, K, device=dev, generator=gen).to(act).requires_grad_() for _ in range(2))
    v = torch.randn(B, T, H, V, device=dev, generator=gen).to(act).requires_grad_()
    g = (-0.1 * torch.rand(B, T, H, device=dev, generator=gen)).requires_grad_()
    beta = torch.rand(B, T, H, device=dev, generator=gen).requires_grad_()
    do = torch.randn(B, T, H, V, device=dev, generator=gen).to(act)
    inputs = [q, k, v, g, beta]
    sdpa = None if dryrun else _sdpa_ms(B, T, H, K)
    rows, ref = [], None
    for name in variants:
        cfg = dataclasses.replace(DEFAULT_CONFIG, **VARIANTS[name])

        def fwd(cfg=cfg):
            with torch.no_grad():
                return triton_gated_delta(q, k, v, g, beta, config=cfg)[0]

        def fwdbwd(cfg=cfg):
            triton_gated_delta(q, k, v, g, beta, config=cfg)[0].backward(do)

        for t in inputs:
            t.grad = None
        o = triton_gated_delta(q, k, v, g, beta, config=cfg)[0]
        o.backward(do)
        got = [o.detach()] + [t.grad.detach().clone() for t in inputs]
        ref = ref or got
        row = {"shape": f"{B}x{T}x{H}x{K}x{V}", "variant": name, "sdpa_fb_ms": sdpa,
               "max_rel_vs_default": max(rel_rms(a.float(), b.float()) for a, b in zip(got, ref))}
        if not dryrun:
            row |= {"fwd_ms": do_bench(fwd, warmup=5, rep=40, return_mode="median"),
                    "fb_ms": do_bench(fwdbwd, warmup=5, rep=40, return_mode="median", grad_to_none=inputs),
                    "kernels_ms": kernel_split(fwdbwd, inputs)}
        rows.append(row)
        print(row, flush=True)
    return rows


def _table(rows: list[dict]) -> None:
    print("| B×T×H×K×V | variant | max rel vs default | fwd ms | fwd+bwd ms | SDPA fwd+bwd ms | vs SDPA | kernels ms |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        err = "-" if r["max_rel_vs_default"] is None else f"{r['max_rel_vs_default']:.1e}"
        if r["sdpa_fb_ms"] is None and "fb_ms" in r:  # a glue row: forward+backward only
            top = sorted(r["kernels_ms"].items(), key=lambda kv: -kv[1])[:4]
            split = ", ".join(f"{k[:40]} {v:.3f}" for k, v in top)
            print(f"| {r['shape']} | {r['variant']} | - | - | {r['fb_ms']:.3f} | - | - | {split} |")
            continue
        if "fwd_ms" not in r:  # a dry run: no timings
            print(f"| {r['shape']} | {r['variant']} | {err} | - | - | - | - | - |")
            continue
        split = ", ".join(f"{k} {v:.3f}" for k, v in sorted(r["kernels_ms"].items(), key=lambda kv: -kv[1])[:8])
        print(f"| {r['shape']} | {r['variant']} | {err} | {r['fwd_ms']:.3f} | {r['fb_ms']:.3f} | "
              f"{r['sdpa_fb_ms']:.3f} | {r['sdpa_fb_ms'] / r['fb_ms']:.2f}× | {split} |")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", type=_shape, nargs="+", default=[(16, 2048, 8, 64, 128), (4, 4096, 6, 128, 256)])
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--glue", action="store_true",
                   help="add the layer's g / β, output-norm and input-projection glue rows")
    p.add_argument("--norm-tiles", action="store_true", help="add the output-norm op's tile sweep")
    p.add_argument("--dryrun", action="store_true", default=os.environ.get("BENCH_DRYRUN") == "1",
                   help="every variant once at a tiny shape on the CPU (needs TRITON_INTERPRET=1), no timings")
    args = p.parse_args(argv)
    require_cuda(args.dryrun)
    if args.dryrun:
        from hybrid_attention.ops.common.triton import interpreting

        if not interpreting():
            raise SystemExit("error: --dryrun runs the kernels on the CPU and needs TRITON_INTERPRET=1")
        args.shapes = [(1, 80, 2, 32, 64)]  # a partial last chunk of 64
    rows = []
    try:
        for shape in args.shapes:
            rows += _one_shape(*shape, args.variants, args.dryrun)
            rows += _glue_rows(*shape) if args.glue and not args.dryrun else []
            rows += _norm_tile_rows(*shape[:3], shape[4]) if args.norm_tiles and not args.dryrun else []
            if not args.dryrun:
                torch.cuda.empty_cache()
    finally:  # the rows measured so far, also when a variant raises
        _table(rows)


if __name__ == "__main__":
    main()
