"""Where a compiled training step spends its GPU time: the top CUDA kernels of one mixer's model, per step.

    python -m benchmarks.profile_train [--mixers s4d interdomain ...] [--batch 32] [--seq 1024] [--layers 8]
        [--vocab 8192] [--steps 3] [--top 15]

Model: the ``small`` preset with every layer the mixer (the credible-scale shape by default: 8 layers, vocabulary
8192), float32 master weights, bf16 autocast, fused AdamW, ``torch.compile(model)``. Three warm-up steps (the first
compiles), then ``--steps`` steps under ``torch.profiler`` (CUDA activity only). Prints, per mixer, the step time and
a table of the kernels with the largest total CUDA time per step (name cut to 70 characters, calls per step, ms per
step, share of the step's kernel time). Run on a GPU; the numbers are for reading a profile, not for the speed
table (that is ``hybrid-attention bench train``).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import cuda_steps_ms, training_step
from hybrid_attention.models import HybridConfig, HybridForCausalLM


def kernel_table(prof, steps: int, top: int, device_type=None) -> tuple[float, float, list[str]]:
    """(kernel ms per step, launches per step, markdown rows) of a ``torch.profiler`` run over ``steps`` steps: the
    kernels with the largest total device time (name cut to 70 characters, calls per step, ms per step, share)."""
    device_type = device_type or torch.autograd.DeviceType.CUDA
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in prof.events():
        if ev.device_type == device_type:
            total[ev.name] += (ev.device_time_total if device_type == torch.autograd.DeviceType.CUDA
                               else ev.cpu_time_total) / 1e3  # ms
            calls[ev.name] += 1
    kernel_ms = sum(total.values()) / steps
    rows = ["| kernel | calls/step | ms/step | share |", "|---|---|---|---|"]
    for name, ms in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        rows.append(f"| {name[:70]} | {calls[name] / steps:.0f} | {ms / steps:.4f} | "
                    f"{ms / steps / max(kernel_ms, 1e-12):.1%} |")
    return kernel_ms, sum(calls.values()) / steps, rows


def profile_mixer(mixer: str, batch: int, seq: int, layers: int, vocab: int, steps: int, top: int) -> str:
    """Profile one mixer's compiled training step; returns the printed table (markdown)."""
    cfg = HybridConfig.from_preset("small", layers=mixer, num_hidden_layers=layers, vocab_size=vocab)
    torch.manual_seed(0)
    model = HybridForCausalLM(cfg).cuda().float().train()
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, vocab, (batch, seq), device="cuda")
    step = training_step(compiled, opt, ids)
    t0 = time.time()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    step_ms = cuda_steps_ms(step, steps)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernel_ms, launches, table = kernel_table(prof, steps, top)
    lines = [f"### {mixer}: step {step_ms:.1f} ms ({batch * seq / step_ms * 1e3 / 1e3:.0f}k tok/s), kernels "
             f"{kernel_ms:.1f} ms/step, {launches:.0f} launches/step, warm-up {warm:.0f} s", *table]
    del model, compiled, opt
    torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mixers", nargs="+", default=["s4d", "interdomain", "gdn"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    a = p.parse_args(argv)
    for m in a.mixers:
        try:
            print(profile_mixer(m, a.batch, a.seq, a.layers, a.vocab, a.steps, a.top), flush=True)
        except Exception as e:  # one mixer's failure must not hide the others' profiles
            print(f"### {m}: failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)


if __name__ == "__main__":
    main()
