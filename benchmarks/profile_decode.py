"""Where a decode step's time goes: the kernels of one compiled static step, and the gap to the graph-replayed step.

    python -m benchmarks.profile_decode [--presets gdn-340m transformer-340m] [--context 1024] [--batch 1]
        [--steps 20] [--top 12] [--compile-mode MODE] [--fused-gemv both|on|off]

Per preset (random weights, bf16 on CUDA): a ``StaticDecoder`` (compiled step) filled to ``--context`` tokens, then
(1) the CUDA-graph-replayed step time (median of ``--steps``, CUDA events: the number ``bench models`` reports) and
(2) ``torch.profiler`` over ``--steps`` steps of the same compiled step launched without the graph: the sum of the
kernels' own device times per step, launches per step and the top kernels. Graph time minus kernel time is what the
replay spends between kernels (launch latency inside the graph, idle SMs); kernel time against the weight-streaming
floor (bytes / ~4.3 TB/s) is what slow kernels cost. ``--dryrun`` runs the ``tiny`` preset on the CPU (CPU op times,
no graph) to test this script.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.decode_latency import _time_steps
from benchmarks.profile_train import kernel_table
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.serving import StaticDecoder

CARD_GB_S = 4300.0


def profile_preset(preset: str, context: int, batch: int, steps: int, top: int, compile_mode: str | None,
                   dryrun: bool, fused_gemv: bool = False) -> str:
    """The printed report (markdown) of one preset (fused_gemv: the StaticDecoder's fused decode GEMVs)."""
    cuda = torch.cuda.is_available() and not dryrun
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset(preset)).eval().to(dev, dtype)
    weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
    mode = {"fused_gemv": fused_gemv, **({} if compile_mode is None else {"compile_mode": compile_mode})}
    dec = StaticDecoder(model, batch, context + 3 * steps + 10, **mode)
    dec.fill_random(context)
    plain = statistics.median(_time_steps(dec, steps, warmup=3))  # compiles the step in the warm-up
    graph = None
    if cuda:
        dec.fill_random(context)
        dec.capture()
        graph = statistics.median(_time_steps(dec, steps, warmup=3))
        dec = StaticDecoder(model, batch, context + 3 * steps + 10, **mode)  # launches without the graph again
        dec.fill_random(context)
        _time_steps(dec, 1, warmup=2)
    tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for _ in range(steps):
            dec.step(tok)
        if cuda:
            torch.cuda.synchronize()
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernel_ms, launches, table = kernel_table(prof, steps, top, kind)
    floor = weights_gb / CARD_GB_S * 1e3
    tag = f"{preset} B={batch} ctx={context}{' fused-gemv' if fused_gemv else ''}"
    head = (f"### {tag}: graph {graph:.3f} ms/token, " if graph is not None else
            f"### {tag} (dry run, CPU op times): ")
    head += (f"compiled without graph {plain:.3f} ms; kernels {kernel_ms:.3f} ms/step over {launches:.0f} launches "
             f"({launches / model.config.num_hidden_layers:.1f} per layer); weights {weights_gb:.2f} GB = "
             f"{floor:.3f} ms at {CARD_GB_S:.0f} GB/s")
    if graph is not None:
        head += f"; graph - kernels = {graph - kernel_ms:.3f} ms between kernels"
    del dec, model
    if cuda:
        torch.cuda.empty_cache()
    return "\n".join([head, *table])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["gdn-340m", "transformer-340m"])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--compile-mode", default=None)
    p.add_argument("--fused-gemv", choices=("off", "on", "both"), default="off",
                   help="the StaticDecoder's fused decode GEMVs: off, on, or both side by side (default: off)")
    p.add_argument("--dryrun", action="store_true", help="the tiny preset on the CPU (tests this script)")
    a = p.parse_args(argv)
    presets = ["tiny"] if a.dryrun else a.presets
    fused = {"off": [False], "on": [True], "both": [False, True]}[a.fused_gemv]
    for preset in presets:
        for fg in fused:
            try:
                print(profile_preset(preset, a.context, a.batch, a.steps, a.top, a.compile_mode, a.dryrun, fg),
                      flush=True)
            except Exception as e:  # one preset's failure must not hide the others'
                print(f"### {preset}: failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)


if __name__ == "__main__":
    main()
