#!/usr/bin/env python
"""NAtS-L op on the GPU (Triton gated delta rule with commit mask + block-sparse chunk attention): correctness vs
the float64 reference and timings vs the official NAtS-L numbers, in ONE invocation (< 8 minutes on an H200):

    hybrid-attention bench ops --only natsl   (or: python -m benchmarks.natsl_ops [--sweep])

Sections (each guarded: a failure in one still leaves the others' numbers):
  1. correctness: bf16 activations, T in {63, 1000, 4096, 16384}, routings with softmax fraction 0, 0.3, 1 (B=1,
     2 GDN heads of 128/256, 4 softmax heads of 64/128, chunk 64), every kernel-written buffer poisoned with NaN;
     relative RMS error vs the float64 reference (chunk_gated_delta + chunk_chunk_attention) of the GDN output, final
     state, softmax output and all gradients (q, k, v, g, beta, commit mask, initial state; softmax q, k, v and the
     routing gradient); limits 5e-3 outputs/states, 1e-2 gradients with fp32 GDN buffers (``buffer_dtype="fp32"``),
     2e-2 for everything with the default launch (bf16 buffers for these bf16 activations; the bf16 tests' bar).
     Plus the NAtS-L layer (backend auto vs reference) and, when fla is installed, our GDN forward vs fla's.
  2. timings (triton.testing.do_bench, median, bf16, B=1): the natsl-hybrid-340m layer shape (6 GDN heads 128/256,
     12 softmax heads 64/128, chunk 64, 30% softmax chunks) at 4K/16K/64K: forward and forward+backward of the op
     (GDN + softmax branch), each branch alone, causal SDPA (16 heads x 64); the official numbers beside ours.
  3. decode: the fused single-token GDN step (CUDA graph) vs a length-1 chunk call;
  4. with --sweep, a small launch-config sweep of the kernels (if time is left).
Writes ``<--out>/natsl_gpu.json`` (default ``$OUT`` or .) and prints one table at the end. ``--dryrun`` (or
``BENCH_DRYRUN=1``) with ``TRITON_INTERPRET=1`` runs the whole script on the CPU at tiny shapes (a smoke test of the
script).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import time

import torch
import torch.nn.functional as F

from benchmarks.common import (
    NATSL_OPS_BUDGET_S,
    BenchSettings,
    bench_parser,
    elapsed,
    exit_status,
    fla_gdn,
    log,
    rel_rms,
)
from benchmarks.common import bench_ms as bench
from benchmarks.common import guarded as _guarded
from hybrid_attention.ops.chunk_attention import chunk_attention
from hybrid_attention.ops.chunk_attention.triton import DEFAULT_CONFIG as ATTN_DEFAULT
from hybrid_attention.ops.chunk_attention.triton import ChunkAttentionConfig, triton_chunk_attention
from hybrid_attention.ops.gated_delta import gated_delta
from hybrid_attention.ops.gated_delta.triton import DEFAULT_CONFIG as GDN_DEFAULT
from hybrid_attention.ops.gated_delta.triton import GatedDeltaConfig, triton_gated_delta
from hybrid_attention.ops.natsl_mixed.triton import triton_natsl_mixed

RESULTS: dict = {"errors": [], "correctness": [], "timings": [], "sweep": [], "profile": {}}
guarded = functools.partial(_guarded, RESULTS)
# official NAtS-L kernel on an H200, same shapes: ms
OFFICIAL = {
    4096: dict(fwd=2.43, fb=6.57, sdpa_fb=0.43, fla_gdn_fb=2.85),
    16384: dict(fwd=3.44, fb=9.38, sdpa_fb=4.36, fla_gdn_fb=2.66),
    65536: dict(fwd=14.6, fb=66.7, sdpa_fb=68.0, fla_gdn_fb=10.3),
}
# head shapes and the lengths of the correctness / timing sections, by BenchSettings.dryrun (True: tiny shapes for the
# CPU smoke test)
SHAPES = {
    True: dict(H=2, K=32, V=32, G=2, C=16, corr_t=(63, 100), time_t=(64, 128)),
    False: dict(H=6, K=128, V=256, G=2, C=64, corr_t=(63, 1000, 4096, 16384), time_t=(4096, 16384, 65536)),
}


# ---------------------------------------------------------------------------------------------------------------
def make_inputs(dev: str, T, H, K, V, G, C, frac, seed, dtype=torch.bfloat16, with_s0=True):
    """Random NAtS-L op inputs on device ``dev``: GDN q, k, v (+ realistic gates), softmax heads, routing with
    fraction ``frac``."""
    gen = torch.Generator(device=dev).manual_seed(seed)

    def rn(*size, dt=dtype):
        return torch.randn(*size, generator=gen, device=dev, dtype=torch.float32).to(dt)

    B = 1
    Hs = H * G
    A = torch.empty(H, device=dev).uniform_(1, 16, generator=gen)
    dt_bias = torch.log(
        torch.expm1(torch.exp(torch.empty(H, device=dev).uniform_(math.log(1e-3), math.log(1e-1), generator=gen)))
    )
    g = -A * F.softplus(rn(B, T, H, dt=torch.float32) + dt_bias)  # GDN log-decay, fp32
    beta = torch.sigmoid(rn(B, T, H, dt=torch.float32))
    N, nf = math.ceil(T / C), T // C
    sm = torch.rand(B, nf, H, generator=gen, device=dev) < frac  # softmax-typed complete chunks
    commit = F.pad((~sm).float(), (0, 0, 0, N - nf), value=1.0)  # GDN-typed chunks commit; partial chunk inert
    routing = F.pad(sm, (0, 0, 0, N - nf), value=False)
    leaves = dict(
        q=rn(B, T, H, K),
        k=rn(B, T, H, K),
        v=rn(B, T, H, V),
        g=g,
        beta=beta,
        commit=commit,
        S0=0.1 * rn(B, H, K, V, dt=torch.float32) if with_s0 else None,
        qs=rn(B, T, Hs, K // G),
        ks=rn(B, T, Hs, K // G),
        vs=rn(B, T, Hs, V // G),
        rb=torch.zeros(B, N, H, device=dev),
    )
    cot = dict(
        do_g=rn(B, T, H, V, dt=torch.float32),
        dS=rn(B, H, K, V, dt=torch.float32),
        do_s=rn(B, T, Hs, V // G, dt=torch.float32),
    )
    return leaves, routing, cot


def natsl_op(x, routing, backend, C, G, final_state=True, concurrent=False,
             gdn_config: GatedDeltaConfig = GDN_DEFAULT, attn_config: ChunkAttentionConfig = ATTN_DEFAULT):
    """GDN branch + softmax branch. ``concurrent``: ``triton_natsl_mixed`` (GDN on a synchronised side stream) with
    the launch configurations ``gdn_config`` / ``attn_config``."""
    if concurrent:
        return triton_natsl_mixed(
            x["q"],
            x["k"],
            x["v"],
            x["g"],
            x["beta"],
            x["commit"],
            x["qs"],
            x["ks"],
            x["vs"],
            routing,
            routing_bias=x["rb"],
            chunk_size=C,
            group_size=G,
            initial_state=x["S0"],
            output_final_state=final_state,
            gdn_config=gdn_config,
            attn_config=attn_config,
        )
    o_g, S = gated_delta(
        x["q"],
        x["k"],
        x["v"],
        x["g"],
        x["beta"],
        commit=x["commit"],
        chunk_size=C,
        initial_state=x["S0"],
        output_final_state=final_state,
        backend=backend,
    )
    o_s = chunk_attention(
        x["qs"], x["ks"], x["vs"], routing, chunk_size=C, group_size=G, routing_bias=x["rb"], backend=backend
    )
    return o_g, S, o_s


# (GDN buffers, output / state limit, gradient limit) of the correctness section: the fp32-buffer launch at the limits
# the op has always met, and the default launch ("auto": bf16 buffers for these bf16 activations) at the bf16 bar of
# tests/ops/test_gated_delta_bf16.py (fla's forward is 4.7-4.9e-3 from float64 at this shape)
CORRECTNESS_MODES = (("fp32", 5e-3, 1e-2), ("auto", 2e-2, 2e-2))


@guarded("correctness")
def correctness(s: BenchSettings):
    shape = SHAPES[s.dryrun]
    H, K, V, G, C = 2, shape["K"], shape["V"], shape["G"], shape["C"]
    for (buffers, lim_out, lim_grad), T, frac in ((m, T, f) for m in CORRECTNESS_MODES for T in shape["corr_t"]
                                                  for f in (0.0, 0.3, 1.0)):
        poisoned = dict(gdn_config=GatedDeltaConfig(buffer_dtype=buffers, poison=True),
                        attn_config=ChunkAttentionConfig(poison=True))
        t0 = time.time()
        leaves, routing, cot = make_inputs(s.device, T, H, K, V, G, C, frac, seed=T * 10 + int(frac * 10))
        names = [n for n, x in leaves.items() if x is not None]
        res = {}
        for backend, dt in (("triton", None), ("reference", torch.float64)):
            xs = {
                n: (x.detach().clone() if dt is None else x.detach().to(dt)).requires_grad_()
                if x is not None
                else None
                for n, x in leaves.items()
            }
            o_g, S, o_s = natsl_op(xs, routing, backend, C, G, concurrent=backend == "triton",
                                   **(poisoned if backend == "triton" else {}))
            loss = (
                (o_g.double() * cot["do_g"].double()).sum()
                + (S.double() * cot["dS"].double()).sum()
                + (o_s.double() * cot["do_s"].double()).sum()
            )
            grads = torch.autograd.grad(loss, [xs[n] for n in names], allow_unused=True)
            grads = [torch.zeros_like(xs[n]) if gr is None else gr for n, gr in zip(names, grads)]
            res[backend] = dict(
                o_gdn=o_g, state=S, o_softmax=o_s, **{"d" + n: gr for n, gr in zip(names, grads)}
            )
        row = dict(buffers=buffers, T=T, frac=frac)
        ok = True
        for key, a in res["triton"].items():
            e = rel_rms(a, res["reference"][key])
            finite = bool(torch.isfinite(a).all())
            lim = lim_out if key in ("o_gdn", "state", "o_softmax") else lim_grad
            row[key] = e
            ok &= finite and e <= lim
        row["pass"] = ok
        RESULTS["correctness"].append(row)
        meta = ("buffers", "T", "frac", "pass")
        worst = max((v for k, v in row.items() if k not in meta), default=0)
        log(
            f"  {buffers} T={T:6d} frac={frac:.1f} pass={ok} worst={worst:.2e} ({time.time() - t0:.1f}s) "
            + " ".join(f"{k}={v:.1e}" for k, v in row.items() if k not in meta)
        )


@guarded("layer")
def layer_check(s: BenchSettings):
    """NAtS-L layer, backend auto (Triton on CUDA) vs reference: output and all parameter / input gradients."""
    dev = s.device
    shape = SHAPES[s.dryrun]
    from hybrid_attention.layers.natsl import NatsLAttention

    torch.manual_seed(0)
    C = shape["C"]
    lay = NatsLAttention(256, num_heads=2, head_dim=64, num_attn_heads=4, chunk_size=C).to(dev)
    x = torch.randn(2, 3 * C + 5, 256, device=dev)
    outs = {}
    for backend in ("auto", "reference"):
        lay.backend = backend
        lay.zero_grad()
        xx = x.clone().requires_grad_()
        y, _ = lay(xx)
        (y * torch.sin(torch.arange(y.numel(), device=dev).view_as(y).float())).sum().backward()
        outs[backend] = [y.detach(), xx.grad] + [p.grad.clone() for p in lay.parameters()]
    errs = [rel_rms(a, b) for a, b in zip(outs["auto"], outs["reference"])]
    score = lay.score_proj.weight
    i_score = [i for i, p in enumerate(lay.parameters()) if p is score][0] + 2
    RESULTS["layer"] = dict(y=errs[0], dx=errs[1], max_param_grad=max(errs[2:]), score_grad=errs[i_score])
    log(
        f"  layer (fp32, auto vs reference): y={errs[0]:.1e} dx={errs[1]:.1e} max param grad={max(errs[2:]):.1e} "
        f"score_proj grad={errs[i_score]:.1e}"
    )


@guarded("fla")
def fla_check(s: BenchSettings):
    """Our Triton GDN forward vs fla's ``chunk_gated_delta_rule`` (plain GDN, no commit mask, q/k L2-normed in the
    kernel, initial state in, final state out), both also against our float64 reference on the same bf16 inputs, so a
    disagreement can be attributed. One row per length in ``RESULTS["fla"]``."""
    shape = SHAPES[s.dryrun]
    chunk_gated_delta_rule = fla_gdn()
    if chunk_gated_delta_rule is None:
        return
    H, K, V = shape["H"], shape["K"], shape["V"]
    for T in shape["corr_t"]:
        t0 = time.time()
        leaves, _, _ = make_inputs(s.device, T, H, K, V, shape["G"], shape["C"], 0.0, seed=3 + T, with_s0=True)
        q, k, v, g, beta, s0 = (leaves[n] for n in ("q", "k", "v", "g", "beta", "S0"))
        kw = dict(initial_state=s0, output_final_state=True)
        ours = gated_delta(q, k, v, g, beta, chunk_size=shape["C"], backend="triton", **kw)
        theirs = chunk_gated_delta_rule(q, k, v, g, beta.to(q.dtype), use_qk_l2norm_in_kernel=True, **kw)
        d = torch.float64
        ref = gated_delta(
            q.to(d), k.to(d), v.to(d), g.to(d), beta.to(d), chunk_size=shape["C"], backend="reference",
            initial_state=s0.to(d), output_final_state=True,
        )
        row = dict(T=T)
        for i, name in enumerate(("o", "state")):
            row[f"{name}_ours_vs_fla"] = rel_rms(ours[i], theirs[i].to(d))
            row[f"{name}_ours_vs_ref"] = rel_rms(ours[i], ref[i])
            row[f"{name}_fla_vs_ref"] = rel_rms(theirs[i], ref[i])
        RESULTS.setdefault("fla", []).append(row)
        log(f"  T={T:6d} ({time.time() - t0:.1f}s) " + " ".join(f"{k}={v:.1e}" for k, v in row.items() if k != "T"))


# ---------------------------------------------------------------------------------------------------------------
def time_op(s: BenchSettings, T, frac=0.3):
    dev = s.device
    shape = SHAPES[s.dryrun]
    H, K, V, G, C = shape["H"], shape["K"], shape["V"], shape["G"], shape["C"]
    leaves, routing, cot = make_inputs(s.device, T, H, K, V, G, C, frac, seed=1, with_s0=False)
    xs = {n: (x.requires_grad_() if x is not None else None) for n, x in leaves.items()}
    req = [x for x in xs.values() if x is not None]
    dog, dos = cot["do_g"].bfloat16(), cot["do_s"].bfloat16()
    row = dict(T=T, frac=frac)

    def op_fwd():
        return natsl_op(xs, routing, "triton", C, G, final_state=False)

    def op_fb():
        o_g, _, o_s = op_fwd()
        torch.autograd.backward([o_g, o_s], [dog, dos])

    def cc_fwd():
        return natsl_op(xs, routing, "triton", C, G, final_state=False, concurrent=True)

    def cc_fb():
        o_g, _, o_s = cc_fwd()
        torch.autograd.backward([o_g, o_s], [dog, dos])

    def gdn_fwd():
        return gated_delta(xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], chunk_size=C, backend="triton")[0]

    def gdn_fb():
        gdn_fwd().backward(dog)

    def sm_fwd():
        return chunk_attention(
            xs["qs"], xs["ks"], xs["vs"], routing, chunk_size=C, group_size=G, routing_bias=xs["rb"], backend="triton"
        )

    def sm_fb():
        sm_fwd().backward(dos)

    long = T >= 65536
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    row["op_fwd"] = bench(op_fwd, rep=100)
    row["op_fb"] = bench(op_fb, rep=150 if long else 80, grad_to_none=req)
    if dev == "cuda":
        row["op_fb_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    row["cc_fwd"] = bench(cc_fwd, rep=100)
    row["cc_fb"] = bench(cc_fb, rep=150 if long else 80, grad_to_none=req)
    row["gdn_fwd"] = bench(gdn_fwd)
    row["gdn_fb"] = bench(gdn_fb, grad_to_none=req)
    row["sm_fwd"] = bench(sm_fwd)
    row["sm_fb"] = bench(sm_fb, grad_to_none=req)
    with torch.no_grad():
        row["op_fwd_nograd"] = bench(op_fwd)
    fla_op = fla_gdn()
    if fla_op is not None:  # fla's GDN at the same shape, measured here (its backward may refuse Hopper)

        def fla_fwd():
            return fla_op(
                xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"].to(xs["q"].dtype), use_qk_l2norm_in_kernel=True
            )[0]

        row["fla_gdn_fwd"] = bench(fla_fwd)
        try:
            row["fla_gdn_fb"] = bench(lambda: fla_fwd().backward(dog), grad_to_none=req)
        except Exception as exc:
            log(f"  fla GDN backward: {exc.__class__.__name__}: {str(exc).splitlines()[0][:160]}")
    # causal SDPA, 16 heads x 64
    qq, kk, vv = (torch.randn(1, 16, T, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dd = torch.randn(1, 16, T, 64, device=dev, dtype=torch.bfloat16)
    row["sdpa_fwd"] = bench(lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=True))
    row["sdpa_fb"] = bench(
        lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(dd),
        rep=150 if long else 60,
        grad_to_none=[qq, kk, vv],
    )
    if dev == "cuda" and T in (16384, 65536):
        RESULTS["profile"][T] = profile(op_fb, T)
    return row


def profile(fn, T, top=12):
    """CUDA time per kernel (summed over calls) of one op forward+backward, via torch.profiler."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0.0)
        if t > 0:
            rows.append((e.key[:60], t / 1e3, e.count))
    rows.sort(key=lambda r: -r[1])
    log(f"  profile T={T} (op forward+backward, ms per kernel name, calls):")
    for name, ms, cnt in rows[:top]:
        log(f"    {ms:8.3f}  x{cnt:<3d} {name}")
    return rows[:top]


