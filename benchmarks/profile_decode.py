"""Where a decode step's time goes: the kernels of one compiled static step, and the gap to the graph-replayed step.

    python -m benchmarks.profile_decode [--presets gdn-340m transformer-340m] [--context 1024] [--batch 1]
        [--steps 20] [--top 12] [--compile-mode MODE] [--fused-gemv both|on|off] [--log-compile [--stack-dump-s S]]

Per preset (random weights, bf16 on CUDA): a ``StaticDecoder`` (compiled step) filled to ``--context`` tokens, then
(1) the CUDA-graph-replayed step time (median of ``--steps``, CUDA events: the number ``bench models`` reports) and
(2) ``torch.profiler`` over ``--steps`` steps of the same compiled step launched without the graph: the sum of the
kernels' own device times per step, launches per step and the top kernels. Graph time minus kernel time is what the
replay spends between kernels (launch latency inside the graph, idle SMs); kernel time against the weight-streaming
floor (bytes / ~4.3 TB/s) is what slow kernels cost. ``--dryrun`` runs the ``tiny`` preset on the CPU (CPU op times,
no graph) to test this script; there the fused variant runs the fused kernels under the Triton interpreter when
``TRITON_INTERPRET=1`` (without it ``--fused-gemv on`` is the plain step on the CPU), ``--compile`` compiles it.

``--log-compile`` (diagnostics; the fused variant did not finish within ~300 s on the H200, no output, while the
plain one compiled in well under a minute): every phase of a variant (model, decoder, first step = Dynamo + inductor
+ Triton JIT + one run, the rest of the warm-up and timed steps, capture, graph steps, the second decoder's first
step, the profiled steps) prints a line when it starts and one with its wall time (synchronized) when it ends, with
the Dynamo / inductor counters (graphs, graph breaks, recompiles, compile seconds) and the Triton JIT compiles
(kernel, count, seconds) it caused; the first timed steps are printed one by one (a step that recompiles a Triton
kernel every launch is slow every time). Recompile and graph-break reasons go to stderr (TORCH_LOGS
"recompiles,graph_breaks"), and every ``--stack-dump-s`` seconds (default 60) the Python stacks of all threads are
dumped to stderr, and once more on SIGTERM (`timeout`'s signal): a run killed by its timeout still shows where it
was. Lines start with ``[log-compile]``.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import signal
import statistics
import sys
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.decode_latency import _time_steps
from benchmarks.profile_train import kernel_table
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.ops.common.triton import interpreting
from hybrid_attention.serving import StaticDecoder

CARD_GB_S = 4300.0
# Dynamo / inductor timers (torch._dynamo.utils.compilation_time_metrics) summed per phase by --log-compile
_COMPILE_TIMERS = ("_compile.compile_inner", "bytecode_tracing", "compile_fx_inner", "async_compile.wait")


class CompileLog:
    """--log-compile: per phase of a variant, its wall time, the Dynamo / inductor counters it moved and the Triton
    JIT compiles it caused (see the module docstring). Disabled, every method does nothing (phase: a no-op context)."""

    def __init__(self, enabled: bool, tag: str) -> None:
        self.enabled, self.tag = enabled, tag
        self.jit: Counter = Counter()  # kernel name -> JIT compiles; "<name> s" -> seconds
        self._restore = None
        if enabled:
            self._patch_triton()

    def _patch_triton(self) -> None:
        """Count and time `JITFunction._do_compile` (a private Triton hook, present in triton 3.3-3.9; skipped when
        absent). Under the interpreter nothing compiles."""
        try:
            from triton.runtime.jit import JITFunction
        except Exception:  # noqa: BLE001 -- no triton: no JIT compiles to count
            return
        orig = getattr(JITFunction, "_do_compile", None)
        if orig is None:
            self.print("triton JITFunction._do_compile not found: Triton JIT compiles are not counted")
            return
        log = self

        def timed(fn, *args, **kwargs):
            t = time.perf_counter()
            try:
                return orig(fn, *args, **kwargs)
            finally:
                name = getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", "?")
                log.jit[name] += 1
                log.jit[f"{name} s"] += time.perf_counter() - t

        JITFunction._do_compile = timed
        self._restore = lambda: setattr(JITFunction, "_do_compile", orig)

    def close(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None

    def print(self, msg: str) -> None:
        if self.enabled:
            print(f"[log-compile] {self.tag}: {msg}", flush=True)

    @staticmethod
    def _snapshot() -> tuple[dict, dict]:
        from torch._dynamo.utils import compilation_time_metrics, counters

        return ({k: dict(v) for k, v in counters.items()},
                {k: sum(compilation_time_metrics.get(k, [])) for k in _COMPILE_TIMERS})

    @contextlib.contextmanager
    def phase(self, name: str, device: str):
        if not self.enabled:
            yield
            return
        (c0, t0), jit0 = self._snapshot(), Counter(self.jit)
        self.print(f"{name}: start")
        start = time.perf_counter()
        try:
            yield
        finally:
            if device == "cuda":
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
            c1, t1 = self._snapshot()
            moved = {}
            for group, vals in c1.items():
                diff = {k: v - c0.get(group, {}).get(k, 0) for k, v in vals.items()
                        if v != c0.get(group, {}).get(k, 0)}
                if diff and group != "aten_mm_info":
                    moved[group] = diff
            timers = {k: round(t1[k] - t0[k], 2) for k in _COMPILE_TIMERS if t1[k] - t0[k] > 0}
            jit = {k: (round(v - jit0[k], 2) if k.endswith(" s") else v - jit0[k]) for k, v in self.jit.items()
                   if v != jit0[k]}
            self.print(f"{name}: {wall:.2f} s wall; dynamo/inductor counters {moved or '{}'}; compile timers (s) "
                       f"{timers or '{}'}; triton JIT compiles {jit or '{}'}")


def profile_preset(preset: str, context: int, batch: int, steps: int, top: int, compile_mode: str | None,
                   dryrun: bool, fused_gemv: bool = False, log_compile: bool = False,
                   compile: bool | None = None) -> str:
    """The printed report (markdown) of one preset (fused_gemv: the StaticDecoder's fused decode GEMVs; log_compile:
    the phase lines of `CompileLog`; compile: the StaticDecoder's compile flag, None: its default)."""
    cuda = torch.cuda.is_available() and not dryrun
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    tag = f"{preset} B={batch} ctx={context}{' fused-gemv' if fused_gemv else ''}"
    log = CompileLog(log_compile, tag)
    try:
        torch.manual_seed(0)
        with log.phase("model", dev):
            model = HybridForCausalLM(HybridConfig.from_preset(preset)).eval().to(dev, dtype)
        weights_gb = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9
        mode = {"fused_gemv": fused_gemv, **({} if compile_mode is None else {"compile_mode": compile_mode})}
        if compile is not None:
            mode["compile"] = compile
        if not cuda and fused_gemv and interpreting():  # the dry run's fused variant: the kernels, interpreted
            mode["use_kernels"] = True
        tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        with log.phase("decoder", dev):
            dec = StaticDecoder(model, batch, context + 3 * steps + 10, **mode)
            dec.fill_random(context)
        log.print(f"fused_mlp={dec.fused_mlp} use_kernels={dec.use_kernels} compile={dec.compile}")
        with log.phase("first step (compile + Triton JIT + run)", dev):
            dec.step(tok)
        with log.phase("warm-up and timed steps", dev):
            times = _time_steps(dec, steps, warmup=2)  # 3 warm-up steps with the first
        log.print(f"first timed steps (ms): {[round(t, 2) for t in times[:5]]}")
        plain = statistics.median(times)
        graph = None
        if cuda:
            dec.fill_random(context)
            with log.phase("capture", dev):
                dec.capture()
            with log.phase("graph steps", dev):
                graph = statistics.median(_time_steps(dec, steps, warmup=3))
            with log.phase("second decoder: build and first steps (its own compile)", dev):
                dec = StaticDecoder(model, batch, context + 3 * steps + 10, **mode)  # launches without the graph
                dec.fill_random(context)
                _time_steps(dec, 1, warmup=2)
        acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
        with log.phase("profiled steps", dev), profile(activities=acts) as prof:
            for _ in range(steps):
                dec.step(tok)
            if cuda:
                torch.cuda.synchronize()
    finally:
        log.close()
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernel_ms, launches, table = kernel_table(prof, steps, top, kind)
    floor = weights_gb / CARD_GB_S * 1e3
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
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                   help="the StaticDecoder's compile flag (auto: its default, compiled on CUDA)")
    p.add_argument("--log-compile", action="store_true",
                   help="per-phase wall times, Dynamo / inductor counters and Triton JIT compiles of each variant, "
                        "recompile / graph-break reasons, periodic stack dumps (module docstring)")
    p.add_argument("--stack-dump-s", type=float, default=60.0,
                   help="with --log-compile: dump every thread's Python stack to stderr this often (0: never)")
    a = p.parse_args(argv)
    if a.log_compile:  # faulthandler writes to the process's fd 2 (sys.stderr may be a capture without one)
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
        if a.stack_dump_s > 0:
            faulthandler.dump_traceback_later(a.stack_dump_s, repeat=True, file=sys.__stderr__)
        if hasattr(signal, "SIGTERM"):  # `timeout`'s signal: the stacks at the moment of the kill, then the exit
            faulthandler.register(signal.SIGTERM, file=sys.__stderr__, all_threads=True, chain=True)
    compile_flag = {"auto": None, "on": True, "off": False}[a.compile]
    presets = ["tiny"] if a.dryrun else a.presets
    fused = {"off": [False], "on": [True], "both": [False, True]}[a.fused_gemv]
    for preset in presets:
        for fg in fused:
            try:
                print(profile_preset(preset, a.context, a.batch, a.steps, a.top, a.compile_mode, a.dryrun, fg,
                                     a.log_compile, compile_flag), flush=True)
            except Exception as e:  # one preset's failure must not hide the others'
                print(f"### {preset}: failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}", flush=True)
    if a.log_compile:  # undo the process-wide settings (main also runs inside the tests' process)
        faulthandler.cancel_dump_traceback_later()
        if hasattr(signal, "SIGTERM"):
            faulthandler.unregister(signal.SIGTERM)
        torch._logging.set_logs()


if __name__ == "__main__":
    main()
