#!/usr/bin/env python
"""Interdomain Attention on the GPU: correctness of the Triton kernels vs the float64 reference, and timings vs
causal SDPA, in ONE invocation (< 8 minutes on an H200). Run from the repo root:

    hybrid-attention bench ops --only interdomain   (or: python -m benchmarks.interdomain_ops [--quick])

Sections (each guarded, so a failure in one still leaves the others' numbers):
  1. ceilings: device-to-device copy bandwidth and a bf16 matmul rate, measured here;
  2. correctness: bf16 inputs, T in {63, 1000, 4096, 16384} (B=1, H=4, R=D=M=64; H=2 at 16384), every kernel-written
     buffer poisoned with NaN first; relative RMS error vs chunk_interdomain in float64 for o, the final state and the
     gradients of q, k, v, log λ, B, C and the initial state (limits 5e-3 outputs/states, 1e-2 gradients);
  3. timings (triton.testing.do_bench, median): B=1, H=16, d_h=R=64, M=64, bf16, T in {4K, 16K, 32K, 64K, 128K}:
     forward, forward+backward (all 7 gradients), peak memory; causal SDPA with the same H, d_h; achieved TFLOP/s of
     the kernels against the counted FLOP model ``flop_model``;
  4. real passes: readout="real" as two kernel passes (``real_one_pass=False``) vs one pass (r = Cᵀ Re(C p) on the
     two tiles of C, ``real_one_pass=True``, the default) vs "transpose", forward and
     forward+backward at the timing shapes (T in {4K, 16K, 32K}), after a check of both forms vs float64 and of
     one pass vs two (o, final state, the 7 gradients; the correctness limits); ``--real-passes`` runs only this
     section;
  5. decode: fused step captured in a CUDA graph (B in {1, 8}) vs graphed SDPA decode over a KV cache of 1K..128K;
  6. compiled kernel resources (registers, spills, shared memory) and a small launch-config sweep if time is left.
Writes ``<--out>/interdomain_gpu.json`` (default ``$OUT`` or .) and prints one short table at the end.
``--dryrun`` (or ``BENCH_DRYRUN=1``) with ``TRITON_INTERPRET=1``: the correctness section and the real-passes check at
tiny shapes on the CPU (outputs against the bf16 bar 1e-2, ``output_bar``).
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
import traceback

import torch
import torch.nn.functional as F

from benchmarks.common import (
    INTERDOMAIN_OPS_BUDGET_S,
    BenchSettings,
    bench_parser,
    config_with,
    elapsed,
    exit_status,
    fla_gdn,
    log,
    peak_mb,
    rel_rms,
    section,
    sync,
)
from hybrid_attention.ops.interdomain import READOUTS, chunk_interdomain

CHUNK = {"size": 64}  # kernel chunk length used by the correctness / timing sections (set by the sweep)
# launch configuration of the later sections (an InterdomainConfig; None = the registered op's defaults; set by the
# sweep)
CONFIG: dict = {"chosen": None}


def output_bar(dryrun: bool) -> float:
    """Relative RMS bar of o and the final state (gradients: 1e-2). 5e-3 on the GPU at the checked shapes; the dry
    run's tiny heads (R = D = M = 16) with bf16 operands, whose rounding the interpreter reproduces exactly, sit at
    3-5e-3, so it takes the ops tests' bf16 bar (``BF16_TOL`` of tests/ops/test_interdomain_triton.py): 1e-2."""
    return 1e-2 if dryrun else 5e-3


