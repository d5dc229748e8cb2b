"""Registers / spills / shared memory of the Gated DeltaNet chunk kernels (``hybrid_attention.ops.gated_delta.triton``)
for sm_90, compiled ahead of time on a machine without a GPU (the companion of ``benchmarks/aot_regs.py``, whose
target and ``ptxas`` it uses).

    python benchmarks/aot_regs_gdn.py                 # both shapes, unpacked, no commit mask
    python benchmarks/aot_regs_gdn.py --varlen --commit --shapes 340m
    python benchmarks/aot_regs_gdn.py --set seqf_stages=2 seqb_warps=4   # a variant of DEFAULT_CONFIG
    python benchmarks/aot_regs_gdn.py --set buffer_dtype=bf16 seqf_bv=64 seqf_warps=8   # bf16 buffers, wide tile

The launches are not copied here: ``function._launch_fwd`` / ``_launch_bwd`` run on meta tensors with the kernels
swapped for recorders, so every kernel is compiled with exactly the arguments, constexprs (block sizes from
``config.py`` through ``function._Tiles``), dtypes, ``num_warps`` / ``num_stages`` the real launch passes, and with
the JIT's own specialisation (16-byte aligned pointers, ints divisible by 16: ``tt.divisibility`` attributes). Then
the wheel's ``ptxas -v`` on the PTX. Activations as in the GDN layer: q, k, v and do bf16 (so o, dq, dk, dv bf16), g
and beta fp32 (``gdn_decay`` / the fp32 sigmoid), every internal buffer fp32 (w, u, S_n, vn bf16 with
``--set buffer_dtype=bf16``).

Shapes: ``340m`` the GDN layer of ``gdn-340m`` / ``natsl-hybrid-340m`` (B=1, T=16384, 6 heads, K=128, V=256,
chunk 64); ``small`` the ``small`` preset with GDN layers (B=16, T=2048, 8 heads, K=64, V=2K=128, chunk 64). The
grid sizes are those of that call (register use does not depend on T). Columns: registers per thread, spill stores /
loads (bytes), shared memory (bytes, triton's launch value), an estimate of resident CTAs per SM (64 warps, 64K
registers allocated per warp in units of 256, 227 KiB shared memory), ``loop``: SASS instructions in the kernel's
largest loop (``loop_instructions``: the per-chunk step of the two sequential state kernels; a static proxy for their
latency-bound step, for A/B of kernel versions), the matrix instructions in its PTX (``wgmma.mma_async``, Hopper's
warpgroup MMA, and ``mma.sync``; ``aot_regs.mma_counts``), and the grid.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import triton
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.aot_regs import TARGET, mma_counts  # noqa: E402
from benchmarks.common import config_with  # noqa: E402
from hybrid_attention.ops.common.varlen import ChunkTable, max_chunks  # noqa: E402
from hybrid_attention.ops.gated_delta.triton import function as F  # noqa: E402
from hybrid_attention.ops.gated_delta.triton import kernels as _kernels  # noqa: E402
from hybrid_attention.ops.gated_delta.triton.config import DEFAULT_CONFIG, GatedDeltaConfig  # noqa: E402

KERNELS = (
    "_prep_kernel",
    "_state_fwd_kernel",
    "_output_kernel",
    "_bwd_local_kernel",
    "_state_bwd_kernel",
    "_bwd_k_kernel",
    "_bwd_finish_kernel",
)
SHAPES: dict[str, dict[str, int]] = {
    "340m": dict(B=1, T=16384, H=6, K=128, V=256, C=64),
    "small": dict(B=16, T=2048, H=8, K=64, V=128, C=64),
}


@dataclass
class Launch:
    """One recorded kernel launch: the kernel, its grid, positional and keyword arguments (constexprs, options)."""

    name: str
    fn: Any
    grid: tuple[int, ...]
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for a ``@triton.jit`` kernel: ``rec[grid](*args, **kwargs)`` appends a ``Launch`` instead of
    running."""

    def __init__(self, name: str, fn: Any, log: list[Launch]) -> None:
        self.name, self.fn, self.log = name, fn, log

    def __getitem__(self, grid: tuple[int, ...]):
        def launch(*args: Any, **kwargs: Any) -> None:
            self.log.append(Launch(self.name.strip("_").removesuffix("_kernel"), self.fn, tuple(grid), args, kwargs))

        return launch


