#!/usr/bin/env python
"""Bilinear S4D core (``s4d_bilinear``, the H3-style multiplicative baseline; the paper's S4D-only control is the
linear readout in ``hybrid_attention.ops.s4d``) on the GPU: correctness of the Triton kernels vs the float64
reference, and timings vs the chunk-parallel PyTorch reference and the Interdomain Triton op, in one invocation (a
few minutes on an H200):

    hybrid-attention bench ops --only s4d_bilinear   (or: python -m benchmarks.s4d_bilinear_ops [--quick])

Sections (each guarded: a failure in one leaves the others' numbers):
  1. correctness: bf16 inputs, (B, T) in {(1, 63), (1, 1000), (1, 4096), (3, 300)}, H=4, R=M=64 (two channel tiles;
     the last case several batch rows and a partial last chunk), every kernel-written buffer poisoned with NaN
     first; relative RMS error vs ``chunk_s4d_bilinear`` in float64 on the same GPU for o, the final state and the
     gradients of a, b, log λ, B, C and the initial state (limits 5e-3 outputs/states, 1e-2 gradients); and whether
     a second backward gives bitwise the same gradients (``deterministic``: expected since the table gradients are
     partial sums reduced in a fixed order, not atomics; reported, not part of PASS);
  2. timings (``bench_ms``: triton.testing.do_bench median), R=M=64, bf16: first the training shapes of the
     ``small`` preset, B=32 T=512 and B=16 T=2048 with H=8, then B=1, H=16, T in {4K, 16K}: forward and
     forward+backward of ``triton_s4d_bilinear`` (with ``bwd/fwd`` = (fwd+bwd - fwd) / fwd, the backward's cost in
     forwards, and the size of its table-gradient partial buffer), of the reference ``chunk_s4d_bilinear`` (bf16
     activations, complex64 parameters; at 16K only when 4K was fast enough) and of the Interdomain Triton op at the
     same shape (R=D=64), with peak memory;
  3. (not with --quick) a launch-config sweep of the readout kernels (channel tile, warps) at B=1, T=4K, H=16.
Rows go to ``results["s4d_bilinear"]`` (``run``) and, from ``main``, to ``<--out>/s4d_bilinear_gpu.json`` (default
``$OUT``). ``--dryrun`` (or ``BENCH_DRYRUN=1``) with ``TRITON_INTERPRET=1`` runs everything at tiny shapes on the CPU
(a smoke test of this file, not a measurement).

Measured before the atomics-free backward (H200, bf16, B=32 T=512 H=8 R=M=64): forward 7.55 ms, forward+backward
108 ms, bwd/fwd 13.3; the readout kernels 88-91 TFLOP/s forward, 31.5 forward+backward on ``flop_model``.

PREDICTION (not yet measured) for the backward whose table gradients are per-program partial slots summed by one
torch reduction (``s4d_bilinear/triton/ops.py``) instead of float32 atomics: bwd/fwd about 5-6 at both training
shapes (forward+backward ≈ 45-55 ms at B=32 T=512, from 108), with 4.0 the floor. Reasoning: ``flop_model`` gives
the backward readout 4.0x the forward's matmul FLOPs (2y + 8·BT + 16·M vs y MACs per token, channel and mode,
y = 8M + 4BT, M=64, BT=32: 2560 vs 640), and the forward is almost all readout (7.6 ms at 90 TFLOP/s is its 687
GFLOP); the state-scan part of the backward is O(M·2R) per token, ~1-2 ms. The old backward ran at 31.5 TFLOP/s
while doing, per program, 64 x 4 rows of scalar ``atom.global.gpu.acq_rel.add.f32`` (sm_90 PTX: value-returning
atomics with acquire-release ordering, not fire-and-forget ``red``) into [H, 2, M, M]-sized tables that the
B·NT·R/JT = 1024 programs of a head share (B=32 T=512), at one CTA per SM (255 registers x 256 threads), so little
else hides their latency; the slot stores are plain ``st.global``. The
backward kernels still spill 0.8-0.9 KB per thread (sm_90 AOT, PART 1 / 2; unchanged by this change, so they will
not reach the forward's 90 TFLOP/s): at ~60 TFLOP/s the backward takes ~46 ms + ~1-2 ms of scans, bwd/fwd ≈ 6; at
90 TFLOP/s it would be 4. A bwd/fwd still near 13 would mean the atomics were not the bottleneck (then: spills,
the single CTA per SM, the band ``tl.gather`` of dKern). The extra host reduction reads the partial buffer once
(0.41 / 0.81 GB at the two training shapes, < 0.3 ms at H200 bandwidth).
"""