def make_params(H: int, M: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """S4D-Inv-like discretised log λ (Δ log-uniform in [1e-3, 1e-1], A = -1/2 + i (M/π)(M/(2n+1) - 1)) with a
    quarter of the modes made fast (Re log λ in [-3, -0.1], as training can produce); complex Gaussian B, C."""
    g = torch.Generator().manual_seed(seed)
    dt = torch.exp(torch.empty(H, 1, dtype=torch.float64).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
    n = torch.arange(M, dtype=torch.float64)
    a_im = (M / math.pi) * (M / (2 * n + 1) - 1)
    re = (-0.5 * dt).expand(H, M).clone()
    fast = torch.rand(H, M, generator=g) < 0.25
    re[fast] = -torch.exp(torch.empty(int(fast.sum()), dtype=torch.float64).uniform_(math.log(0.1), math.log(3.0),
                                                                                    generator=g))
    log_lam = torch.complex(re, dt * a_im[None, :])
    B = torch.randn(H, M, dtype=torch.complex128, generator=g) * 0.5
    C = torch.randn(H, M, M, dtype=torch.complex128, generator=g) / math.sqrt(M)
    return log_lam.to(device), B.to(device), C.to(device)


def make_inputs(Bsz, T, H, R, D, seed, device, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(Bsz, T, H, R, generator=g)
    q = F.silu(q)
    q = q / q.norm(dim=-1, keepdim=True).clamp(min=1e-6)  # like ξ(q) = SiLU / ℓ2
    k = torch.randn(Bsz, T, H, R, generator=g)
    v = torch.randn(Bsz, T, H, D, generator=g)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


# ----------------------------------------------------------------------------------------------------------------------
# FLOP model (what the kernels compute, masked tile work included) and byte model


def flop_model(T: int, H: int, R: int, D: int, M: int, BT: int = 64, BC: int = 16, Bsz: int = 1) -> dict:
    NT = math.ceil(T / BT)
    NC = R + D
    nsub = BT // BC
    c, L = BC, BT
    fwd_sub = c * L * R + 2 * c * L * M + 2 * c * R * M + 4 * c * M * M + 2 * c * M * L + c * L * D + 2 * c * M * D
    state = 2 * M * L * NC
    bwd_sub = (
        c * L * R
        + 4 * c * L * M
        + 2 * c * R * M
        + 4 * c * M * M
        + 2 * c * M * L  # recompute (with the n·λ^n term)
        + 2 * c * L * D
        + 4 * c * L * M
        + 2 * c * D * M
        + 8 * c * M * M
        + 2 * c * M * L  # dW, dV, F1(dW), g_a, gp, gK, gS
        + c * L * R
        + 2 * c * M * R
        + c * L * R
        + 2 * c * M * R
        + 2 * c * M * D  # dq, dk, dX0k, dX0v
    )
    dz = 4 * L * M * NC
    per_chunk_fwd = nsub * fwd_sub + state
    per_chunk_bwd = state + nsub * bwd_sub + dz
    n = Bsz * H * NT
    return {
        "fwd": 2 * n * per_chunk_fwd,
        "bwd": 2 * n * per_chunk_bwd,
        "fwdbwd": 2 * n * (per_chunk_fwd + per_chunk_bwd),
    }


def sdpa_flops(T: int, H: int, d: int, Bsz: int = 1) -> dict:
    f = 4 * Bsz * H * T * T * d / 2  # causal: QKᵀ and PV, half the square
    return {"fwd": f, "fwdbwd": 3.5 * f}


# ----------------------------------------------------------------------------------------------------------------------


@section("ceilings")
def ceilings(results: dict, s: BenchSettings):
    dev = s.device
    from triton.testing import do_bench

    x = torch.empty(2 * 1024**3 // 4, device=dev, dtype=torch.float32).normal_()
    y = torch.empty_like(x)
    t = do_bench(lambda x=x, y=y: y.copy_(x), warmup=10, rep=50, return_mode="median")
    bw = 2 * x.numel() * 4 / (t * 1e-3) / 1e12
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    t2 = do_bench(lambda: a @ b, warmup=10, rep=100, return_mode="median")
    tf = 2 * 8192**3 / (t2 * 1e-3) / 1e12
    a32, b32 = a.float(), b.float()
    torch.backends.cuda.matmul.allow_tf32 = True
    t3 = do_bench(lambda: a32 @ b32, warmup=10, rep=100, return_mode="median")
    torch.backends.cuda.matmul.allow_tf32 = False
    tf32 = 2 * 8192**3 / (t3 * 1e-3) / 1e12
    results["ceilings"] = {"copy_TBps": bw, "bf16_TFLOPs": tf, "tf32_TFLOPs": tf32}
    log(f"ceilings: copy {bw:.2f} TB/s (read+write), bf16 matmul {tf:.0f} TFLOP/s, tf32 matmul {tf32:.0f} TFLOP/s")


@section("smoke")
def smoke(results: dict, s: BenchSettings):
    """Tiny run of every kernel (compiles them) with the resource report."""
    dev = s.device
    from benchmarks.profiling import StageProfiler
    from hybrid_attention.ops.interdomain.triton.ops import triton_interdomain

    log_lam, B, C = make_params(2, 64, 1, dev)
    q, k, v = make_inputs(1, 200, 2, 64, 64, 2, dev)
    leaves = [
        t.clone().requires_grad_()
        for t in (q, k, v, log_lam.to(torch.complex64), B.to(torch.complex64), C.to(torch.complex64))
    ]
    t0 = time.time()
    prof = StageProfiler(timing=False)
    o, _ = triton_interdomain(*leaves, hooks=prof)
    sync()
    log(f"smoke forward (compile) {time.time() - t0:.1f} s")
    t0 = time.time()
    o.float().square().sum().backward()
    sync()
    log(f"smoke backward (compile) {time.time() - t0:.1f} s")
    res = {name: {"regs": r, "spills": sp, "shared": sh} for name, (r, sp, sh) in prof.resources().items()}
    results["kernels"] = res
    log("kernel resources:", json.dumps(res))


@section("correctness")
def correctness(results: dict, s: BenchSettings, quick: bool = False):
    dev, dryrun = s.device, s.dryrun
    from dataclasses import replace

    from hybrid_attention.ops.interdomain.triton.config import DEFAULT_CONFIG
    from hybrid_attention.ops.interdomain.triton.ops import triton_interdomain

    R = D = M = 16 if dryrun else 64
    rows = []
    cases = [(63, 1, 4), (1000, 1, 4), (4096, 1, 4), (16384, 1, 2)]
    if dryrun:
        cases = [(40, 1, 1), (100, 1, 1)]
    if quick:
        cases = cases[:2]
    # every readout (ops/interdomain/readout.py): the Hermitian form runs the kernels with the conjugated key side,
    # "real" runs both passes
    cases = [(T, Bsz, H, ro) for ro in READOUTS for (T, Bsz, H) in cases]
    for idx, (T, Bsz, H, readout) in enumerate(cases):
        if elapsed() > s.budget_s * 0.75:
            log(f"correctness: skipping T={T} (time)")
            continue
        seed = 100 + idx % (len(cases) // len(READOUTS))  # the same inputs for every readout
        log_lam, Bp, C = make_params(H, M, seed, dev)
        q, k, v = make_inputs(Bsz, T, H, R, D, seed + 1, dev)
        g = torch.Generator().manual_seed(seed + 2)
        X0 = (torch.randn(Bsz, H, M, R + D, dtype=torch.complex128, generator=g) * 0.5).to(dev)
        do = torch.randn(Bsz, T, H, D, generator=g).to(dev).to(torch.bfloat16)
        dfin = (torch.randn(Bsz, H, M, R + D, dtype=torch.complex128, generator=g) * 1e-2).to(dev)
        # float64 reference on the same (bf16-rounded) inputs
        ref_leaves = [
            t.detach().to(torch.float64 if not t.is_complex() else torch.complex128).requires_grad_()
            for t in (q, k, v, log_lam, Bp, C, X0)
        ]
        t0 = time.time()
        o_ref, fin_ref = chunk_interdomain(
            *ref_leaves[:6], initial_state=ref_leaves[6], output_final_state=True, chunk_size=64, readout=readout
        )
        loss = (o_ref * do.double()).sum() + (fin_ref.conj() * dfin).real.sum()
        g_ref = torch.autograd.grad(loss, ref_leaves)
        t_ref = time.time() - t0
        for prec in ("tf32", "tf32x3") if not quick else ("tf32",):
            cfg = replace(CONFIG["chosen"] or DEFAULT_CONFIG, poison=True, dot_prec=prec)
            leaves = [
                q.clone().requires_grad_(),
                k.clone().requires_grad_(),
                v.clone().requires_grad_(),
                log_lam.to(torch.complex64).requires_grad_(),
                Bp.to(torch.complex64).requires_grad_(),
                C.to(torch.complex64).requires_grad_(),
                X0.to(torch.complex64).requires_grad_(),
            ]
            o, fin = triton_interdomain(
                *leaves[:6], initial_state=leaves[6], output_final_state=True, chunk_size=CHUNK["size"],
                readout=readout, config=cfg,
            )
            loss2 = (o.float() * do.float()).sum() + (fin.conj() * dfin.to(torch.complex64)).real.sum()
            grads = torch.autograd.grad(loss2, leaves)
            sync()
            errs = {"o": rel_rms(o, o_ref), "final": rel_rms(fin, fin_ref)}
            for name, a, b in zip(["dq", "dk", "dv", "dlog_lam", "dB", "dC", "dX0"], grads, g_ref):
                errs[name] = rel_rms(a, b)
            nan = any(not torch.isfinite(t).all().item() for t in (o, fin, *grads))
            ok = (
                not nan
                and errs["o"] <= output_bar(dryrun)
                and errs["final"] <= output_bar(dryrun)
                and all(errs[n] <= 1e-2 for n in errs if n.startswith("d"))
            )
            row = {"readout": readout, "T": T, "B": Bsz, "H": H, "prec": prec, "nan": nan, "pass": ok, "ref_s": t_ref,
                   **errs}
            rows.append(row)
            log(
                "correctness",
                json.dumps({k2: (f"{v2:.2e}" if isinstance(v2, float) else v2) for k2, v2 in row.items()}),
            )
            if ok and prec == "tf32":
                break  # tf32x3 only when the default precision misses a limit
        del ref_leaves, o_ref, fin_ref, g_ref
        if dev == "cuda":
            torch.cuda.empty_cache()
    results["correctness"] = rows


@section("timing")
def timing(results: dict, s: BenchSettings, Ts):
    dev = s.device
    from triton.testing import do_bench

    from hybrid_attention.ops.interdomain.triton.config import DEFAULT_CONFIG
    from hybrid_attention.ops.interdomain.triton.ops import triton_interdomain

    H, R, D, M = 16, 64, 64, 64
    cfg = CONFIG["chosen"]
    rows = []
    log_lam, Bp, C = make_params(H, M, 7, dev)
    p_leaves = [
        log_lam.to(torch.complex64).requires_grad_(),
        Bp.to(torch.complex64).requires_grad_(),
        C.to(torch.complex64).requires_grad_(),
    ]
    for T in Ts:
        if elapsed() > s.budget_s * 0.9:
            log(f"timing: skipping T={T} (time)")
            continue
        row = {"T": T}
        q, k, v = (t.requires_grad_() for t in make_inputs(1, T, H, R, D, T, dev))
        do = torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16)
        gnone = [q, k, v, *p_leaves]

        cs = CHUNK["size"]

        def fwd(q=q, k=k, v=v, cs=cs):
            with torch.no_grad():
                return triton_interdomain(q, k, v, *p_leaves, chunk_size=cs, config=cfg)[0]

        def fwdbwd(q=q, k=k, v=v, do=do, cs=cs):
            o, _ = triton_interdomain(q, k, v, *p_leaves, chunk_size=cs, config=cfg)
            o.backward(do)

        fwdbwd()
        row["id_fwd_ms"] = do_bench(fwd, warmup=5, rep=40, return_mode="median")
        row["id_fb_ms"] = do_bench(fwdbwd, warmup=5, rep=60, grad_to_none=gnone, return_mode="median")
        for t in gnone:
            t.grad = None
        row["id_fwd_MB"] = peak_mb(fwd)
        row["id_fb_MB"] = peak_mb(fwdbwd)
        fl = flop_model(T, H, R, D, M, BT=cs, BC=min(cs, (cfg or DEFAULT_CONFIG).BC))
        row["id_fwd_TFLOPs"] = fl["fwd"] / (row["id_fwd_ms"] * 1e-3) / 1e12
        row["id_fb_TFLOPs"] = fl["fwdbwd"] / (row["id_fb_ms"] * 1e-3) / 1e12
        # causal SDPA, same H and head dim
        qs, ks, vs = (torch.randn(1, H, T, R, device=dev, dtype=torch.bfloat16).requires_grad_() for _ in range(3))
        dos = torch.randn(1, H, T, R, device=dev, dtype=torch.bfloat16)

        def sfwd(qs=qs, ks=ks, vs=vs):
            with torch.no_grad():
                return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)

        def sfb(qs=qs, ks=ks, vs=vs, dos=dos):
            F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).backward(dos)

        sfb()
        row["sdpa_fwd_ms"] = do_bench(sfwd, warmup=3, rep=40, return_mode="median")
        row["sdpa_fb_ms"] = do_bench(sfb, warmup=3, rep=60, grad_to_none=[qs, ks, vs], return_mode="median")
        row["sdpa_fwd_MB"] = peak_mb(sfwd)
        row["sdpa_fb_MB"] = peak_mb(sfb)
        row["sdpa_fb_TFLOPs"] = sdpa_flops(T, H, R)["fwdbwd"] / (row["sdpa_fb_ms"] * 1e-3) / 1e12
        del qs, ks, vs, dos, do, q, k, v, fwd, fwdbwd, sfwd, sfb, gnone
        torch.cuda.empty_cache()
        row["fla_gdn_fwd_ms"] = _fla_gdn_fwd_ms(s, T, H, R)
        row["speedup_fwd"] = row["sdpa_fwd_ms"] / row["id_fwd_ms"]
        row["speedup_fb"] = row["sdpa_fb_ms"] / row["id_fb_ms"]
        rows.append(row)
        log("timing", json.dumps({k2: round(v2, 4) if isinstance(v2, float) else v2 for k2, v2 in row.items()}))
    results["timing"] = rows


REAL_VARIANTS = (("real_2pass", "real", False), ("real_1pass", "real", True), ("transpose", "transpose", False))


@section("real_passes")
def real_passes(results: dict, s: BenchSettings, Ts):
    """readout="real" in two kernel passes vs one (``InterdomainConfig.real_one_pass``) vs "transpose" (the one-pass
    cost to reach): first o, the final state and the 7 gradients of both forms vs the float64 reference (bf16
    inputs, an initial state, NaN-poisoned buffers; the one pass must meet the correctness limits, 5e-3 outputs /
    states, 1e-2 gradients) and the one-pass result vs the two-pass one (``1v2_*``, reported), then forward and
    forward+backward timings and peak memory at the timing section's shapes (B=1, H=16, R=D=M=64, bf16; nothing
    timed in a dry run)."""
    dev, dryrun = s.device, s.dryrun
    from dataclasses import replace

    from hybrid_attention.ops.interdomain.triton.config import DEFAULT_CONFIG
    from hybrid_attention.ops.interdomain.triton.ops import triton_interdomain

    H, R, D, M = (1, 16, 16, 16) if dryrun else (16, 64, 64, 64)
    base = replace(CONFIG["chosen"] or DEFAULT_CONFIG, real_one_pass=False)
    cs = CHUNK["size"]
    # ---- check: both forms vs the float64 reference (the correctness section's inputs at T 4096, H 4), and each other
    T, Hc = (40, 1) if dryrun else (4096, 4)
    log_lam, Bp, C = make_params(Hc, M, 11, dev)
    g = torch.Generator().manual_seed(13)
    X0 = (torch.randn(1, Hc, M, R + D, dtype=torch.complex128, generator=g) * 0.5).to(dev)
    inputs = (*make_inputs(1, T, Hc, R, D, 12, dev), log_lam, Bp, C, X0)
    do_c = torch.randn(1, T, Hc, D, generator=g).to(dev).to(torch.bfloat16)
    dfin = (torch.randn(1, Hc, M, R + D, dtype=torch.complex128, generator=g) * 1e-2).to(dev)

    def run(fn, dtypes):
        leaves = [t.detach().to(d).requires_grad_() for t, d in zip(inputs, dtypes)]
        o, fin = fn(*leaves[:6], initial_state=leaves[6], output_final_state=True, readout="real")
        loss = (o.to(dtypes[0]) * do_c.to(dtypes[0])).sum() + (fin.conj() * dfin.to(dtypes[3])).real.sum()
        return [o, fin, *torch.autograd.grad(loss, leaves)]

    ref = run(functools.partial(chunk_interdomain, chunk_size=64), [torch.float64] * 3 + [torch.complex128] * 4)
    res = {}
    for one in (False, True):
        cfg = replace(base, real_one_pass=one, poison=True)
        fn = functools.partial(triton_interdomain, chunk_size=cs, config=cfg)
        res[one] = run(fn, [torch.bfloat16] * 3 + [torch.complex64] * 4)
    sync()
    names = ["o", "final", "dq", "dk", "dv", "dlog_lam", "dB", "dC", "dX0"]
    errs = {n: rel_rms(a, b) for n, a, b in zip(names, res[True], ref)}
    nan = any(not torch.isfinite(t).all().item() for t in res[True])
    ok = not nan and all(errs[n] <= (1e-2 if n.startswith("d") else output_bar(s.dryrun)) for n in errs)
    two = {f"2pass_{n}": rel_rms(a, b) for n, a, b in zip(names, res[False], ref)}
    vs2 = {f"1v2_{n}": rel_rms(a, b.to(torch.complex128 if b.is_complex() else torch.float64))
           for n, a, b in zip(names, res[True], res[False])}
    check = {"T": T, "H": Hc, "nan": nan, "pass": ok, **errs, **two, **vs2}
    results["real_passes"] = {"check": check, "timing": []}
    log("real_passes check (1 pass vs float64; 2 pass vs float64; 1 vs 2)",
        json.dumps({k2: (f"{v2:.2e}" if isinstance(v2, float) else v2) for k2, v2 in check.items()}))
    del res, ref
    if dryrun:
        return
    from triton.testing import do_bench

    # ---- timings
    p_leaves = [t.to(torch.complex64).requires_grad_() for t in make_params(H, M, 7, dev)]
    rows = results["real_passes"]["timing"]
    for T in Ts:
        if elapsed() > s.budget_s * 0.85:
            log(f"real_passes: skipping T={T} (time)")
            continue
        q, k, v = (t.requires_grad_() for t in make_inputs(1, T, H, R, D, T, dev))
        do = torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16)
        gnone = [q, k, v, *p_leaves]
        row = {"T": T}
        for name, readout, one in REAL_VARIANTS:
            cfg = replace(base, real_one_pass=one)

            def fwd(q=q, k=k, v=v, readout=readout, cfg=cfg):
                with torch.no_grad():
                    return triton_interdomain(q, k, v, *p_leaves, chunk_size=cs, readout=readout, config=cfg)[0]

            def fwdbwd(q=q, k=k, v=v, do=do, readout=readout, cfg=cfg):
                triton_interdomain(q, k, v, *p_leaves, chunk_size=cs, readout=readout, config=cfg)[0].backward(do)

            fwdbwd()
            row[f"{name}_fwd_ms"] = do_bench(fwd, warmup=5, rep=40, return_mode="median")
            row[f"{name}_fb_ms"] = do_bench(fwdbwd, warmup=5, rep=60, grad_to_none=gnone, return_mode="median")
            for t in gnone:
                t.grad = None
            row[f"{name}_fb_MB"] = peak_mb(fwdbwd)
            for t in gnone:
                t.grad = None
        row["speedup_fwd"] = row["real_2pass_fwd_ms"] / row["real_1pass_fwd_ms"]
        row["speedup_fb"] = row["real_2pass_fb_ms"] / row["real_1pass_fb_ms"]
        rows.append(row)
        log("real_passes", json.dumps({k2: round(v2, 4) if isinstance(v2, float) else v2 for k2, v2 in row.items()}))
        del q, k, v, do, gnone, fwd, fwdbwd
        torch.cuda.empty_cache()


def _fla_gdn_fwd_ms(s: BenchSettings, T: int, H: int, d: int) -> float | None:
    """fla's GDN chunk forward (H heads, d_k = d_v = d, bf16, B=1) when fla is importable, else None."""
    dev = s.device
    chunk_gated_delta_rule = fla_gdn()
    if chunk_gated_delta_rule is None:
        return None
    from triton.testing import do_bench

    q, k, v = (torch.randn(1, T, H, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    g = -torch.rand(1, T, H, device=dev) * 0.1
    beta = torch.rand(1, T, H, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        return do_bench(
            lambda: chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True),
            warmup=3,
            rep=40,
            return_mode="median",
        )


@section("decode")
def decode(results: dict, s: BenchSettings):
    dev = s.device
    from triton.testing import do_bench

    from hybrid_attention.ops.interdomain.triton.decode import decode_params, interdomain_decode_step

    H, R, D, M = 16, 64, 64, 64
    log_lam, Bp, C = make_params(H, M, 3, dev)
    params = decode_params(log_lam, Bp, C)
    rows = []
    for Bsz in (1, 8):
        q, k, v = (t[:, 0].contiguous() for t in make_inputs(Bsz, 1, H, R, D, Bsz, dev))
        state = (torch.randn(Bsz, H, M, R + D, dtype=torch.complex64, device=dev) * 0.1).contiguous()
        out = torch.empty(Bsz, H, D, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            interdomain_decode_step(q, k, v, None, None, None, state, params=params, out=out)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            interdomain_decode_step(q, k, v, None, None, None, state, params=params, out=out)
        t_id = do_bench(g.replay, warmup=20, rep=100, return_mode="median")
        for L in (1024, 4096, 16384, 65536, 131072):
            kc = torch.randn(Bsz, H, L, R, device=dev, dtype=torch.bfloat16)
            vc = torch.randn(Bsz, H, L, D, device=dev, dtype=torch.bfloat16)
            qd = torch.randn(Bsz, H, 1, R, device=dev, dtype=torch.bfloat16)
            so = torch.empty(Bsz, H, 1, D, device=dev, dtype=torch.bfloat16)

            def step(qd=qd, kc=kc, vc=vc, so=so):
                so.copy_(F.scaled_dot_product_attention(qd, kc, vc))

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            gs = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gs):
                step()
            t_s = do_bench(gs.replay, warmup=20, rep=100, return_mode="median")
            rows.append({"B": Bsz, "ctx": L, "id_ms": t_id, "sdpa_ms": t_s})
            log("decode", json.dumps(rows[-1]))
            del kc, vc, gs
        torch.cuda.empty_cache()
    results["decode"] = rows


@section("sweep")
def sweep(results: dict, s: BenchSettings, T: int = 32768):
    """Launch configurations of forward+backward at one T, each with a per-stage breakdown (CUDA events around every
    launch); the fastest forward+backward becomes the configuration of the later sections."""
    dev = s.device
    from triton.testing import do_bench

    from benchmarks.profiling import StageProfiler
    from hybrid_attention.ops.interdomain.triton.config import DEFAULT_CONFIG, InterdomainConfig
    from hybrid_attention.ops.interdomain.triton.ops import triton_interdomain

    H, R, D, M = 16, 64, 64, 64
    log_lam, Bp, C = make_params(H, M, 7, dev)
    p_leaves = [
        log_lam.to(torch.complex64).requires_grad_(),
        Bp.to(torch.complex64).requires_grad_(),
        C.to(torch.complex64).requires_grad_(),
    ]
    q, k, v = (t.requires_grad_() for t in make_inputs(1, T, H, R, D, 5, dev))
    do = torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16)
    variants = [  # (name, kernel config, chunk length L); BC = sub-chunk rows (BC >= L: band matmuls only)
        # (runs 1-3 measured the split backward, L64 and the dz tile variants slower: NOTES.md; not repeated)
        ("L32_BC32_fused", {"BC": 32, "max_chunk": 32, "bwd_split": False, "fuse_dz": False}, 32),
        # reverse scan + state-carry gradient in one launch (_state_bwd_dz) instead of _state_bwd + _chunk_dz
        ("L32_BC32_fused_dz", {"BC": 32, "max_chunk": 32, "bwd_split": False, "fuse_dz": True}, 32),
    ]
    rows = []
    for name, cfg, cs in variants:
        if elapsed() > s.budget_s * 0.35:
            log(f"sweep: stop before {name} (time)")
            break
        config = InterdomainConfig(**cfg)
        try:

            def fwd(cs=cs, config=config):
                with torch.no_grad():
                    return triton_interdomain(q, k, v, *p_leaves, chunk_size=cs, config=config)[0]

            def fwdbwd(cs=cs, config=config, hooks=None):
                triton_interdomain(q, k, v, *p_leaves, chunk_size=cs, config=config, hooks=hooks)[0].backward(do)

            t0 = time.time()
            fwdbwd()
            sync()
            t_first = time.time() - t0
            tf = do_bench(fwd, warmup=3, rep=30, return_mode="median")
            tfb = do_bench(fwdbwd, warmup=3, rep=40, grad_to_none=[q, k, v, *p_leaves], return_mode="median")
            prof = StageProfiler()
            for _ in range(3):
                fwdbwd(hooks=prof)
            stages = {kk: round(vv / 3, 3) for kk, vv in prof.summary().items()}
            res = prof.resources()
            rows.append({"variant": name, "cfg": cfg, "chunk": cs, "T": T, "fwd_ms": tf, "fb_ms": tfb,
                         "first_call_s": round(t_first, 1), "stages_ms": stages, "kernels": res})  # fmt: skip
            log("sweep", json.dumps(rows[-1]))
        except Exception as exc:
            log(f"sweep {name} failed: {exc!r}")
            traceback.print_exc()
        for t in (q, k, v, *p_leaves):
            t.grad = None
    results["sweep"] = rows
    if rows:
        best = min(rows, key=lambda r: r["fb_ms"])
        chosen = InterdomainConfig(**best["cfg"])
        CONFIG["chosen"] = None if chosen == DEFAULT_CONFIG else chosen
        CHUNK["size"] = best["chunk"]
        results["chosen"] = {"variant": best["variant"], "cfg": best["cfg"], "chunk": best["chunk"]}
        log(f"sweep: using {best['variant']} for the following sections")


def summary(results: dict):
    log("\n================ Interdomain (Triton) vs causal SDPA, H200, bf16, B=1, H=16, d_h=R=M=64 ================")
    if "ceilings" in results:
        c = results["ceilings"]
        log(
            f"ceilings: copy {c['copy_TBps']:.2f} TB/s, bf16 mm {c['bf16_TFLOPs']:.0f} TF/s, "
            f"tf32 mm {c['tf32_TFLOPs']:.0f} TF/s"
        )
    for r in results.get("correctness", []):
        errs = " ".join(f"{n}={r[n]:.1e}" for n in ("o", "final", "dq", "dk", "dv", "dlog_lam", "dB", "dC", "dX0"))
        verdict = "PASS" if r["pass"] else "FAIL"
        ro = r.get("readout", "transpose")
        log(f"check {ro:<9} T={r['T']:>5} H={r['H']} {r['prec']:<6} {verdict} nan={r['nan']} {errs}")
    if results.get("timing"):
        log(
            f"{'T':>6} | {'ID fwd':>8} {'ID f+b':>8} | {'SDPA fwd':>8} {'SDPA f+b':>9} | {'x fwd':>6} {'x f+b':>6} | "
            f"{'ID MB':>7} {'SDPA MB':>7} | {'ID TF/s f, f+b':>14}"
        )
        for r in results["timing"]:
            log(
                f"{r['T']:>6} | {r['id_fwd_ms']:8.3f} {r['id_fb_ms']:8.3f} | "
                f"{r['sdpa_fwd_ms']:8.3f} {r['sdpa_fb_ms']:9.3f} | "
                f"{r['speedup_fwd']:6.2f} {r['speedup_fb']:6.2f} | {r['id_fb_MB']:7.0f} {r['sdpa_fb_MB']:7.0f} | "
                f"{r['id_fwd_TFLOPs']:6.1f} {r['id_fb_TFLOPs']:6.1f}"
                + (f" | fla GDN fwd {r['fla_gdn_fwd_ms']:.3f}" if r.get("fla_gdn_fwd_ms") else "")
            )
    if results.get("decode"):
        line = " ".join(
            f"B{r['B']}@{r['ctx'] // 1024}K: {r['id_ms'] * 1e3:.1f}/{r['sdpa_ms'] * 1e3:.1f}" for r in results["decode"]
        )
        log(f"decode us/token (interdomain graph / SDPA graph): {line}")
    rp = results.get("real_passes")
    if rp:
        c = rp["check"]
        errs = " ".join(f"{n}={c[n]:.1e}" for n in ("o", "final", "dq", "dk", "dv", "dlog_lam", "dB", "dC", "dX0"))
        log(f"check real 1-pass   T={c['T']:>5} H={c['H']} {'PASS' if c['pass'] else 'FAIL'} nan={c['nan']} {errs} | "
            f"2-pass o={c['2pass_o']:.1e} dq={c['2pass_dq']:.1e} | 1 vs 2 o={c['1v2_o']:.1e} dC={c['1v2_dC']:.1e}")
        if rp["timing"]:
            log(f"{'T':>6} | {'real 2-pass fwd, f+b':>20} | {'real 1-pass fwd, f+b':>20} | "
                f"{'transpose fwd, f+b':>18} | {'x fwd':>6} {'x f+b':>6}")
        for r in rp["timing"]:
            log(f"{r['T']:>6} | {r['real_2pass_fwd_ms']:9.3f} {r['real_2pass_fb_ms']:10.3f} | "
                f"{r['real_1pass_fwd_ms']:9.3f} {r['real_1pass_fb_ms']:10.3f} | "
                f"{r['transpose_fwd_ms']:8.3f} {r['transpose_fb_ms']:9.3f} | "
                f"{r['speedup_fwd']:6.2f} {r['speedup_fb']:6.2f}")
    for r in results.get("sweep", []):
        st = " ".join(f"{k2}={v2:.2f}" for k2, v2 in r["stages_ms"].items())
        log(f"sweep T=32K {r['variant']:<18} fwd {r['fwd_ms']:.2f} ms, f+b {r['fb_ms']:.2f} ms | f+b stages: {st}")
    if results.get("chosen"):
        log(f"chosen: {results['chosen']}")
    if results.get("kernels"):
        log("kernels: " + json.dumps(results["kernels"]))
    if results["errors"]:
        log("ERRORS: " + " | ".join(results["errors"]))
    log(f"total {elapsed():.0f} s")


def main(argv: list[str] | None = None) -> int:
    """Run every section (``--quick``: fewer lengths, no sweep; ``--final``: no smoke/decode sections;
    ``--correctness-only``: the float64 checks of every readout, nothing timed; the shared flags:
    ``common.bench_parser``); returns the exit status (1 when a section raised or a check failed)."""
    # a budget below common.DEFAULT_BUDGET_S (common.INTERDOMAIN_OPS_BUDGET_S, 440 s: the sections' fractions of it
    # were tuned against it); --budget-s / BENCH_BUDGET_S override it
    p = bench_parser(__doc__.splitlines()[0], budget_s=INTERDOMAIN_OPS_BUDGET_S)
    p.add_argument("--final", action="store_true", help="the last run of a lease: no smoke / decode sections")
    p.add_argument("--correctness-only", action="store_true", help="every readout vs float64, no timings")
    p.add_argument("--real-passes", action="store_true", help="only the real-passes section (1 vs 2 passes)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="InterdomainConfig override of the checked / timed configuration (e.g. save_states=0)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.set:
        from hybrid_attention.ops.interdomain.triton.config import DEFAULT_CONFIG

        CONFIG["chosen"] = config_with(DEFAULT_CONFIG, args.set)
    results: dict = {"errors": []}  # this run's JSON (every section writes into it; local to the run)
    s, quick = BenchSettings.from_args(args), args.quick
    import triton

    name = torch.cuda.get_device_name() if s.device == "cuda" else "cpu (interpreter dry run)"
    log(f"torch {torch.__version__}, triton {triton.__version__}, {name}")
    results["env"] = {"torch": torch.__version__, "triton": triton.__version__, "device": name}
    if s.dryrun:
        correctness(results, s, quick=True)
        real_passes(results, s, [])
        summary(results)
        return exit_status(results)
    if args.real_passes:  # "real" in one kernel pass vs two vs "transpose": check and timings only
        real_passes(results, s, [4096, 16384] if quick else [4096, 16384, 32768])
        s.write_json("interdomain_real_passes.json", results)
        summary(results)
        return exit_status(results)
    if args.correctness_only:  # every readout vs float64 at T 63 / 1000 / 4096 / 16384, no timings
        correctness(results, s, quick)
        s.write_json("interdomain_checks.json", results)
        summary(results)
        return exit_status(results)
    ceilings(results, s)
    if not args.final:  # decode kernel unchanged in the last run of a lease
        smoke(results, s)
    if not quick:
        sweep(results, s)
    correctness(results, s, quick)
    real_passes(results, s, [4096, 16384] if quick else [4096, 16384, 32768])
    timing(results, s, [4096, 16384] if quick else [4096, 16384, 32768, 65536, 131072])
    if not args.final:
        decode(results, s)
    s.write_json("interdomain_gpu.json", results)
    summary(results)
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