@guarded("timings")
def timings(s: BenchSettings):
    shape = SHAPES[s.dryrun]
    for T in shape["time_t"]:
        row = time_op(s, T)
        RESULTS["timings"].append(row)
        log("  " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))


@guarded("decode")
def decode(s: BenchSettings):
    """One GDN decoding step at the layer shape (B=1, 6 heads, 128/256): fused Triton step captured in a CUDA graph
    (state updated in place) vs gated_delta on a length-1 chunk (Triton chunk kernels, eager) and its check."""
    dev = s.device
    shape = SHAPES[s.dryrun]
    from hybrid_attention.ops.gated_delta.triton import triton_gated_delta_step

    H, K, V = shape["H"], shape["K"], shape["V"]
    gen = torch.Generator(device=dev).manual_seed(5)
    q, k = (torch.randn(1, H, K, device=dev, generator=gen).bfloat16() for _ in range(2))
    v = torch.randn(1, H, V, device=dev, generator=gen).bfloat16()
    g = -torch.rand(1, H, device=dev, generator=gen)
    beta = torch.rand(1, H, device=dev, generator=gen)
    S0 = torch.randn(1, H, K, V, device=dev, generator=gen)
    S = S0.clone()
    o, _ = triton_gated_delta_step(q, k, v, g, beta, S)
    o_ref, S_ref = gated_delta(
        *(x[:, None].double() for x in (q, k, v, g, beta)),
        initial_state=S0.double(),
        output_final_state=True,
        backend="reference",
    )
    err = max(rel_rms(o, o_ref[:, 0]), rel_rms(S, S_ref))
    out = torch.empty_like(o)
    row = dict(err=err)
    if dev == "cuda":
        graph = torch.cuda.CUDAGraph()
        for _ in range(3):
            triton_gated_delta_step(q, k, v, g, beta, S, out=out)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            triton_gated_delta_step(q, k, v, g, beta, S, out=out)
        row["fused_graph_ms"] = bench(graph.replay, warmup=20, rep=100)
        row["fused_eager_ms"] = bench(lambda: triton_gated_delta_step(q, k, v, g, beta, S, out=out), rep=100)
    row["chunk_T1_ms"] = bench(
        lambda: gated_delta(
            q[:, None],
            k[:, None],
            v[:, None],
            g[:, None],
            beta[:, None],
            initial_state=S0,
            output_final_state=True,
            backend="triton",
        )
    )
    RESULTS["decode"] = row
    log("  decode step (B=1, 6 heads 128/256): " + " ".join(f"{k_}={v_:.4g}" for k_, v_ in row.items()))


