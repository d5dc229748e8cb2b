"""The causal short convolution on the GPU: the Triton op (``ops/causal_conv``) against ``ShortConvolution``'s
reference path, eager and under ``torch.compile``.

    python -m benchmarks.causal_conv [--sweep] [--quick] [--widths C ...]
    (or: hybrid-attention bench ops --only causal_conv)

``--quick``: the ``small`` shape only; ``--widths``: only these channel widths (e.g. the fused q|k|v convolutions,
``--widths 2048 3072``); ``--dryrun``: tiny shapes on the CPU (a smoke test of the script).

1. Correctness: bf16 x and initial state, float32 weight, SiLU, K = 4, at every timed shape and on packed documents
   (B = 1, the training shapes' tokens cut into documents of 1 to 600 tokens): the Triton op's output, final state and
   gradients of x, weight and the initial state against the float64 definition (``naive_causal_conv1d`` on float64
   copies), relative RMS error, for each backward form (``CausalConvConfig.bwd_form``: the default through the
   registered op, the others through the op's ``config=`` path, the tile forms at their own channel blocks,
   ``FORM_CONFIGS``); bar 1e-2 (bf16 rounding of y and dx). The reference
   module's own bf16 error of y and dx is printed beside it.
2. Timing (``triton.testing.do_bench``, median): forward and forward+backward of one ``ShortConvolution(C, 4,
   "silu")`` call on bf16 x [B, T, C] with its float32 weight, for backend "triton" (eager, and inside
   ``torch.compile``: the registered op is opaque) and "reference" (eager ``F.conv1d``; compiled: the K shifted
   products inductor fuses, the training path); "triton <form>": the op with the same weight and each backward form
   that is not the default (its ``config=`` path, an autograd Function over the same host code; the sweep times every
   form on that path). Shapes: ``small`` (B=16, T=2048; C = 512 for q, k and 1024 for v) and the 340M GDN layer
   (B=4, T=4096; C = 768 and 1536: 6 heads x 128 / 256), and each layer's fused q|k|v convolution (2048, 3072). fla's
   ``causal_conv1d`` is timed beside them when fla is installed.
3. ``--sweep``: launch configurations (``CausalConvConfig``: BT, BC, warps, forward and backward forms) of the
   Triton op, forward+backward at each shape (the eager path with the config).

Writes ``<--out>/causal_conv_gpu.json`` (default ``$OUT`` or .) and prints one table per section.
"""

from __future__ import annotations

import dataclasses

import torch

from benchmarks.common import BenchSettings, bench_parser, log, rel_rms, section
from benchmarks.common import bench_ms as bench
from hybrid_attention.modules import ShortConvolution
from hybrid_attention.ops.causal_conv import naive_causal_conv1d, triton_causal_conv1d
from hybrid_attention.ops.causal_conv.triton import DEFAULT_CONFIG, CausalConvConfig
from hybrid_attention.ops.causal_conv.triton.config import BWD_FORMS, TILE_BC, TILE_BC_BWD
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths

K = 4
BAR = 1e-2
SHAPES = {  # name -> (B, T, channel widths)
    False: {"small": (16, 2048, (512, 1024, 2048)), "340m": (4, 4096, (768, 1536, 3072))},
    True: {"tiny": (2, 37, (24,))},
}
FORM_CONFIGS = {  # "walk": the walking forward and backward; the tile forms at their largest spill-free blocks
    form: DEFAULT_CONFIG if form == DEFAULT_CONFIG.bwd_form else
    dataclasses.replace(DEFAULT_CONFIG, bwd_form=form, fwd_form="tile", BC=TILE_BC, BC_BWD=TILE_BC_BWD)
    for form in BWD_FORMS}
