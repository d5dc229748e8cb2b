"""What inductor makes of a compiled training step, counted on the CPU: a proxy for the GPU's kernel launches.

    python -m benchmarks.compile_graph_stats [--mixers s4d interdomain] [--batch 1] [--seq 64] [--no-amp] [--tiny]

For each mixer it builds the 2-layer ``small`` preset of that mixer (``HybridConfig.from_preset("small",
layers=[m, m])``, as ``benchmarks/gpu_compile_check.py`` does), compiles it with ``torch.compile`` (inductor, on
the CPU), runs one forward (LM loss, bf16 autocast unless ``--no-amp``) and its backward, and prints per mixer:

* ``graphs``: the FX graphs inductor compiled (forward and backward of each Dynamo frame; more than 2 = a graph
  break);
* ``cplx fwd`` / ``cplx bwd``: nodes of the post-AOT (ATen) forward / backward graphs whose ``meta["val"]`` holds a
  complex tensor (placeholders included). Inductor cannot generate code for complex dtypes ("Torchinductor does not
  support code generation for complex operators"): each such node is an unfused eager ATen kernel on the GPU;
* ``kernels``: ``torch._inductor.metrics.generated_kernel_count`` (kernels inductor generated; reset first; the
  CPU backend counts more than it calls);
* ``fused`` / ``extern`` / ``fallback`` / ``custom``: calls in the ``call`` function of the generated wrappers, of
  generated kernels (``cpp_fused_*``), library kernels (``extern_kernels.*``: mm, bmm, ...), ATen / prims fallbacks
  (``torch.ops.aten.*``, ``torch.ops.prims.*``: every complex op among them) and registered custom ops
  (``torch.ops.<other>.*``: the Triton ops);
* ``calls``: fused + extern + fallback + custom, the launch proxy.

The backend each mixer runs is the one "auto" picks on the GPU at training lengths (``GPU_BACKENDS``): the Toeplitz
S4D form (T <= 4096) and the Triton Interdomain op, run here through the Triton interpreter (``TRITON_INTERPRET=1``
is set before the kernels are imported when no GPU is present). Counts do not depend on T (static shapes), so short
sequences keep the interpreter fast (``--tiny``: toy widths too, same counts). The caches of inductor are disabled
so that every graph is compiled and counted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

if not torch.cuda.is_available():  # the Triton Interdomain op runs through the interpreter on a CPU machine
    os.environ.setdefault("TRITON_INTERPRET", "1")

__all__ = ["GraphStats", "complex_nodes", "wrapper_calls", "measure", "main", "GPU_BACKENDS", "TINY"]

# DECISION: the backend of each mixer is the one "auto" picks on CUDA for the benchmark's B x T = 16 x 2048
# (ops/s4d/__init__.py AUTO_TOEPLITZ_MAX_T, ops/interdomain/__init__.py), not the CPU's, so that the counted graph is
# the GPU's graph.
GPU_BACKENDS = {"s4d": "toeplitz", "interdomain": "triton"}
# toy widths (as benchmarks/gpu_compile_check.py's --cpu-smoke): the node counts do not depend on the widths
TINY = dict(hidden_size=64, num_heads=2, head_dim=32, state_size=16, chunk_size=16)


@dataclass
class GraphStats:
    """Counts over every graph inductor compiled for one model (see the module docstring for the columns)."""

    graphs: int = 0
    complex_fwd: int = 0
    complex_bwd: int = 0
    kernels: int = 0
    fused: int = 0
    extern: int = 0
    fallback: int = 0
    custom: int = 0
    complex_ops: dict[str, int] = field(default_factory=dict)  # ATen op name -> complex nodes, fwd + bwd

    @property
    def calls(self) -> int:
        return self.fused + self.extern + self.fallback + self.custom


def _is_complex(val) -> bool:
    """Whether a node's ``meta["val"]`` (a tensor, or a tuple / list of them) holds a complex tensor."""
    if isinstance(val, torch.Tensor):
        return val.is_complex()
    if isinstance(val, (tuple, list)):
        return any(_is_complex(v) for v in val)
    return False


def complex_nodes(gm: torch.fx.GraphModule) -> dict[str, int]:
    """Complex-valued nodes of an FX graph by target name (``placeholder`` for complex graph inputs)."""
    out: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "output" or not _is_complex(node.meta.get("val")):
            continue
        name = node.op if node.op == "placeholder" else str(node.target)
        out[name] = out.get(name, 0) + 1
    return out


# a call statement of the wrapper's ``call``: a generated kernel (cpp_fused_* on the CPU, triton_* on the GPU), a
# library kernel (extern_kernels.*) or an op run eagerly (torch.ops.<namespace>.*)
_CALL = re.compile(r"^\s*(?:[\w, ]+=\s*)?(cpp_fused\w*|triton_\w+(?:\.run)?|extern_kernels\.\w+|"
                   r"torch\.ops\.(\w+)\.[\w.]+)\(")
