"""Where a whole-model prefill spends its GPU time: the top CUDA kernels of one forward that builds the
decode state, per preset, eager and compiled.

    python -m benchmarks.profile_prefill [--models gdn-340m natsl-hybrid-340m] [--length 131072]
        [--variants eager compiled] [--top 20]
    python -m benchmarks.profile_prefill --dryrun          # CPU smoke test: the dry-run stand-in models, CPU events

Why: at 128K tokens gdn-340m's prefill takes 604 ms (H200) against a target of 400. Its projections and MLPs
(about 89 TFLOP at ~600 TFLOP/s) and its GDN kernels (~5 ms a layer) account for well under half of that. This
table says where the rest goes: the kernels outside the GEMMs and the GDN / attention kernels (norms, short
convolutions, gates, casts), and the gap between the wall time and the summed kernel time (host-side launch gaps
and synchronisations). One warm-up call (the compiled variant compiles there), the wall time as in the prefill rows
(``benchmarks.models._time_ms``), then one profiled call. Columns: as
``benchmarks/profile_train.py`` (calls, ms, share of the summed kernel time), plus a line per variant with the wall
ms (CUDA events), the summed kernel ms and the launch count. Models and weights: ``benchmarks.models.build`` (random
weights, bf16, eval mode), the call of its prefill rows (``use_cache=True, logits_to_keep=1``, B = 1); NAtS-L at the
router's own fraction.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import BenchSettings, sync
from benchmarks.models import _time_ms, build
from benchmarks.profile_train import kernel_table

VARIANTS = ("eager", "compiled")


def profile_prefill(s: BenchSettings, name: str, T: int, variant: str, top: int) -> str:
    """One preset's prefill at length T, profiled; returns the printed lines (markdown)."""
    model = build(s, name)
    fwd = torch.compile(model, dynamic=False) if variant == "compiled" else model
    ids = torch.randint(0, model.config.vocab_size, (1, T), device=s.device)
    cuda = s.device == "cuda"

    def run():
        with torch.no_grad():
            return fwd(ids, use_cache=True, logits_to_keep=1)

    t0 = time.time()
    run()  # warm-up: compilation, Triton JIT, allocator
    sync()
    warm = time.time() - t0
    wall = _time_ms(s, run, reps=1)  # the prefill rows' timing (one more warm-up call, then one timed)
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        run()
        if cuda:
            torch.cuda.synchronize()
    device_type = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernel_ms, launches, table = kernel_table(prof, 1, top, device_type)
    if variant == "compiled":
        torch._dynamo.reset()
    if cuda:
        torch.cuda.empty_cache()
    return "\n".join([f"### {name} {variant} T={T}: wall {wall:.1f} ms, kernels {kernel_ms:.1f} ms, "
                      f"{launches:.0f} launches, warm-up {warm:.0f} s", *table])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gdn-340m", "natsl-hybrid-340m"])
    p.add_argument("--length", type=int, default=131072)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--dryrun", action="store_true", help="CPU, the dry-run stand-in models (a smoke test)")
    a = p.parse_args(argv)
    s = BenchSettings(dryrun=a.dryrun)
    T = 64 if a.dryrun else a.length
    for name in a.models:
        for variant in a.variants:
            try:
                print(profile_prefill(s, name, T, variant, a.top), flush=True)
            except Exception as e:  # one row's failure must not hide the others' profiles
                print(f"### {name} {variant}: failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}",
                      flush=True)


if __name__ == "__main__":
    main()