SWEEP_KINDS = ("softmax", "fla_gdn", "gdn")
"""The job kinds of the sweep: the chunk-attention variants, fla's GDN (when installed), our GDN variants."""


@guarded("sweep")
def sweep(s: BenchSettings, start: int = 0, kinds: tuple[str, ...] = SWEEP_KINDS):
    """Launch-config variants of the softmax and GDN kernels (forward+backward of each branch alone), from job
    ``start`` of the flat job list on (the jobs before it ran in an earlier process); ``kinds``: the job kinds kept
    (a subset of ``SWEEP_KINDS``; the job numbers count the kept jobs only)."""
    dryrun = s.dryrun
    shape = SHAPES[s.dryrun]
    if dryrun:
        return
    H, K, V, G, C = shape["H"], shape["K"], shape["V"], shape["G"], shape["C"]
    attn_variants = [
        {},
        dict(fwd_qc=2, fwd_warps=8, fwd_stages=3),
        dict(fwd_qc=1, fwd_warps=4, fwd_stages=4),
        dict(fwd_qc=1, fwd_warps=8, fwd_stages=3),
        dict(dq_qc=1, dq_warps=4, dq_stages=3),
        dict(dkv_qb=32, dkv_warps=4, dkv_stages=3),
        # one-pass backward (dq by atomics), QB64 8 warps 2 stages: f+b 3.58 ms vs the default's 2.49 at 16K (H200)
        dict(bwd_mode="one_pass"),
    ]
    gdn_variants = [
        {},
        # fp32 buffers, 1-stage state forward, 8-warp parallel kernels (the backward at the default launches)
        dict(buffer_dtype="fp32", seqf_stages=1, par_warps=8),
        # the default with fp32 backward dots and the alternatives of each tuned launch, then one step past each
        # default (GatedDeltaConfig's docstring gives the deciding times)
        dict(seqf_stages=2, seqb_dots="fp32", bwdk_bv=32, fin_warps=8),
        dict(seqf_stages=4),
        dict(seqb_stages_bf16=3),  # AOT: 209 regs, 118 KB smem, no spills (fin_warps=2 spills 1.2 KB: not swept)
        # a plain GDN layer's call (no commit mask) at chunk 64 (chunk 128 at these heads needs more shared memory
        # than an H200 has: `supported` keeps chunk 128 to K <= 32, support.py)
        dict(call_commit=False),
    ]
    # one flat list of jobs, so that a run broken by a sticky CUDA error (an illegal memory access takes the whole
    # context down) resumes at the next job in a fresh process
    # (--sweep-from, which benchmarks/gpu_timings.sh passes after exit code 3)
    jobs = [(T, kind, var) for T in (16384, 65536)
            for kind, var in ([("softmax", v) for v in attn_variants] + [("fla_gdn", {})]
                              + [("gdn", v) for v in gdn_variants])
            if kind in kinds]
    T_inputs, inputs, o_default = None, None, None
    for j, (T, kind, var) in enumerate(jobs):
        if j < start:
            continue
        if elapsed() > s.budget_s:
            log("  sweep: time budget reached")
            return
        if T != T_inputs:
            T_inputs, o_default = T, None  # o_default: the GDN default's output, each variant's o_rel is against it
            leaves, routing, cot = make_inputs(s.device, T, H, K, V, G, C, 0.3, seed=2, with_s0=False)
            xs = {n: (x.requires_grad_() if x is not None else None) for n, x in leaves.items()}
            inputs = (xs, routing, [x for x in xs.values() if x is not None],
                      cot["do_s"].bfloat16(), cot["do_g"].bfloat16())
        try:
            row = _sweep_job(kind, var, C, G, *inputs, o_default)
        except Exception as exc:
            log(f"  T={T} {kind} {var}: FAILED {exc!r}")
            if _context_broken():
                RESULTS["sweep_resume"] = j + 1
                log(f"  sweep: job {j} broke the CUDA context; resume with --sweep-from {j + 1}")
                return
            continue
        if row is None:  # fla not installed
            continue
        if kind == "gdn" and not var:
            o_default = row.pop("o")
        row.pop("o", None)
        RESULTS["sweep"].append(dict(T=T, kind=kind, var=var, **row))
        extra = f" (o vs default {row['o_rel']:.1e})" if "o_rel" in row else ""
        fb = f" f+b {row['fb']:.3f}" if "fb" in row else ""
        ng = f" (no_grad {row['fwd_nograd']:.3f})" if "fwd_nograd" in row else ""
        log(f"  T={T} {kind} {var or 'default'}: fwd {row['fwd']:.3f}{ng}{fb}{extra}")