SWEEP = list(FORM_CONFIGS.values()) + [
    CausalConvConfig(BT=bt, BC=bc, BC_BWD=bcb, warps_fwd=wf, warps_bwd=wb, bwd_form=form)
    for bt, bc, bcb, wf, wb in ((64, 64, 64, 4, 8), (64, 64, 32, 4, 4), (32, 64, 64, 4, 4), (32, 128, 32, 4, 4),
                                (128, 64, 32, 8, 4), (16, 128, 128, 4, 4), (32, 64, 32, 4, 2), (64, 128, 128, 4, 8),
                                (128, 128, 64, 8, 8), (32, 256, 128, 4, 4), (256, 32, 32, 8, 8))
    for form in ("reload", "shifted")
] + [  # the walking kernels hold one [BC] row per lag, so their channel blocks go wider
    CausalConvConfig(BT=bt, BC=bc, BC_BWD=bcb, warps_fwd=wf, warps_bwd=wb, bwd_form="walk", fwd_form="walk")
    for bt, bc, bcb, wf, wb in ((32, 256, 256, 4, 4), (64, 256, 256, 4, 4), (64, 512, 256, 4, 4),
                                (128, 512, 512, 4, 8), (32, 128, 128, 4, 4), (64, 1024, 512, 8, 8))
]
DRY_SWEEP = [CausalConvConfig(BT=16, BC=16, BC_BWD=16, BC_STATE=16, bwd_form=form,
                              fwd_form="walk" if form == "walk" else "tile") for form in BWD_FORMS]


def _shapes(dryrun: bool, quick: bool, widths: list[int] | None = None) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """The shapes of this run: tiny ones for the dry run, only ``small`` with ``--quick``; with ``widths``, only those
    channel widths (a shape left without one is dropped)."""
    shapes = SHAPES[dryrun]
    shapes = {"small": shapes["small"]} if quick and not dryrun else shapes
    if widths and not dryrun:
        shapes = {n: (B, T, tuple(c for c in cs if c in widths)) for n, (B, T, cs) in shapes.items()}
        shapes = {n: v for n, v in shapes.items() if v[2]}
    return shapes


def _lengths(total: int, seed: int) -> list[int]:
    """Document lengths of 1 to 600 tokens summing to ``total`` (a seeded draw)."""
    g = torch.Generator().manual_seed(seed)
    out, left = [], total
    while left > 0:
        n = min(left, int(torch.randint(1, 601, (1,), generator=g)))
        out.append(n)
        left -= n
    return out


def _run(fn, leaves: list[torch.Tensor], dy: torch.Tensor, dfin: torch.Tensor | None) -> tuple:
    """(y, final, grads of leaves) of ``fn(*leaves)`` for the loss Σ y·dy (+ Σ final·dfin), in float64."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    y, fin = fn(*leaves)
    loss = (y.double() * dy.double()).sum()
    if dfin is not None:
        loss = loss + (fin.double() * dfin.double()).sum()
    return (y, fin, *torch.autograd.grad(loss, leaves))


def _check(dev: str, B: int, T: int, C: int, packed: bool, seed: int, form: str) -> dict:
    """Relative RMS errors against float64 of the Triton op with backward form ``form`` (bf16 x and init, fp32
    weight; float32 x in the dry run; the default form is the registered op) and of the reference module (y and dx)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    xdt = torch.bfloat16 if dev == "cuda" else torch.float32
    cu = None
    if packed:
        cu = cu_seqlens_from_lengths(_lengths(B * T, seed), device=dev)
        B, T = 1, B * T
    n = B if cu is None else cu.numel() - 1
    x = torch.randn(B, T, C, device=dev, generator=g).to(xdt)
    w = torch.randn(C, K, device=dev, generator=g) / K**0.5
    init = torch.randn(n, C, K - 1, device=dev, generator=g).to(xdt)
    dy = torch.randn(B, T, C, device=dev, generator=g).to(xdt)
    dfin = torch.randn(n, C, K - 1, device=dev, generator=g).to(xdt)
    kw = dict(activation="silu", output_final_state=True, cu_seqlens=cu)
    cfg = None if FORM_CONFIGS[form] == DEFAULT_CONFIG else FORM_CONFIGS[form]  # None: the registered op
    tri = _run(lambda a, b, c: triton_causal_conv1d(a, b, initial_state=c, config=cfg, **kw), [x, w, init], dy, dfin)
    ref = _run(lambda a, b, c: naive_causal_conv1d(a, b, initial_state=c, **kw),
               [x.double(), w.double(), init.double()], dy, dfin)
    errs = {name: rel_rms(a, b) for name, a, b in zip(("y", "final", "dx", "dweight", "dinit"), tri, ref, strict=True)}
    # the reference module in x's dtype (it rounds the weight to it), no final-state gradient: y and dx
    module = ShortConvolution(C, K, "silu").to(dev)
    with torch.no_grad():
        module.weight.copy_(w[:, None])
    state = None if packed else init
    mod = _run(lambda a: module(a, state, True, cu_seqlens=cu), [x], dy, None)
    f64 = _run(lambda a: naive_causal_conv1d(a, w.double(), activation="silu", output_final_state=True, cu_seqlens=cu,
                                             initial_state=None if packed else init.double()), [x.double()], dy, None)
    ref_errs = {"y": rel_rms(mod[0], f64[0]), "dx": rel_rms(mod[2], f64[2])}
    return {"errors": errs, "reference_errors": ref_errs, "pass": all(e < BAR for e in errs.values())}


