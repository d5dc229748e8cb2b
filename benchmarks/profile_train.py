"""Where a compiled training step spends its GPU time: the top CUDA kernels of one mixer's model, per step.

    python -m benchmarks.profile_train [--mixers s4d interdomain ...] [--batch 32] [--seq 1024] [--layers 8]
        [--vocab 8192] [--steps 3] [--top 15]

Model: the ``small`` preset with every layer the mixer (the credible-scale shape by default: 8 layers, vocabulary
8192), float32 master weights, bf16 autocast, fused AdamW, ``torch.compile(model)``. Three warm-up steps (the first
compiles), then ``--steps`` steps under ``torch.profiler`` (CUDA activity only). Prints, per mixer, the step time and
the split of the step's GPU time (summed kernel time, time with a kernel running, GPU idle = host gaps, launches per
step) and a table of the kernels with the largest total CUDA time per step (name cut to 70 characters, calls per
step, ms per step, share of the step's kernel time). ``bench train --profile N`` (benchmarks/train_speed.py) runs
the same split for every row of the speed table in the run that times it. Run on a GPU; the numbers are for reading
a profile, not for the speed table (that is ``hybrid-attention bench train``).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import cuda_steps_ms, training_step
from hybrid_attention.models import HybridConfig, HybridForCausalLM

__all__ = ["kernel_category", "CATEGORIES", "kernel_table", "profile_steps", "profile_table", "profile_mixer"]

CATEGORIES = ("matmul", "attention", "mixer op", "fused glue", "optimizer", "elementwise", "other")
"""The kinds of kernel a training step's GPU time is split into (``kernel_category``)."""

_CATEGORY_MARKS = (  # (category, name fragments), first match wins; names lower-cased. Inductor's kernels first: the
    # names of its fused pointwise kernels carry the ops they fuse ("..._flash_attention_...", "..._addmm_...")
    ("matmul", ("triton_tem_",)),
    ("fused glue", ("triton_poi_", "triton_red_", "triton_per_")),
    ("attention", ("flash", "fmha", "sdpa", "attention")),
    ("matmul", ("gemm", "cutlass", "nvjet", "xmma", "cublas", "wgmma", "splitk")),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("elementwise", ("elementwise", "reduce_kernel", "memcpy", "memset", "copy", "fill", "index", "scatter",
                     "gather", "cat", "softmax", "norm")),
)


def kernel_category(name: str) -> str:
    """The kind of one CUDA kernel, from its name (one of ``CATEGORIES``): "attention" (flash / cuDNN SDPA),
    "matmul" (cuBLAS, CUTLASS, nvjet, inductor's matmul templates), "optimizer" (fused / foreach AdamW), "fused glue"
    (inductor's pointwise, reduction and persistent-reduction kernels), "elementwise" (eager ATen elementwise,
    reductions, copies), "mixer op" (the library's own Triton kernels, whose names start with "_"), else "other"."""
    if name.startswith("_"):
        return "mixer op"
    low = name.lower()
    for category, marks in _CATEGORY_MARKS:
        if any(m in low for m in marks):
            return category
    return "other"


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


def _busy_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs in, ms out): the time at least one kernel runs."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        busy += b - max(a, end)
        end = b
    return busy / 1e3


def profile_steps(step, steps: int, step_ms: float, top: int = 10) -> dict:
    """Profile ``steps`` calls of ``step`` (a training step closure, already warmed up) and split the step's GPU time.

    ``step_ms``: the step time measured without the profiler (CUDA events). Returns ``kernel_ms`` (summed kernel
    time per step), ``busy_ms`` (time per step with at least one kernel running), ``gap_ms`` = step_ms - busy_ms (the
    GPU idle: host launch overhead, syncs; ≥ 0), ``gap_share`` (gap_ms / step_ms), ``launches`` (kernel launches per
    step), ``top`` (the ``top`` kernels by total time: [name cut to 70 characters, calls/step, ms/step, share of
    kernel_ms]) and ``categories`` ({``kernel_category``: ms/step} over every kernel).
    On the CPU (dry runs) the operators stand in for kernels.
    """
    cuda = torch.cuda.is_available()
    device_type = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    intervals = []
    for ev in prof.events():
        if ev.device_type != device_type:
            continue
        ms = (ev.device_time_total if cuda else ev.cpu_time_total) / 1e3
        total[ev.name] += ms
        calls[ev.name] += 1
        if cuda:
            intervals.append((ev.time_range.start, ev.time_range.end))
    kernel_ms = sum(total.values()) / steps
    busy_ms = _busy_ms(intervals) / steps if cuda else kernel_ms
    categories = dict.fromkeys(CATEGORIES, 0.0)
    for name, ms in total.items():
        categories[kernel_category(name)] += ms / steps
    gap_ms = max(step_ms - busy_ms, 0.0)
    top_rows = [[name[:70], calls[name] / steps, ms / steps, ms / steps / max(kernel_ms, 1e-12)]
                for name, ms in sorted(total.items(), key=lambda kv: -kv[1])[:top]]
    return dict(kernel_ms=kernel_ms, busy_ms=busy_ms, gap_ms=gap_ms, gap_share=gap_ms / max(step_ms, 1e-12),
                launches=sum(calls.values()) / steps, top=top_rows, categories=categories)


def profile_table(label: str, prof: dict) -> str:
    """Markdown of one ``profile_steps`` result: a heading line with the split, a line with the kernel time per
    category and a table of the top kernels."""
    cats = ", ".join(f"{c} {ms:.1f}" for c, ms in prof.get("categories", {}).items() if ms > 0)
    lines = [f"#### {label}: kernels {prof['kernel_ms']:.1f} ms/step (busy {prof['busy_ms']:.1f} ms), GPU idle "
             f"{prof['gap_ms']:.1f} ms ({prof['gap_share']:.0%}), {prof['launches']:.0f} launches/step",
             f"by kind (ms/step): {cats}",
             "| kernel | calls/step | ms/step | share |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {c:.0f} | {ms:.3f} | {sh:.1%} |" for n, c, ms, sh in prof["top"]]
    return "\n".join(lines)


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
    prof = profile_steps(step, steps, step_ms, top)
    text = profile_table(f"{mixer}: step {step_ms:.1f} ms ({batch * seq / step_ms * 1e3 / 1e3:.0f}k tok/s), warm-up "
                         f"{warm:.0f} s", prof)
    del model, compiled, opt
    torch.cuda.empty_cache()
    return text


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