def _context_broken() -> bool:
    """True when the CUDA context no longer works (a sticky error such as an illegal memory access)."""
    if not torch.cuda.is_available():
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:
        return True


def _nograd(fn):
    """``fn`` run under ``torch.no_grad()`` (a forward that saves nothing for a backward)."""
    def run():
        with torch.no_grad():
            return fn()
    return run


def gdn_sweep_call(var: dict, C: int, commit):
    """(GatedDeltaConfig, call arguments) of a GDN sweep row: the ``call_*`` keys of ``var`` change the call, not the
    launch (``call_chunk``: the kernel's chunk size instead of the layer's C; ``call_commit=False``: no commit mask,
    as in a plain GDN layer), every other key is a ``GatedDeltaConfig`` field."""
    fields = {k: v for k, v in var.items() if not k.startswith("call_")}
    unknown = set(var) - set(fields) - {"call_chunk", "call_commit"}
    if unknown:
        raise ValueError(f"sweep row: unknown call keys {sorted(unknown)}; allowed: call_chunk, call_commit")
    call = dict(chunk_size=var.get("call_chunk", C), commit=commit if var.get("call_commit", True) else None)
    return dataclasses.replace(GDN_DEFAULT, **fields), call


def _sweep_job(kind, var, C, G, xs, routing, req, dos, dog, o_default):
    """Time one sweep variant: {fwd, fb} ms (GDN: also o, the output, and o_rel against ``o_default``). fla's row and
    our default GDN row also time the forward under ``no_grad`` (``fwd_nograd``): the fair forward comparison, since
    inputs that require grad make fla's forward save its tensors for a backward."""
    if kind == "softmax":
        cfg_a = dataclasses.replace(ATTN_DEFAULT, **var)

        def fwd():
            return triton_chunk_attention(xs["qs"], xs["ks"], xs["vs"], routing, chunk_size=C, group_size=G,
                                          routing_bias=xs["rb"], config=cfg_a)

        return dict(fwd=bench(fwd, warmup=5, rep=40),
                    fb=bench(lambda: fwd().backward(dos), warmup=5, rep=60, grad_to_none=req))
    if kind == "fla_gdn":  # fla's forward (no commit mask), when installed
        fla_op = fla_gdn()
        if fla_op is None:
            return None
        def ffwd():
            return fla_op(xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"].to(xs["q"].dtype),
                          use_qk_l2norm_in_kernel=True)[0]

        return dict(fwd=bench(ffwd, warmup=5, rep=40), fwd_nograd=bench(_nograd(ffwd), warmup=5, rep=40))
    cfg_g, call = gdn_sweep_call(var, C, xs["commit"])

    def gfwd(cfg=cfg_g, **over):
        return triton_gated_delta(xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], config=cfg, **{**call, **over})[0]

    with torch.no_grad():
        o = gfwd().float()
        if call["chunk_size"] != C or call["commit"] is not xs["commit"]:
            # another call than the default row's: o_rel against the default launch on the same inputs and mask at
            # the layer's chunk (the chunk size only reorders the exact computation: what differs is rounding)
            o_default = gfwd(GDN_DEFAULT, chunk_size=C).float()
        elif o_default is None and var:  # a process resumed after the default's row (--sweep-from): recompute it
            o_default = gfwd(GDN_DEFAULT).float()
    o_rel = rel_rms(o, o_default) if o_default is not None else 0.0  # 0: the default itself
    row = dict(fwd=bench(gfwd, warmup=5, rep=40),
               fb=bench(lambda: gfwd().backward(dog), warmup=5, rep=60, grad_to_none=req), o_rel=o_rel, o=o)
    if not var:
        row["fwd_nograd"] = bench(_nograd(gfwd), warmup=5, rep=40)
    return row