@section("correctness")
def correctness(results: dict, s: BenchSettings, shapes: dict) -> None:
    log(f"\n== correctness vs float64 (bar {BAR:g}) ==")
    log(f"{'shape':10s} {'C':>5s} {'packed':>6s} {'bwd':>7s} "
        + " ".join(f"{n:>8s}" for n in ("y", "final", "dx", "dweight", "dinit")) + "  | ref y / dx")
    for i, (name, (B, T, widths)) in enumerate(shapes.items()):
        for C in widths:
            for packed in (False, True):
                for form in BWD_FORMS:
                    r = _check(s.device, B, T, C, packed, seed=100 * i + C + packed, form=form)
                    r.update(shape=name, B=B, T=T, C=C, packed=packed, bwd_form=form)
                    results["correctness"].append(r)
                    e, re_ = r["errors"], r["reference_errors"]
                    log(f"{name:10s} {C:5d} {packed!s:>6s} {form:>7s} " + " ".join(f"{v:8.1e}" for v in e.values())
                        + f"  | {re_['y']:.1e} / {re_['dx']:.1e}" + ("" if r["pass"] else "  FAIL"))


def _forms(C: int, dev: str, compile_backend: str, fla: bool) -> dict:
    """Form name -> (module whose weight the call reads, call x -> y): ShortConvolution(C, K, "silu") on each backend,
    eager and compiled, the Triton op with the backward form that is not the default (same weight), and fla's Triton
    ``causal_conv1d`` (eager) with the same weight where fla is installed (a comparison baseline)."""
    ref = ShortConvolution(C, K, "silu").to(dev)
    tri = ShortConvolution(C, K, "silu", backend="triton").to(dev)
    tri.load_state_dict(ref.state_dict())
    forms = {
        "triton": (tri, lambda x: tri(x)[0]),
        "triton compiled": (tri, torch.compile(lambda x: tri(x)[0], backend=compile_backend)),
        "reference eager": (ref, lambda x: ref(x)[0]),
        "reference compiled": (ref, torch.compile(lambda x: ref(x)[0], backend=compile_backend)),
    }
    for form, cfg in FORM_CONFIGS.items():
        if cfg != DEFAULT_CONFIG:
            forms[f"triton {form}"] = (tri, lambda x, cfg=cfg: triton_causal_conv1d(x, tri.weight[:, 0],
                                                                                   activation="silu", config=cfg)[0])
    try:
        from fla.modules.causal_conv1d import causal_conv1d as fla_conv
    except ImportError:
        fla = False
    if not fla:
        return forms
    forms["fla"] = (ref, lambda x: fla_conv(x, ref.weight[:, 0], activation="silu")[0])
    return forms


def _fwd_bwd(fn, x: torch.Tensor, dy: torch.Tensor):
    def run():
        fn(x).backward(dy)

    return run