FALLBACK_NAMESPACES = ("aten", "prims")  # ATen / prims ops inductor did not lower (every complex op among them)


def wrapper_calls(source: str) -> tuple[int, int, int, int]:
    """(generated, extern, fallback, custom op) calls in the ``call`` function of an inductor wrapper's source."""
    counts = [0, 0, 0, 0]
    body = source.split("def call(", 1)[-1]
    for line in body.splitlines():
        m = _CALL.match(line)
        if m is None:
            continue
        if m.group(2) is None:
            counts[1 if m.group(1).startswith("extern_kernels") else 0] += 1
        else:
            counts[2 if m.group(2) in FALLBACK_NAMESPACES else 3] += 1
    return counts[0], counts[1], counts[2], counts[3]


def _counting_backend(stats: GraphStats):
    """A Dynamo backend: inductor, with an inner compile that counts each forward / backward ATen graph first."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(gm: torch.fx.GraphModule, example_inputs, **kwargs):
        found = complex_nodes(gm)
        n = sum(found.values())
        if kwargs.get("is_backward", False):
            stats.complex_bwd += n
        else:
            stats.complex_fwd += n
        for name, c in found.items():
            stats.complex_ops[name] = stats.complex_ops.get(name, 0) + c
        stats.graphs += 1
        compiled = compile_fx_inner(gm, example_inputs, **kwargs)
        g, e, f, c = wrapper_calls(getattr(compiled, "source_code", "") or "")
        stats.fused += g
        stats.extern, stats.fallback, stats.custom = stats.extern + e, stats.fallback + f, stats.custom + c
        return compiled

    def backend(gm: torch.fx.GraphModule, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=inner)

    return backend


def build_model(mixer: str, backend: str | None = None, **overrides) -> torch.nn.Module:
    """The 2-layer ``small`` preset of one mixer (float32 weights, train mode), its layers on ``backend``;
    ``overrides``: further ``HybridConfig`` fields (``TINY`` widths for the tests)."""
    from hybrid_attention.models import HybridConfig, HybridForCausalLM

    opts = {} if backend is None else {mixer: {"backend": backend}}
    cfg = HybridConfig.from_preset("small", layers=[mixer, mixer], mixer_options=opts, **overrides)
    torch.manual_seed(0)
    return HybridForCausalLM(cfg).float().train()


def measure(mixer: str, *, batch: int = 1, seq: int = 64, amp: bool = True, backend: str | None = None,
            device: str | torch.device = "cpu", **overrides) -> GraphStats:
    """Compile one model of ``mixer`` with the counting inductor backend, run forward + backward once, count.
    ``backend``: the mixer's op backend (default ``GPU_BACKENDS``); ``device``: where the model and the batch live
    (a Triton backend needs CUDA, or the CPU under ``TRITON_INTERPRET=1``); ``overrides``: ``HybridConfig``
    fields."""
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics

    backend = GPU_BACKENDS.get(mixer) if backend is None else backend
    device = torch.device(device)
    model = build_model(mixer, backend, **overrides).to(device)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)
    stats = GraphStats()
    torch._dynamo.reset()
    metrics.reset()
    with inductor_config.patch(fx_graph_cache=False, force_disable_caches=True):
        fn = torch.compile(model, backend=_counting_backend(stats))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = fn(ids, labels=ids).loss
        loss.backward()
    stats.kernels = metrics.generated_kernel_count
    return stats


def format_table(rows: dict[str, GraphStats]) -> str:
    """A markdown table of the stats by mixer."""
    head = "| mixer | graphs | cplx fwd | cplx bwd | kernels | fused | extern | fallback | custom | calls |"
    lines = [head, "|" + "---|" * 10]
    for name, s in rows.items():
        cells = (name, s.graphs, s.complex_fwd, s.complex_bwd, s.kernels, s.fused, s.extern, s.fallback, s.custom,
                 s.calls)
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mixers", nargs="+", default=["s4d", "interdomain"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--no-amp", action="store_true", help="float32 instead of bf16 autocast")
    p.add_argument("--ops", action="store_true", help="also list the complex nodes by ATen op")
    p.add_argument("--tiny", action="store_true", help="toy widths (TINY) instead of the small preset's")
    args = p.parse_args(argv)
    over = TINY if args.tiny else {}
    rows = {m: measure(m, batch=args.batch, seq=args.seq, amp=not args.no_amp, **over) for m in args.mixers}
    print(format_table(rows))
    if args.ops:
        for name, s in rows.items():
            ops = ", ".join(f"{k} {v}" for k, v in sorted(s.complex_ops.items(), key=lambda kv: -kv[1]))
            print(f"{name}: {ops or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