def summary(s: BenchSettings):
    dev = s.device
    log(
        "\n=== NAtS-L op, natsl-hybrid-340m layer shape (6 GDN heads 128/256 + 12 softmax heads 64/128, chunk 64, "
        "30% softmax), B=1, bf16, ms (median) ==="
    )
    if dev == "cuda":
        log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    log(
        "fwd / f+b: 'seq' = gated_delta then chunk_attention on one stream (what the layer calls), 'conc' =\n"
        "natsl_mixed (GDN branch on a synchronised side stream); x = official / best of ours; SDPA 16x64 causal;\n"
        "GDN = our gated_delta alone (no commit mask) vs fla's GDN as measured by the official run; softmax = our\n"
        "chunk_attention alone (30% routed)."
    )
    hdr = (
        f"{'T':>6} | {'fwd seq':>8} {'conc':>7} {'offic.':>7} {'x':>5} | {'f+b seq':>8} {'conc':>7} {'offic.':>7} "
        f"{'x':>5} | {'SDPA fwd':>8} {'f+b':>7} {'(off.)':>7} | {'GDN f+b':>8} {'fla off.':>8} | "
        f"{'softmax fwd':>11} {'f+b':>7} | {'peak GiB':>8}"
    )
    log(hdr)
    nan = float("nan")
    for r in RESULTS["timings"]:
        off = OFFICIAL.get(r["T"], {})
        bf, bb = min(r["op_fwd"], r.get("cc_fwd", nan)), min(r["op_fb"], r.get("cc_fb", nan))
        log(
            f"{r['T']:>6} | {r['op_fwd']:8.3f} {r.get('cc_fwd', nan):7.3f} {off.get('fwd', nan):7.2f} "
            f"{off.get('fwd', nan) / bf:5.2f} | {r['op_fb']:8.3f} {r.get('cc_fb', nan):7.3f} {off.get('fb', nan):7.2f} "
            f"{off.get('fb', nan) / bb:5.2f} | {r['sdpa_fwd']:8.3f} {r['sdpa_fb']:7.3f} "
            f"{off.get('sdpa_fb', nan):7.2f} | "
            f"{r['gdn_fb']:8.3f} {off.get('fla_gdn_fb', nan):8.2f} | {r['sm_fwd']:11.3f} {r['sm_fb']:7.3f} | "
            f"{r.get('op_fb_peak_gib', nan):8.2f}"
        )
    for r in RESULTS["timings"]:
        if "fla_gdn_fwd" in r:
            log(
                f"fla GDN measured in this run, T={r['T']}: fwd {r['fla_gdn_fwd']:.3f} ms, f+b "
                f"{r.get('fla_gdn_fb', nan):.3f} ms (ours: fwd {r['gdn_fwd']:.3f}, f+b {r['gdn_fb']:.3f})"
            )
    for buffers, lim_out, lim_grad in CORRECTNESS_MODES:
        corr = [r for r in RESULTS["correctness"] if r["buffers"] == buffers]
        if not corr:
            continue
        n_ok = sum(r["pass"] for r in corr)
        worst_out = max(max(r[k] for k in ("o_gdn", "state", "o_softmax")) for r in corr)
        worst_grad = max(max(v for k, v in r.items() if k.startswith("d")) for r in corr)
        log(
            f"correctness, GDN buffers {buffers}: {n_ok}/{len(corr)} configs pass (worst rel RMS: outputs/states "
            f"{worst_out:.2e}, gradients {worst_grad:.2e}; bars {lim_out:g} / {lim_grad:g}; NaN-poisoned buffers)"
        )
    if "layer" in RESULTS:
        log(f"layer auto vs reference (fp32): {RESULTS['layer']}")
    if "decode" in RESULTS:
        log(f"decode step: {RESULTS['decode']}")
    for row in RESULTS.get("fla", []):
        log(
            f"GDN forward vs fla, T={row['T']}: o ours/fla {row['o_ours_vs_fla']:.1e}, vs float64 ours "
            f"{row['o_ours_vs_ref']:.1e} fla {row['o_fla_vs_ref']:.1e}; final state ours/fla "
            f"{row['state_ours_vs_fla']:.1e}, vs float64 ours {row['state_ours_vs_ref']:.1e} fla "
            f"{row['state_fla_vs_ref']:.1e}"
        )
    if RESULTS["errors"]:
        log(f"errors: {RESULTS['errors']}")


