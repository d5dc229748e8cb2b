"""The S4D-only control's two convolutions on the GPU: FFT (today's default) vs the dense Toeplitz matmul.

    python -m benchmarks.s4d_conv [--model-steps 10] [--skip-model]

1. Correctness: ``toeplitz_s4d`` under bf16 autocast (the training setting) and in float32 against ``fft_s4d`` in
   float64 (equal to the token-loop definition to 1e-10, tests/ops/test_s4d_ops.py): relative RMS error of the output
   and of every gradient, B=2, T=1000, H=4, R=D=64, M=64, random initial state. Bars: 5e-3 outputs, 1e-2 gradients.
2. Op timing (CUDA events, median of 10 after 3 warm-ups): forward and forward+backward of ``fft_s4d`` and
   ``toeplitz_s4d``, bf16 inputs under bf16 autocast, H=8, R=D=64, M=64, at the training shapes B×T = 64×1024,
   16×2048, 4×4096.
3. Model: compiled training step (bf16 autocast, fused AdamW) of the credible-scale model (small preset, 8 layers,
   vocabulary 8192, B=32, T=1024) with ``s4d`` layers on each convolution, and a softmax model beside them: tokens/s.
Prints one table per part.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.common import training_step
from hybrid_attention.ops.s4d import fft_s4d, toeplitz_s4d

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


def correctness() -> str:
    dev = "cuda"
    Bsz, T, H, R, D, M = 2, 1000, 4, 64, 64, 64
    log_lam, B, C, w = _params(H, M, dev)
    a = torch.randn(Bsz, T, H, R, dtype=F64, device=dev)
    b = torch.randn(Bsz, T, H, D, dtype=F64, device=dev)
    X0 = torch.randn(Bsz, H, M, R + D, dtype=torch.complex128, device=dev) * 0.1
    dy = torch.randn(Bsz, T, H, R + D, dtype=F64, device=dev)
    names = ("out", "final", "da", "db", "dlog_lam", "dB", "dC", "dw", "dX0")

    def run(fn, dtype, autocast):
        lo = [x.to(torch.complex64 if x.is_complex() else torch.float32) if dtype != F64 else x
              for x in (log_lam, B, C, w, X0)]
        leaves = [x.to(dtype).clone().requires_grad_() for x in (a, b)] + [x.clone().requires_grad_() for x in lo]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y, fin = fn(*leaves[:6], initial_state=leaves[6], output_final_state=True)
        loss = (y.to(dy.dtype) * dy).sum() + fin.abs().pow(2).sum().to(dy.dtype)
        return [y.detach(), fin.detach()] + list(torch.autograd.grad(loss, leaves))

    ref = run(fft_s4d, F64, False)
    lines = ["| form | " + " | ".join(names) + " | verdict |", "|---|" + "---|" * (len(names) + 1)]
    for label, fn, dtype, ac in (("toeplitz bf16 autocast", toeplitz_s4d, torch.float32, True),
                                 ("toeplitz float32", toeplitz_s4d, torch.float32, False),
                                 ("fft float32", fft_s4d, torch.float32, False)):
        errs = [_rel(x, r) for x, r in zip(run(fn, dtype, ac), ref)]
        ok = max(errs[:2]) <= 5e-3 and max(errs[2:]) <= 1e-2 and all(e == e for e in errs)
        lines.append(f"| {label} | " + " | ".join(f"{e:.1e}" for e in errs) + f" | {'PASS' if ok else 'FAIL'} |")
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


def op_timing() -> str:
    H, R, D, M = 8, 64, 64, 64
    log_lam, B, C, w = (x.to(torch.complex64) if x.is_complex() else x.float() for x in _params(H, M, "cuda"))
    lines = ["| B×T | fft fwd ms | toeplitz fwd ms | fft fwd+bwd ms | toeplitz fwd+bwd ms | fwd+bwd ratio |",
             "|---|---|---|---|---|---|"]
    for Bsz, T in ((64, 1024), (16, 2048), (4, 4096)):
        a = torch.randn(Bsz, T, H, R, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        b = torch.randn(Bsz, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        row = {name: tuple(_time(f) for f in _op_fns(fn, a, b, (log_lam, B, C, w)))
               for name, fn in (("fft", fft_s4d), ("toeplitz", toeplitz_s4d))}
        lines.append(f"| {Bsz}×{T} | {row['fft'][0]:.2f} | {row['toeplitz'][0]:.2f} | {row['fft'][1]:.2f} | "
                     f"{row['toeplitz'][1]:.2f} | {row['fft'][1] / row['toeplitz'][1]:.2f}× |")
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
                                ("s4d toeplitz", "s4d", {"s4d": {"backend": "toeplitz"}})):
        lines.append(_model_row(label, layers, opts, steps))
        torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-steps", type=int, default=10)
    p.add_argument("--skip-model", action="store_true")
    a = p.parse_args(argv)
    print("## s4d convolutions: correctness vs float64 FFT\n" + correctness(), flush=True)
    print("\n## s4d convolutions: op time (bf16 autocast, H=8, R=D=M=64)\n" + op_timing(), flush=True)
    if not a.skip_model:
        print("\n## compiled training step, small x8 layers, vocab 8192, B=32, T=1024\n" + model_timing(a.model_steps))


if __name__ == "__main__":
    main()