def record_launches(
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    C: int,
    config: GatedDeltaConfig = DEFAULT_CONFIG,
    *,
    varlen: bool = False,
    commit: bool = False,
) -> list[Launch]:
    """The seven launches of one forward + backward call of ``triton_gated_delta`` on meta tensors (nothing runs).

    Shapes: q, k ``[B, T, H, K]`` bf16, v ``[B, T, H, V]`` bf16, g, beta ``[B, T, H]`` fp32, do like the output;
    ``varlen``: B = 1 packed into ``B`` documents of ``T`` tokens each (a meta chunk table); ``commit``: the per-chunk
    commit mask ``[B, NM, H]`` (fp32 after ``function``'s cast)."""
    meta = torch.device("meta")
    n_docs = B
    if varlen:
        B, T = 1, B * T
    bf16, f32 = torch.bfloat16, torch.float32
    q = torch.empty(B, T, H, K, device=meta, dtype=bf16)
    k = torch.empty_like(q)
    v = torch.empty(B, T, H, V, device=meta, dtype=bf16)
    g = torch.empty(B, T, H, device=meta, dtype=f32)
    beta = torch.empty_like(g)
    vl = None
    if varlen:
        nt = max_chunks(T, n_docs, C)
        i32 = torch.int32
        vl = ChunkTable(
            torch.empty(n_docs + 1, device=meta, dtype=i32),
            torch.empty(n_docs + 1, device=meta, dtype=i32),
            torch.empty(nt, 2, device=meta, dtype=i32),
            C,
        )
    nm = (n_docs * triton.cdiv(T // n_docs, C)) if varlen else triton.cdiv(T, C)
    m = torch.empty(B, nm, H, device=meta, dtype=f32) if commit else None
    log: list[Launch] = []
    saved_k = F._k
    F._k = SimpleNamespace(**{name: _Recorder(name, getattr(_kernels, name), log) for name in KERNELS})
    try:
        scale = K**-0.5
        _, _, saved = F._launch_fwd(q, k, v, g, beta, m, None, scale, True, True, C, False, config, vl)
        do = torch.empty_like(v)
        F._launch_bwd(q, k, v, beta, m, saved, do, None, scale, True, True, C, config, vl)
    finally:
        F._k = saved_k
    return log


def loop_instructions(sass: str) -> int:
    """SASS instructions in the kernel's largest loop (the span from a label to the backward branch that returns to
    it); 0 without a loop. For the sequential state kernels this is the per-chunk step: a static count, a proxy for
    their latency-bound step time (not a measurement), comparable between two versions of the same kernel."""
    addr_of: dict[str, int] = {}
    pending: list[str] = []
    instrs: list[tuple[int, str]] = []
    for line in sass.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line)
        if label:
            pending.append(label.group(1))
            continue
        ins = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+\S", line)
        if ins:
            addr = int(ins.group(1), 16)
            addr_of.update((name, addr) for name in pending)
            pending = []
            instrs.append((addr, line))
    best = 0
    for addr, line in instrs:
        target = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", line)
        if target and addr_of.get(target.group(1), addr) < addr:
            start = addr_of[target.group(1)]
            best = max(best, sum(1 for a, _ in instrs if start <= a <= addr))
    return best


def _ptxas_report(ptx: str, fp_fusion: bool) -> dict[str, int]:
    """{regs, spill_st, spill_ld, loop} from ``ptxas -v`` of one kernel's PTX for sm_90a, with the ptxas and the flags
    triton's own ``make_cubin`` uses for that target (triton 3.9: the CUDA 13 ``ptxas-blackwell`` for sm >= 90, whose
    PTX version the older bundled ``ptxas`` rejects); ``loop``: ``loop_instructions`` of the cubin's SASS
    (``nvdisasm`` next to that ptxas)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        fmad = [] if fp_fusion else ["--fmad=false"]
        cmd = [
            get_ptxas(TARGET.arch).path,
            "-lineinfo",
            *fmad,
            "-v",
            "--regAllocOptLevel=2",
            "--gpu-name=sm_90a",
            path,
            "-o",
            os.path.join(tmp, "k.cubin"),
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        nvdisasm = os.path.join(os.path.dirname(cmd[0]), "nvdisasm")
        sass = subprocess.run([nvdisasm, "-c", os.path.join(tmp, "k.cubin")], capture_output=True, text=True,
                              check=True).stdout
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return {"regs": regs, "spill_st": int(spill.group(1)), "spill_ld": int(spill.group(2)),
            "loop": loop_instructions(sass)}


def compile_kernel(launch: Launch):
    """(compiled kernel, options) of one recorded launch, AOT for sm_90 the way ``JITFunction.run`` would compile it
    (its binder, specialisation and options)."""
    fn = launch.fn
    backend = make_backend(TARGET)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, launch.kwargs, bound, spec, opts)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__), options


def compile_launch(launch: Launch) -> dict[str, int]:
    """AOT-compiles one recorded launch (``compile_kernel``) and returns {regs, spill_st, spill_ld, loop, wgmma,
    mma_sync, smem, warps, stages, ctas_per_sm}."""
    ck, options = compile_kernel(launch)
    r = _ptxas_report(ck.asm["ptx"], options.enable_fp_fusion) | mma_counts(ck.asm["ptx"])
    warps = options.num_warps
    r.update(smem=ck.metadata.shared, warps=warps, stages=options.num_stages)
    per_warp = -(-r["regs"] * 32 // 256) * 256  # register file allocated per warp
    limits = [64 // warps, 65536 // (per_warp * warps), 32]
    if r["smem"]:
        limits.append(232448 // r["smem"])
    r["ctas_per_sm"] = min(limits)
    return r


def report(
    shape: str, config: GatedDeltaConfig = DEFAULT_CONFIG, *, varlen: bool = False, commit: bool = False
) -> Iterator[tuple[Launch, dict[str, int]]]:
    """(launch, compile report) of every kernel of one forward + backward call at a named shape."""
    for launch in record_launches(**SHAPES[shape], config=config, varlen=varlen, commit=commit):
        yield launch, compile_launch(launch)


def _tiles(launch: Launch) -> str:
    kw = launch.kwargs
    return " ".join(f"{k}{kw[k]}" for k in ("BK", "BKF", "BV") if k in kw)


def main(argv: list[str] | None = None) -> None:
    """Print one line per kernel and shape (options: --shapes, --varlen, --commit)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--varlen", action="store_true", help="packed documents (B documents of T tokens, B = 1)")
    p.add_argument("--commit", action="store_true", help="with the per-chunk commit mask (NAtS-L)")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                   help="GatedDeltaConfig fields to replace (ints, or a string: buffer_dtype=bf16)")
    a = p.parse_args(argv)
    config = config_with(DEFAULT_CONFIG, a.set)
    changes = " ".join(a.set)
    print(
        f"sm_90 AOT compile (triton {triton.__version__}), DEFAULT_CONFIG {changes or ''}, varlen={a.varlen}, "
        f"commit={a.commit}"
    )
    for shape in a.shapes:
        print(f"\n{shape}: {SHAPES[shape]}")
        print(
            f"{'kernel':11s} {'tiles':17s} {'w/s':4s} {'regs':>4s} {'spill st/ld B':>14s} {'smem B':>7s} "
            f"{'CTA/SM':>6s} {'loop':>5s} {'wgmma':>5s} {'mma':>4s}  grid"
        )
        for launch, r in report(shape, config, varlen=a.varlen, commit=a.commit):
            spills = f"{r['spill_st']}/{r['spill_ld']}"
            print(
                f"{launch.name:11s} {_tiles(launch):17s} {r['warps']}/{r['stages']:<2d} {r['regs']:4d} {spills:>14s} "
                f"{r['smem']:7d} {r['ctas_per_sm']:6d} {r['loop']:5d} {r['wgmma']:5d} {r['mma_sync']:4d}  {launch.grid}"
            )


if __name__ == "__main__":
    main()