def main(argv: list[str] | None = None) -> int:
    """Run every section (``--sweep``: also the launch-config sweep; ``--checks-only``: the correctness sections
    only, no timings; the shared flags: ``common.bench_parser``); returns the exit status (1 when a section raised
    or a check failed; exits with 3 when the sweep must resume in a new process)."""
    # a budget below common.DEFAULT_BUDGET_S (common.NATSL_OPS_BUDGET_S, 420 s: the sweep stops when it is spent;
    # this script's sections were sized for it); --budget-s / BENCH_BUDGET_S override it
    p = bench_parser(__doc__.splitlines()[0], budget_s=NATSL_OPS_BUDGET_S)
    p.add_argument("--checks-only", action="store_true", help="the correctness sections only, no timings")
    p.add_argument("--sweep-only", action="store_true",
                   help="the launch-config sweep alone (correctness of the variants: the CUDA test suite)")
    p.add_argument("--sweep-from", type=int, default=0,
                   help="start the sweep at this job (after a process that exited with code 3: a sticky CUDA error)")
    p.add_argument("--sweep-kinds", default=",".join(SWEEP_KINDS),
                   help=f"comma-separated job kinds of the sweep, a subset of {','.join(SWEEP_KINDS)}")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    kinds = tuple(k for k in args.sweep_kinds.split(",") if k)
    if not kinds or any(k not in SWEEP_KINDS for k in kinds):
        p.error(f"--sweep-kinds: each kind must be one of {', '.join(SWEEP_KINDS)}, got {args.sweep_kinds!r}")
    s = BenchSettings.from_args(args)
    log(f"natsl_gpu: device={s.device} dryrun={s.dryrun} torch={torch.__version__}")
    if not args.sweep_only:
        correctness(s)
        layer_check(s)
        fla_check(s)
        if not args.checks_only:
            timings(s)
            decode(s)
    if args.sweep or args.sweep_only:
        sweep(s, args.sweep_from, kinds)
    name = "natsl_gpu.json" if args.sweep_from == 0 else f"natsl_gpu_sweep_from{args.sweep_from}.json"
    s.write_json(name, RESULTS)
    summary(s)
    if "sweep_resume" in RESULTS:  # the CUDA context broke: the caller may resume at RESULTS["sweep_resume"]
        sys.exit(3)
    return exit_status(RESULTS)


if __name__ == "__main__":
    sys.exit(main())
