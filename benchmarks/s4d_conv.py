"""The S4D-only control's forms on the GPU: FFT (the default), the dense Toeplitz matmul and the chunked form.

    python -m benchmarks.s4d_conv [--model-steps 10] [--skip-model] [--skip-packed] [--chunk-size 64]
                                  [--chunk-sweep 128 256] [--toeplitz-blocks 4096 512 256 128] [--long-only]

1. Correctness: ``toeplitz_s4d`` and ``chunk_s4d`` under bf16 autocast (the training setting) and in float32, and
   ``fft_s4d`` in float32, against ``fft_s4d`` in float64 (equal to the token-loop definition to 1e-10,
   tests/ops/test_s4d_ops.py, test_s4d_chunk.py): relative RMS error of the output, the final state and every
   gradient, B=2, T=1000 (and T=3000 for the Toeplitz form in blocks), H=4, R=D=64, M=64, random initial state; and
   ``chunk_s4d`` on packed documents (B=1, T=4000, the log-normal mix of the varlen rows below) against the float64
   FFT run per document. Bars: 5e-3 outputs, 1e-2 gradients.
2. Op timing (CUDA events, median of 10 after 3 warm-ups): forward and forward+backward of ``fft_s4d``,
   ``toeplitz_s4d`` and ``chunk_s4d`` (``--chunk-size``), bf16 inputs under bf16 autocast, H=8, R=D=64, M=64, at the
   training shapes B×T = 64×1024, 16×2048, 4×4096; then fwd+bwd of ``chunk_s4d`` at the ``--chunk-sweep`` lengths
   beside Toeplitz at the same shapes (H200: L=64 is 2.1-4.1x slower than Toeplitz on dense batches).
2b. With ``--toeplitz-blocks``: the Toeplitz form at those block sizes (``toeplitz_convolve``'s rows per block, the
   zero blocks above the diagonal skipped; a block >= T is the dense matmul) and the FFT form beside them, eager at
   the three shapes and compiled at 16×2048 and 4×4096.
3. Packed documents (``--skip-packed`` to leave out): B=1, T=32768 cut into documents of benchmarks/train_speed.py's
   varlen mix (log-normal, median 256, seed 0), forward+backward under bf16 autocast: ``chunk_s4d`` eager and
   under ``torch.compile(fullgraph=True)`` (one graph for the whole pack), against the per-document FFT (eager
   only: compiled, it re-specialises per document length, the recompile storm that motivated the chunked form).
3b. With ``--long-only`` (nothing else): the dense long-context rows, 4×8192, 2×16384 and 1×32768 at H=12: the FFT,
   the Toeplitz form in blocks of 512 and the chunked form at ``--chunk-size`` and the ``--chunk-sweep`` lengths,
   eager and compiled (what "auto" runs above 4096 tokens).
4. Model: compiled training step (bf16 autocast, fused AdamW) of the credible-scale model (small preset, 8 layers,
   vocabulary 8192, B=32, T=1024) with ``s4d`` layers on each form, and a softmax model beside them: tokens/s.
Prints one table per part.
"""

from __future__ import annotations

import argparse
import functools
import statistics

import torch

from benchmarks.common import training_step
from benchmarks.train_speed import document_mix
from hybrid_attention.ops.s4d import chunk_s4d, fft_s4d, toeplitz_s4d
from hybrid_attention.ops.s4d.conv_form import conv_s4d
from hybrid_attention.ops.s4d.toeplitz import toeplitz_convolve

F64 = torch.float64