from __future__ import annotations

import math
import sys

import torch

from benchmarks.common import (
    BenchSettings,
    bench_ms,
    bench_parser,
    exit_status,
    guarded,
    log,
    peak_mb,
    rel_rms,
    sync,
)
from hybrid_attention.ops.s4d_bilinear import chunk_s4d_bilinear

__all__ = ["run", "main"]

LIMIT_OUT = 5e-3  # relative RMS limit of o and the final state (bf16 inputs, float32 state math, tf32 matmuls)
LIMIT_GRAD = 1e-2  # ... and of the gradients


def make_params(H: int, M: int, seed: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """S4D-Inv-like discretised log λ (step log-uniform in [1e-3, 1e-1]) with a quarter of the modes fast
    (Re log λ in [-3, -0.1]); complex Gaussian B (scale 0.5) and C (E|C_ij|² = 1/M). complex128 on ``device``."""
    g = torch.Generator().manual_seed(seed)
    step = torch.exp(torch.empty(H, 1, dtype=torch.float64).uniform_(math.log(1e-3), math.log(1e-1), generator=g))
    n = torch.arange(M, dtype=torch.float64)
    im = step * (M / math.pi) * (M / (2 * n + 1) - 1)
    re = (-0.5 * step).expand(H, M).clone()
    fast = torch.rand(H, M, generator=g) < 0.25
    re[fast] = -torch.exp(
        torch.empty(int(fast.sum()), dtype=torch.float64).uniform_(math.log(0.1), math.log(3.0), generator=g)
    )
    B = 0.5 * torch.randn(H, M, dtype=torch.complex128, generator=g)
    C = torch.randn(H, M, M, dtype=torch.complex128, generator=g) / math.sqrt(M)
    return torch.complex(re, im).to(device), B.to(device), C.to(device)


def flop_model(Bsz: int, T: int, H: int, R: int, M: int, BT: int = 32, split: bool = True) -> dict:
    """Matmul FLOPs of the readout kernels (the state scans are O(M·2R) per token and left out), counted per
    token-channel and output mode m as the kernels compute them (masked tile work not included):
    forward Y^a_m, Y^b_m: 2 x (4 M + 2 BT) MACs; backward: recompute (twice with bwd_split), da/db 4 BT, X0 adjoint
    8 M, g_P 8 M, g_Toe 4 BT MACs."""
    n = Bsz * T * H * R * M
    y = 8 * M + 4 * BT
    fwd = 2 * n * y
    bwd = 2 * n * (y * (2 if split else 1) + 4 * BT + 16 * M + 4 * BT)
    return {"fwd": fwd, "fwdbwd": fwd + bwd}


def _leaves(*xs: torch.Tensor, real: torch.dtype, cplx: torch.dtype) -> list[torch.Tensor]:
    return [x.detach().to(cplx if x.is_complex() else real).requires_grad_() for x in xs]


def correctness(s: BenchSettings, results: dict, quick: bool) -> None:
    dev, dryrun = s.device, s.dryrun
    from hybrid_attention.ops.s4d_bilinear.triton import triton_s4d_bilinear
    from hybrid_attention.ops.s4d_bilinear.triton.config import DEFAULT_CONFIG, S4DBilinearConfig

    R = M = 16 if dryrun else 64
    H = 1 if dryrun else 4
    cases = [(2, 40)] if dryrun else ([(1, 63), (1, 1000), (3, 300)] if quick else [(1, 63), (1, 1000), (1, 4096),
                                                                                     (3, 300)])
    names = ("o", "final", "da", "db", "dlog_lam", "dB", "dC", "dinit")
    for idx, (Bsz, T) in enumerate(cases):
        seed = 300 + idx
        log_lam, Bp, C = make_params(H, M, seed, dev)
        g = torch.Generator().manual_seed(seed + 1)
        a = torch.randn(Bsz, T, H, R, generator=g).to(dev, torch.bfloat16)
        b = torch.randn(Bsz, T, H, R, generator=g).to(dev, torch.bfloat16)
        X0 = (0.5 * torch.randn(Bsz, H, M, 2 * R, dtype=torch.complex128, generator=g)).to(dev)
        do = torch.randn(Bsz, T, H, R, generator=g).to(dev, torch.bfloat16)
        dfin = (1e-2 * torch.randn(Bsz, H, M, 2 * R, dtype=torch.complex128, generator=g)).to(dev)
        # float64 reference on the same bf16-rounded inputs
        ref = _leaves(a, b, log_lam, Bp, C, X0, real=torch.float64, cplx=torch.complex128)
        o_ref, f_ref = chunk_s4d_bilinear(*ref[:5], initial_state=ref[5], output_final_state=True, chunk_size=64)
        g_ref = torch.autograd.grad((o_ref * do.double()).sum() + (f_ref.conj() * dfin).real.sum(), ref)
        # the default tf32 matmuls first; if they miss a limit, the same case again with exact float32 matmuls
        # (tells a precision problem from a bug)
        # (every buffer the kernels write, ours and the shared state scans', starts as NaN: poison)
        for prec in (DEFAULT_CONFIG.dot_prec, "ieee"):
            cfg = S4DBilinearConfig(dot_prec=prec, poison=True)
            tri = _leaves(a, b, log_lam, Bp, C, X0, real=torch.bfloat16, cplx=torch.complex64)
            runs = []
            for _ in range(2):  # the second run only for the determinism check
                o, fin = triton_s4d_bilinear(*tri[:5], initial_state=tri[5], output_final_state=True, chunk_size=64,
                                             config=cfg)
                runs.append(torch.autograd.grad(
                    (o.float() * do.float()).sum() + (fin.conj() * dfin.to(torch.complex64)).real.sum(), tri
                ))  # fmt: skip
            grads = runs[0]
            det = all(torch.equal(x, y) for x, y in zip(*runs))
            errs = [rel_rms(o, o_ref), rel_rms(fin, f_ref)] + [rel_rms(x, y) for x, y in zip(grads, g_ref)]
            finite = all(
                bool(torch.isfinite(torch.view_as_real(x) if x.is_complex() else x).all()) for x in (o, fin, *grads)
            )
            ok = finite and max(errs[:2]) <= LIMIT_OUT and max(errs[2:]) <= LIMIT_GRAD
            row = {"kind": "correctness", "B": Bsz, "T": T, "H": H, "R": R, "M": M, "dot": prec, "finite": finite,
                   "deterministic": det, "pass": ok}  # fmt: skip
            row.update({f"err_{n}": e for n, e in zip(names, errs)})
            results["s4d_bilinear"].append(row)
            detail = " ".join(f"{n}={e:.1e}" for n, e in zip(names, errs))
            log(f"s4d_bilinear correctness B={Bsz} T={T} (dot {prec}): {'PASS' if ok else 'FAIL'} {detail} "
                f"(second backward bitwise equal: {det})")  # fmt: skip
            if ok or dryrun or prec == "ieee":
                break


def _time_pair(s: BenchSettings, fn_fwd, leaves, do) -> tuple[float, float, float]:
    """(forward ms, forward+backward ms, peak MB of forward+backward) of ``fn_fwd(*leaves) -> o``."""
    dev = s.device

    def fwd():
        with torch.no_grad():
            fn_fwd(*leaves)

    def fwdbwd():
        fn_fwd(*leaves).backward(do)

    t_f = bench_ms(fwd)
    t_fb = bench_ms(fwdbwd, grad_to_none=leaves)
    mem = peak_mb(fwdbwd) if dev == "cuda" else float("nan")  # the CPU dry run skips the extra call
    for x in leaves:
        x.grad = None
    return t_f, t_fb, mem


def timing(s: BenchSettings, results: dict, quick: bool) -> None:
    dev, dryrun = s.device, s.dryrun
    from hybrid_attention.ops.interdomain.triton import triton_interdomain
    from hybrid_attention.ops.s4d_bilinear.triton import triton_s4d_bilinear

    R = M = 16 if dryrun else 64
    # (B, T, H): the `small` preset's training shapes first (the ones the backward/forward ratio is about), then the
    # long single sequences
    shapes = [(32, 512, 8), (16, 2048, 8), (1, 4096, 16), (1, 16384, 16)]
    if dryrun:
        shapes = [(2, 40, 1)]
    elif quick:
        shapes = [(32, 512, 8), (16, 2048, 8), (1, 4096, 16)]
    ref_ms_4k = None
    for Bsz, T, H in shapes:
        if s.budget_left() < 60:
            log(f"s4d_bilinear timing: skipping B={Bsz} T={T} (time)")
            continue
        log_lam, Bp, C = make_params(H, M, 7, dev)
        g = torch.Generator().manual_seed(8)
        a, b, q = (torch.randn(Bsz, T, H, R, generator=g).to(dev, torch.bfloat16) for _ in range(3))
        do = torch.randn(Bsz, T, H, R, generator=g).to(dev, torch.bfloat16)
        leaves = _leaves(a, b, log_lam, Bp, C, real=torch.bfloat16, cplx=torch.complex64)
        variants = {
            "triton_s4d_bilinear": (lambda *x: triton_s4d_bilinear(*x, chunk_size=64)[0], leaves),
            "interdomain_triton": (
                lambda q_, *x: triton_interdomain(q_, *x, chunk_size=64)[0],
                [q.detach().requires_grad_(), *leaves],
            ),
        }
        # the reference is slow (a Python loop over chunks): only at 4K, and at longer T if 4K took < 1 s
        if T <= 4096 or (ref_ms_4k is not None and ref_ms_4k < 1000.0):
            variants["reference_chunk_s4d_bilinear"] = (lambda *x: chunk_s4d_bilinear(*x, chunk_size=64)[0], leaves)
        for name, (fn, lv) in variants.items():
            try:
                t_f, t_fb, mem = _time_pair(s, fn, lv, do)
            except torch.OutOfMemoryError as exc:  # the reference at long T
                log(f"s4d_bilinear timing {name} B={Bsz} T={T}: OOM ({exc.__class__.__name__})")
                torch.cuda.empty_cache()
                continue
            if name == "reference_chunk_s4d_bilinear" and T == 4096 and Bsz == 1:
                ref_ms_4k = t_fb
            row = {"kind": "timing", "op": name, "B": Bsz, "T": T, "H": H, "R": R, "M": M, "fwd_ms": t_f,
                   "fwdbwd_ms": t_fb, "bwd_over_fwd": (t_fb - t_f) / t_f, "peak_mb": mem}  # fmt: skip
            if name == "triton_s4d_bilinear":  # achieved matmul rate of the readout kernels under the FLOP model
                from hybrid_attention.ops.s4d_bilinear.triton import ops as sops
                from hybrid_attention.ops.s4d_bilinear.triton.config import DEFAULT_CONFIG

                fl = flop_model(Bsz, T, H, R, M, sops.kernel_chunk(64), DEFAULT_CONFIG.bwd_split)
                row["fwd_TFLOPs"] = fl["fwd"] / (t_f * 1e-3) / 1e12
                row["fwdbwd_TFLOPs"] = fl["fwdbwd"] / (t_fb * 1e-3) / 1e12
                row["bwd_TFLOPs"] = (fl["fwdbwd"] - fl["fwd"]) / ((t_fb - t_f) * 1e-3) / 1e12
                row["tab_partial_mb"] = sops.tab_partial_bytes(Bsz, T, H, R, M, 64) / 1e6
                log(f"s4d_bilinear timing triton_s4d_bilinear: {row['fwd_TFLOPs']:.1f} TFLOP/s forward, "
                    f"{row['fwdbwd_TFLOPs']:.1f} forward+backward, {row['bwd_TFLOPs']:.1f} backward alone (readout "
                    f"matmuls, flop_model); table-gradient partials {row['tab_partial_mb']:.0f} MB")  # fmt: skip
            results["s4d_bilinear"].append(row)
            log(f"s4d_bilinear timing {name:20s} B={Bsz:2d} T={T:6d} H={H:2d}: fwd {t_f:9.3f} ms  "
                f"fwd+bwd {t_fb:9.3f} ms  bwd/fwd {row['bwd_over_fwd']:5.2f}  peak {mem:8.1f} MB")  # fmt: skip
        sync()


def sweep(s: BenchSettings, results: dict) -> None:
    """Launch-config sweep of triton_s4d_bilinear (channel tile JT x backward warps), forward+backward at B=1,
    T=4096, H=16; each config is checked against the default one before it is timed."""
    dev, dryrun = s.device, s.dryrun
    from hybrid_attention.ops.s4d_bilinear.triton import triton_s4d_bilinear
    from hybrid_attention.ops.s4d_bilinear.triton.config import S4DBilinearConfig

    R = M = 16 if dryrun else 64
    Bsz, T, H = (1, 40, 1) if dryrun else (1, 4096, 16)
    log_lam, Bp, C = make_params(H, M, 9, dev)
    g = torch.Generator().manual_seed(10)
    a, b, do = (torch.randn(Bsz, T, H, R, generator=g).to(dev, torch.bfloat16) for _ in range(3))
    leaves = _leaves(a, b, log_lam, Bp, C, real=torch.bfloat16, cplx=torch.complex64)
    o_def = triton_s4d_bilinear(*leaves)[0].detach().float()
    # (JT, warps_fwd, warps_bwd, bwd_split); JT=64 is left out: the fused backward needs 240 KB of shared memory
    configs = [(32, 4, 8, True), (32, 4, 8, False), (16, 4, 4, True), (16, 4, 4, False), (16, 4, 8, True),
               (32, 8, 4, True), (32, 4, 4, True)]  # fmt: skip
    for jt, wf, wb, split in configs[:1] if dryrun else configs:
        if s.budget_left() < 60:
            log("s4d_bilinear sweep: stopping (time)")
            break
        cfg = S4DBilinearConfig(JT=jt, warps_fwd=wf, warps_bwd=wb, bwd_split=split)
        err = rel_rms(triton_s4d_bilinear(*leaves, config=cfg)[0].detach().float(), o_def.double())
        t_f, t_fb, _ = _time_pair(s, lambda *x, cfg=cfg: triton_s4d_bilinear(*x, config=cfg)[0], leaves, do)
        results["s4d_bilinear"].append(
            {"kind": "sweep", "JT": jt, "warps_fwd": wf, "warps_bwd": wb, "bwd_split": split, "B": Bsz, "T": T,
             "H": H, "fwd_ms": t_f, "fwdbwd_ms": t_fb, "bwd_over_fwd": (t_fb - t_f) / t_f, "diff_vs_default": err}
        )  # fmt: skip
        log(f"s4d_bilinear sweep JT={jt:2d} warps fwd/bwd {wf}/{wb} split {split!s:5s}: fwd {t_f:8.3f} ms  "
            f"fwd+bwd {t_fb:8.3f} ms  bwd/fwd {(t_fb - t_f) / t_f:5.2f}  (diff vs default {err:.1e})")  # fmt: skip


def summary(results: dict) -> None:
    """One short table of the rows of this section."""
    log("\n== s4d_bilinear summary ==")
    for r in results.get("s4d_bilinear", []):
        if r["kind"] == "correctness":
            worst = max(v for k, v in r.items() if k.startswith("err_"))
            verdict = "PASS" if r["pass"] else "FAIL"
            log(f"correctness B={r['B']} T={r['T']:5d} dot {r['dot']:5s}: {verdict} (worst rel RMS {worst:.1e}; "
                f"deterministic backward: {r['deterministic']})")  # fmt: skip
    log(f"{'op':28s} {'B':>3s} {'T':>6s} {'H':>3s} {'fwd ms':>10s} {'fwd+bwd ms':>11s} {'bwd/fwd':>8s} "
        f"{'peak MB':>9s}")  # fmt: skip
    for r in results.get("s4d_bilinear", []):
        if r["kind"] == "timing":
            log(f"{r['op']:28s} {r['B']:3d} {r['T']:6d} {r['H']:3d} {r['fwd_ms']:10.3f} {r['fwdbwd_ms']:11.3f} "
                f"{r['bwd_over_fwd']:8.2f} {r['peak_mb']:9.1f}")  # fmt: skip


def run(s: BenchSettings, results: dict, quick: bool = False) -> None:
    """Correctness then timings of the bilinear S4D Triton op; appends rows to ``results["s4d_bilinear"]`` and
    prints a table."""
    results.setdefault("s4d_bilinear", [])
    guarded(results, "s4d_bilinear correctness")(correctness)(s, results, quick)
    guarded(results, "s4d_bilinear timing")(timing)(s, results, quick)
    if not quick:
        guarded(results, "s4d_bilinear sweep")(sweep)(s, results)
    summary(results)


def main(argv: list[str] | None = None) -> int:
    """Entry of ``hybrid-attention bench ops --only s4d_bilinear``: runs ``run`` and writes
    ``<--out>/s4d_bilinear_gpu.json`` (flags: ``common.bench_parser``); returns the exit status (1 when a section
    raised or a check failed)."""
    args = bench_parser(__doc__.splitlines()[0]).parse_args(sys.argv[1:] if argv is None else argv)
    s = BenchSettings.from_args(args)
    results: dict = {"errors": []}
    run(s, results, quick=args.quick)
    s.write_json("s4d_bilinear_gpu.json", results)
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