@section("timing")
def timing(results: dict, s: BenchSettings, shapes: dict) -> None:
    log("\n== timing: one ShortConvolution(C, 4, 'silu') call, bf16 x, fp32 weight (ms, median) ==")
    log(f"{'shape':10s} {'B':>3s} {'T':>5s} {'C':>5s} {'form':20s} {'fwd':>8s} {'fwd+bwd':>8s} "
        f"{'vs ref compiled':>16s}")
    dev = s.device
    xdt = torch.bfloat16 if dev == "cuda" else torch.float32
    compile_backend = "aot_eager" if s.dryrun else "inductor"
    for name, (B, T, widths) in shapes.items():
        for C in widths:
            if s.budget_left() < 60:
                log("  budget spent: timing stopped")
                return
            x = torch.randn(B, T, C, device=dev, dtype=xdt, requires_grad=True)
            dy = torch.randn_like(x)
            rows = {}
            forms = _forms(C, dev, compile_backend, fla=dev == "cuda")
            with torch.no_grad():
                y_ref = forms["reference eager"][1](x).float()
            for form, (module, fn) in forms.items():
                fb = _fwd_bwd(fn, x, dy)
                fb()  # compile / warm up outside the timed calls
                with torch.no_grad():
                    err = rel_rms(fn(x).float(), y_ref)  # every form computes the same y
                fwd = bench(lambda fn=fn, x=x: fn(x), grad_to_none=[x, module.weight])
                both = bench(fb, grad_to_none=[x, module.weight])
                rows[form] = dict(shape=name, B=B, T=T, C=C, form=form, fwd_ms=fwd, fwd_bwd_ms=both, y_rel_vs_ref=err)
            base = rows["reference compiled"]["fwd_bwd_ms"]
            for r in rows.values():
                r["speedup_vs_ref_compiled"] = base / r["fwd_bwd_ms"]
                results["timings"].append(r)
                log(f"{name:10s} {B:3d} {T:5d} {C:5d} {r['form']:20s} {r['fwd_ms']:8.3f} {r['fwd_bwd_ms']:8.3f} "
                    f"{r['speedup_vs_ref_compiled']:15.2f}x  y rel {r['y_rel_vs_ref']:.1e}")


@section("sweep")
def sweep(results: dict, s: BenchSettings, shapes: dict) -> None:
    log("\n== sweep: Triton op forward+backward by launch configuration (ms, median) ==")
    dev = s.device
    xdt = torch.bfloat16 if dev == "cuda" else torch.float32
    configs = DRY_SWEEP if s.dryrun else SWEEP
    for name, (B, T, widths) in shapes.items():
        for C in widths:
            x = torch.randn(B, T, C, device=dev, dtype=xdt, requires_grad=True)
            w = torch.randn(C, K, device=dev, requires_grad=True)
            dy = torch.randn_like(x)
            for cfg in configs:
                if s.budget_left() < 30:
                    log("  budget spent: sweep stopped")
                    return
                fn = lambda x, cfg=cfg, w=w: triton_causal_conv1d(x, w, activation="silu", config=cfg)[0]  # noqa: E731
                ms = bench(_fwd_bwd(fn, x, dy), grad_to_none=[x, w])
                keys = {k: getattr(cfg, k)
                        for k in ("BT", "BC", "BC_BWD", "warps_fwd", "warps_bwd", "bwd_form", "fwd_form")}
                results["sweep"].append(dict(shape=name, C=C, fwd_bwd_ms=ms, default=cfg == DEFAULT_CONFIG, **keys))
                log(f"{name:10s} C={C:5d} {keys} {ms:8.3f}" + ("  (default)" if cfg == DEFAULT_CONFIG else ""))


def main(argv: list[str] | None = None) -> None:
    """Run the sections (correctness, timing, and the sweep with ``--sweep``) and write the JSON results."""
    p = bench_parser(__doc__.splitlines()[0])
    p.add_argument("--widths", nargs="+", type=int, metavar="C", help="only these channel widths")
    args = p.parse_args(argv)
    s = BenchSettings.from_args(args)
    results: dict = {"errors": [], "correctness": [], "timings": [], "sweep": []}
    if torch.cuda.is_available() and not s.dryrun:
        results["device"] = torch.cuda.get_device_name()
    shapes = _shapes(s.dryrun, args.quick, args.widths)
    correctness(results, s, shapes)
    timing(results, s, shapes)
    if args.sweep or s.dryrun:
        sweep(results, s, shapes)
    failed = [r for r in results["correctness"] if not r["pass"]]
    if failed:
        results["errors"].append(f"correctness: {len(failed)} case(s) above the bar {BAR:g}")
    path = s.write_json("causal_conv_gpu.json", results)
    log(f"\nwrote {path or 'no results file (no --out)'}; errors: {results['errors'] or 'none'}")


if __name__ == "__main__":
    main()