def _params(H: int, M: int, device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    re = -torch.rand(H, M, dtype=F64, generator=g) * 0.05 - 1e-3
    im = torch.rand(H, M, dtype=F64, generator=g) * 3.0
    log_lam = torch.complex(re, im)
    B = torch.randn(H, M, dtype=torch.complex128, generator=g) * 0.1
    C = torch.randn(H, M, M, dtype=torch.complex128, generator=g) / M**0.5
    w = torch.randn(H, M, dtype=F64, generator=g) / M**0.5
    return [x.to(device) for x in (log_lam, B, C, w)]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = torch.view_as_real(x) if x.is_complex() else x, torch.view_as_real(ref) if ref.is_complex() else ref
    return float((x.double() - ref.double()).pow(2).mean().sqrt() / ref.double().pow(2).mean().sqrt().clamp_min(1e-30))


def correctness(chunk_size: int = 64) -> str:
    dev = "cuda"
    Bsz, H, R, D, M = 2, 4, 64, 64, 64
    log_lam, B, C, w = _params(H, M, dev)
    names = ("out", "final", "da", "db", "dlog_lam", "dB", "dC", "dw", "dX0")
    lines = ["| form | " + " | ".join(names) + " | verdict |", "|---|" + "---|" * (len(names) + 1)]

    def run(fn, dtype, autocast):
        lo = [x.to(torch.complex64 if x.is_complex() else torch.float32) if dtype != F64 else x
              for x in (log_lam, B, C, w, X0)]
        leaves = [x.to(dtype).clone().requires_grad_() for x in (a, b)] + [x.clone().requires_grad_() for x in lo]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y, fin = fn(*leaves[:6], initial_state=leaves[6], output_final_state=True)
        loss = (y.to(dy.dtype) * dy).sum() + fin.abs().pow(2).sum().to(dy.dtype)
        return [y.detach(), fin.detach()] + list(torch.autograd.grad(loss, leaves))

    def chunk(*args, **kw):
        return chunk_s4d(*args, chunk_size=chunk_size, **kw)

    def row(label, got, want):
        errs = [_rel(x, r) for x, r in zip(got, want)]
        ok = max(errs[:2]) <= 5e-3 and max(errs[2:]) <= 1e-2 and all(e == e for e in errs)
        lines.append(f"| {label} | " + " | ".join(f"{e:.1e}" for e in errs) + f" | {'PASS' if ok else 'FAIL'} |")

    # T = 1000: the Toeplitz form as one dense matmul; T = 3000: in blocks (toeplitz.default_block)
    for T in (1000, 3000):
        a = torch.randn(Bsz, T, H, R, dtype=F64, device=dev)
        b = torch.randn(Bsz, T, H, D, dtype=F64, device=dev)
        X0 = torch.randn(Bsz, H, M, R + D, dtype=torch.complex128, device=dev) * 0.1
        dy = torch.randn(Bsz, T, H, R + D, dtype=F64, device=dev)
        ref = run(fft_s4d, F64, False)
        forms = [("toeplitz bf16 autocast", toeplitz_s4d, torch.float32, True),
                 ("toeplitz float32", toeplitz_s4d, torch.float32, False)]
        if T == 1000:
            forms += [(f"chunk L={chunk_size} bf16 autocast", chunk, torch.float32, True),
                      (f"chunk L={chunk_size} float32", chunk, torch.float32, False),
                      ("fft float32", fft_s4d, torch.float32, False)]
        for label, fn, dtype, ac in forms:
            row(f"{label} (T={T})", run(fn, dtype, ac), ref)

    # packed documents: B = 1, T = 4000 of the varlen mix, chunk vs the float64 FFT run per document
    T_p = 4000
    cu = document_mix(T_p, T_p).to(dev)
    n = cu.numel() - 1
    a = torch.randn(1, T_p, H, R, dtype=F64, device=dev)
    b = torch.randn(1, T_p, H, D, dtype=F64, device=dev)
    X0 = torch.randn(n, H, M, R + D, dtype=torch.complex128, device=dev) * 0.1
    dy = torch.randn(1, T_p, H, R + D, dtype=F64, device=dev)
    ref = run(lambda *x, **kw: fft_s4d(*x, cu_seqlens=cu, **kw), F64, False)
    for ac in (True, False):
        got = run(lambda *x, **kw: chunk(*x, cu_seqlens=cu, **kw), torch.float32, ac)
        row(f"chunk L={chunk_size} packed ({n} docs) {'bf16 autocast' if ac else 'float32'}", got, ref)
    return "\n".join(lines)


def _time(fn, reps: int = 10, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def _op_fns(fn, a, b, params):
    """(forward, forward+backward) closures of one op at one shape, under bf16 autocast."""
    def fwd():
        with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
            fn(a, b, *params)

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y, _ = fn(a, b, *params)
        y.float().sum().backward()

    return fwd, fwd_bwd


def op_timing(chunk_size: int = 64) -> str:
    H, R, D, M = 8, 64, 64, 64
    log_lam, B, C, w = (x.to(torch.complex64) if x.is_complex() else x.float() for x in _params(H, M, "cuda"))

    def chunk(*args, **kw):
        return chunk_s4d(*args, chunk_size=chunk_size, **kw)

    lines = ["| B×T | fft fwd ms | toeplitz fwd ms | chunk fwd ms | fft fwd+bwd ms | toeplitz fwd+bwd ms | "
             "chunk fwd+bwd ms | fwd+bwd fft/toeplitz | fwd+bwd toeplitz/chunk |",
             "|---|---|---|---|---|---|---|---|---|"]
    for Bsz, T in ((64, 1024), (16, 2048), (4, 4096)):
        a = torch.randn(Bsz, T, H, R, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(Bsz, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        row = {name: tuple(_time(f) for f in _op_fns(fn, a, b, (log_lam, B, C, w)))
               for name, fn in (("fft", fft_s4d), ("toeplitz", toeplitz_s4d), ("chunk", chunk))}
        lines.append(f"| {Bsz}×{T} | {row['fft'][0]:.2f} | {row['toeplitz'][0]:.2f} | {row['chunk'][0]:.2f} | "
                     f"{row['fft'][1]:.2f} | {row['toeplitz'][1]:.2f} | {row['chunk'][1]:.2f} | "
                     f"{row['fft'][1] / row['toeplitz'][1]:.2f}× | {row['toeplitz'][1] / row['chunk'][1]:.2f}× |")
    return "\n".join(lines)


def chunk_sweep(sizes: list[int]) -> str:
    """fwd+bwd ms of chunk_s4d at several chunk lengths beside the Toeplitz form, on the dense training batches
    (bf16 autocast, H=8, R=D=M=64): whether a longer chunk (a larger intra-chunk Toeplitz, fewer states) beats the
    full Toeplitz matmul, which is what "auto" runs on dense batches."""
    H, R, D, M = 8, 64, 64, 64
    log_lam, B, C, w = (x.to(torch.complex64) if x.is_complex() else x.float() for x in _params(H, M, "cuda"))
    lines = ["| B×T | toeplitz fwd+bwd ms | " + " | ".join(f"chunk L={L} fwd+bwd ms" for L in sizes) + " |",
             "|---|---|" + "---|" * len(sizes)]
    for Bsz, T in ((64, 1024), (16, 2048), (4, 4096)):
        a = torch.randn(Bsz, T, H, R, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(Bsz, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        cells = [_time(_op_fns(toeplitz_s4d, a, b, (log_lam, B, C, w))[1])]
        for L in sizes:
            def chunk(*args, _L=L, **kw):
                return chunk_s4d(*args, chunk_size=_L, **kw)
            cells.append(_time(_op_fns(chunk, a, b, (log_lam, B, C, w))[1]))
        lines.append(f"| {Bsz}×{T} | " + " | ".join(f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def block_sweep(blocks: list[int]) -> str:
    """fwd and fwd+bwd ms of the Toeplitz form at several ``toeplitz_convolve`` block sizes (rows per block; a block
    >= T is the dense matmul) and of the FFT form beside them, on the dense training batches (bf16 autocast, H=8,
    R=D=M=64), eager, and compiled (``torch.compile`` of the op's forward+backward) from T = 2048 on (the `small`
    training shape and the length where "auto" chooses between the two forms)."""
    H, R, D, M = 8, 64, 64, 64
    params = tuple(x.to(torch.complex64) if x.is_complex() else x.float() for x in _params(H, M, "cuda"))
    lines = ["| B×T | form | fwd ms | fwd+bwd ms | compiled fwd+bwd ms |", "|---|---|---|---|---|"]
    for Bsz, T in ((64, 1024), (16, 2048), (4, 4096)):
        a = torch.randn(Bsz, T, H, R, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(Bsz, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        forms = [(f"toeplitz block {blk}" if blk < T else "toeplitz dense",
                  functools.partial(conv_s4d, functools.partial(toeplitz_convolve, block=blk))) for blk in blocks]
        for label, form in forms + [("fft", fft_s4d)]:
            fwd, fwd_bwd = _op_fns(form, a, b, params)
            comp = "–"
            if T >= 2048:
                comp = f"{_time(_op_fns(torch.compile(form), a, b, params)[1]):.2f}"
            lines.append(f"| {Bsz}×{T} | {label} | {_time(fwd):.2f} | {_time(fwd_bwd):.2f} | {comp} |")
        torch.cuda.empty_cache()
    return "\n".join(lines)


def long_timing(chunk_sizes: list[int], H: int = 12) -> str:
    """fwd+bwd ms of the forms "auto" chooses between above 4096 tokens on dense batches (bf16 autocast, H heads,
    R=D=M=64, the s4d-125m shape): the FFT (eager; compiled it runs cuFFT the same), the Toeplitz form in blocks of
    512 rows (compiled) and the chunked form at ``chunk_sizes`` (eager and compiled)."""
    R, D, M = 64, 64, 64
    params = tuple(x.to(torch.complex64) if x.is_complex() else x.float() for x in _params(H, M, "cuda"))
    lines = ["| B×T | form | fwd+bwd ms | compiled fwd+bwd ms |", "|---|---|---|---|"]
    for Bsz, T in ((4, 8192), (2, 16384), (1, 32768)):
        a = torch.randn(Bsz, T, H, R, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(Bsz, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        forms = [("fft", fft_s4d, False),
                 ("toeplitz block 512", functools.partial(conv_s4d, functools.partial(toeplitz_convolve, block=512)),
                  True)]
        forms += [(f"chunk L={L}", functools.partial(chunk_s4d, chunk_size=L), True) for L in chunk_sizes]
        for label, form, comp in forms:
            eager = _time(_op_fns(form, a, b, params)[1])
            compiled = f"{_time(_op_fns(torch.compile(form), a, b, params)[1]):.2f}" if comp else "–"
            lines.append(f"| {Bsz}×{T} | {label} | {eager:.2f} | {compiled} |")
            torch._dynamo.reset()
        torch.cuda.empty_cache()
    return "\n".join(lines)


def packed_timing(chunk_size: int = 64, T: int = 32768) -> str:
    """Forward+backward on one packed row of T tokens (the varlen mix), bf16 autocast, H=8, R=D=M=64."""
    H, R, D, M = 8, 64, 64, 64
    log_lam, B, C, w = (x.to(torch.complex64) if x.is_complex() else x.float() for x in _params(H, M, "cuda"))
    cu = document_mix(T, T).cuda()
    a = torch.randn(1, T, H, R, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(1, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def chunk(*args, **kw):
        return chunk_s4d(*args, chunk_size=chunk_size, cu_seqlens=cu, **kw)

    def fft(*args, **kw):
        return fft_s4d(*args, cu_seqlens=cu, **kw)

    torch._dynamo.reset()
    compiled = torch.compile(chunk, fullgraph=True)
    lines = [f"| form (B=1, T={T}, {cu.numel() - 1} documents) | fwd ms | fwd+bwd ms |", "|---|---|---|"]
    for label, fn in ((f"chunk L={chunk_size} eager", chunk), (f"chunk L={chunk_size} compiled", compiled),
                      ("fft per document eager", fft)):
        fwd, fwd_bwd = _op_fns(fn, a, b, (log_lam, B, C, w))
        lines.append(f"| {label} | {_time(fwd):.2f} | {_time(fwd_bwd):.2f} |")
    return "\n".join(lines)


def _model_row(label: str, layers: str, opts: dict, steps: int, Bsz: int = 32, T: int = 1024) -> str:
    from hybrid_attention.models import HybridConfig, HybridForCausalLM

    cfg = HybridConfig.from_preset("small", layers=layers, num_hidden_layers=8, vocab_size=8192, mixer_options=opts)
    torch.manual_seed(0)
    model = HybridForCausalLM(cfg).cuda().float().train()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, 8192, (Bsz, T), device="cuda")

    step = training_step(compiled, opt, ids)

    ms = _time(step, reps=steps, warm=3)
    return f"| {label} | {ms:.1f} | {Bsz * T / ms * 1e3:,.0f} |"


def model_timing(steps: int) -> str:
    lines = ["| model | step ms | tok/s |", "|---|---|---|"]
    for label, layers, opts in (("softmax", "softmax", {}), ("s4d fft", "s4d", {}),
                                ("s4d toeplitz", "s4d", {"s4d": {"backend": "toeplitz"}}),
                                ("s4d chunk", "s4d", {"s4d": {"backend": "chunk"}})):
        lines.append(_model_row(label, layers, opts, steps))
        torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-steps", type=int, default=10)
    p.add_argument("--skip-model", action="store_true")
    p.add_argument("--skip-packed", action="store_true")
    p.add_argument("--chunk-size", type=int, default=64, help="chunk length of chunk_s4d (default 64)")
    p.add_argument("--chunk-sweep", type=int, nargs="*", default=[128, 256],
                   help="chunk lengths timed against Toeplitz on the dense batches (default 128 256; none: skip)")
    p.add_argument("--toeplitz-blocks", type=int, nargs="*", default=[],
                   help="block sizes of the Toeplitz form to time (e.g. 4096 512 256 128; default: skip)")
    p.add_argument("--long-only", action="store_true",
                   help="only the dense long-context rows (4x8192, 2x16384, 1x32768, H=12): FFT, Toeplitz, chunk")
    a = p.parse_args(argv)
    if a.long_only:
        print("## s4d dense long context: fwd+bwd (bf16 autocast, H=12, R=D=M=64)\n"
              + long_timing([a.chunk_size, *a.chunk_sweep]), flush=True)
        return
    print("## s4d forms: correctness vs float64 FFT\n" + correctness(a.chunk_size), flush=True)
    print("\n## s4d forms: op time (bf16 autocast, H=8, R=D=M=64)\n" + op_timing(a.chunk_size), flush=True)
    if a.chunk_sweep:
        print("\n## s4d chunk length sweep: fwd+bwd (bf16 autocast, H=8, R=D=M=64)\n" + chunk_sweep(a.chunk_sweep),
              flush=True)
    if a.toeplitz_blocks:
        print("\n## s4d Toeplitz block sizes (bf16 autocast, H=8, R=D=M=64)\n" + block_sweep(a.toeplitz_blocks),
              flush=True)
    if not a.skip_packed:
        print("\n## s4d packed documents: fwd+bwd (bf16 autocast, H=8, R=D=M=64)\n" + packed_timing(a.chunk_size),
              flush=True)
    if not a.skip_model:
        print("\n## compiled training step, small x8 layers, vocab 8192, B=32, T=1024\n" + model_timing(a.model_steps))


if __name__ == "__main__":
    main()
