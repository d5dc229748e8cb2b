"""Registers / spills / shared memory of the chunk-attention Triton kernels (the NAtS-L softmax branch,
``hybrid_attention.ops.chunk_attention.triton``) for sm_90, compiled ahead of time on a machine without a GPU (the
companion of ``benchmarks/aot_regs.py`` and ``benchmarks/aot_regs_gdn.py``, whose target, launch recorder and
compile-and-``ptxas`` step it reuses).

    PYTHONPATH=/tmp/t36:. python benchmarks/aot_regs_attention.py              # the device's triton 3.6
    python benchmarks/aot_regs_attention.py --dv 128 --varlen
    python benchmarks/aot_regs_attention.py --set onepass_qb=32 --sweep-warps 4 8 --sweep-stages 1 2 3

The launches are not copied here: ``function._launch_fwd`` / ``_launch_bwd`` run on meta tensors with the kernels
swapped for recorders, once per backward mode, so every kernel is compiled with exactly the arguments, constexprs,
dtypes, ``num_warps`` / ``num_stages`` the real launch passes and the JIT's own specialisation. Shape: the NAtS-L
softmax branch of ``benchmarks/natsl_ops.py`` (B = 1, T = 65536, 12 heads, Dk = 64, chunk 64, 30% routed, with
the routing bias; bf16 q, k, v, do; ``--dv``: 64 as the target shape, 128 as natsl_ops' ``V // G``). Register
use does not depend on T or the routed fraction (they only set the grid and the loop trip counts). Then the
one-pass kernel again for every (num_warps, num_stages) of the sweep. Columns as ``aot_regs_gdn.py``: registers per
thread, spill stores / loads (bytes), shared memory (bytes, triton's launch value), an estimate of resident CTAs per
SM, the grid, and the PTX's fp32 atomic / reduction instructions (kind and vector width) and MMA instructions
(``wgmma``: sm_90 warpgroup MMA; ``mma``: the mma.sync fallback), counted statically.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Iterator
from unittest import mock

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.aot_regs_gdn import Launch, _Recorder, compile_kernel, compile_launch  # noqa: E402
from hybrid_attention.ops.chunk_attention.triton import function as F  # noqa: E402
from hybrid_attention.ops.chunk_attention.triton import kernels as _kernels  # noqa: E402
from hybrid_attention.ops.chunk_attention.triton.config import DEFAULT_CONFIG, ChunkAttentionConfig  # noqa: E402
from hybrid_attention.ops.common.varlen import ChunkTable, max_chunks  # noqa: E402

KERNELS = ("_fwd_kernel", "_dq_kernel", "_dkv_kernel", "_bwd_kernel")
SHAPE = dict(B=1, T=65536, Hs=12, G=2, DK=64, C=64)  # natsl_ops: H = 6 decision heads, G = 2, K // G = 64


def record_launches(
    B: int, T: int, Hs: int, G: int, DK: int, DV: int, C: int, config: ChunkAttentionConfig = DEFAULT_CONFIG,
    *, varlen: bool = False,
) -> list[Launch]:
    """The launches of one forward + backward of ``triton_chunk_attention`` on meta tensors (nothing runs), in
    ``config.bwd_mode``: fwd, then dq and dk/dv (two_pass) or the one-pass kernel.

    Shapes: q, k ``[B, T, Hs, DK]`` bf16, v, do ``[B, T, Hs, DV]`` bf16, routing and routing bias ``[B, N, Hs // G]``
    (bias fp32, as function.py casts it); ``varlen``: B = 1 packed into ``B`` documents of ``T`` tokens each."""
    meta = torch.device("meta")
    n_docs = B
    if varlen:
        B, T = 1, B * T
    bf16 = torch.bfloat16
    q = torch.empty(B, T, Hs, DK, device=meta, dtype=bf16)
    k = torch.empty_like(q)
    v = torch.empty(B, T, Hs, DV, device=meta, dtype=bf16)
    N = n_docs * triton.cdiv(T // n_docs, C) if varlen else triton.cdiv(T, C)
    vl = None
    if varlen:
        i32 = torch.int32
        offs = [torch.empty(n_docs + 1, device=meta, dtype=i32) for _ in range(2)]
        vl = ChunkTable(*offs, torch.empty(max_chunks(T, n_docs, C), 2, device=meta, dtype=i32), C)
    routing = torch.empty(B, N, Hs // G, device=meta, dtype=torch.bool)
    bias = torch.empty(B, Hs // G, N, device=meta, dtype=torch.float32)  # function.py's transposed fp32 copy
    log: list[Launch] = []
    recorders = {name: _Recorder(name, getattr(_kernels, name), log) for name in KERNELS}
    # interpreting() False: the GPU's constexprs (for loops, no fp32 upcast) even when TRITON_INTERPRET is set
    with mock.patch.multiple(F, interpreting=lambda: False, **recorders):
        r, idx, cnt = F._routing_lists(routing)
        scale = DK**-0.5
        _, o32, lse = F._launch_fwd(q, k, v, r, idx, cnt, bias, scale, C, G, config, store_o32=True, vl=vl)
        F._launch_bwd(q, k, v, o32, lse, torch.empty_like(v), r, idx, cnt, bias, scale, C, G, config, vl)
    return log


def report(config: ChunkAttentionConfig, shape: dict[str, int], varlen: bool, warps: list[int], stages: list[int]
           ) -> Iterator[tuple[str, Launch, dict]]:
    """(label, launch, compile report) of the two-pass and one-pass launches of ``config`` at ``shape`` (the
    arguments of ``record_launches``), then of the one-pass kernel at every (num_warps, num_stages) of the sweep."""
    seen = set()
    for mode in ("two_pass", "one_pass"):
        for launch in record_launches(**shape, config=dataclasses.replace(config, bwd_mode=mode), varlen=varlen):
            if launch.name == "fwd" and mode == "one_pass":
                continue  # the same forward launch
            key = (launch.name, launch.kwargs["num_warps"], launch.kwargs["num_stages"])
            seen.add(key)
            yield mode if launch.name in ("dq", "dkv", "bwd") else "", launch, compile_launch(launch)
    for w in warps:
        for s in stages:
            cfg = dataclasses.replace(config, bwd_mode="one_pass", onepass_warps=w, onepass_stages=s)
            launch = next(x for x in record_launches(**shape, config=cfg, varlen=varlen) if x.name == "bwd")
            if ("bwd", w, s) not in seen:
                yield "sweep", launch, compile_launch(launch)


def ptx_ops(launch: Launch) -> str:
    """The fp32 atomic / reduction and the matmul instructions of a launch's sm_90 PTX, counted by kind (e.g.
    ``atom.global.gpu.relaxed.add.v4.f32 x16 wgmma x48``: warpgroup MMAs, ``mma`` the mma.sync fallback)."""
    ptx = compile_kernel(launch)[0].asm["ptx"]
    kinds: dict[str, int] = {}
    for m in re.finditer(r"\b((?:red|atom)\.[\w.]*f32|wgmma\.mma_async|mma\.sync)\b", ptx):
        kind = m.group(1).split(".")[0] if "mma" in m.group(1) else m.group(1)
        kinds[kind] = kinds.get(kind, 0) + 1
    return " ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "-"


def main(argv: list[str] | None = None) -> None:
    """Print one line per kernel launch (options: --dv, --varlen, --set, --sweep-warps, --sweep-stages)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dv", type=int, nargs="+", default=[64, 128], help="value head dims to report")
    p.add_argument("--varlen", action="store_true", help="packed documents (VARLEN kernels; 16 documents of 4K)")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=INT", help="ChunkAttentionConfig fields to replace")
    p.add_argument("--sweep-warps", type=int, nargs="*", default=[4, 8])
    p.add_argument("--sweep-stages", type=int, nargs="*", default=[1, 2, 3])
    p.add_argument("--no-ptx", action="store_true", help="skip the PTX column (atomics, MMA instructions)")
    a = p.parse_args(argv)
    changes = {key: int(val) for key, val in (item.split("=", 1) for item in a.set)}
    config = dataclasses.replace(DEFAULT_CONFIG, **changes)
    print(f"sm_90 AOT compile (triton {triton.__version__}), DEFAULT_CONFIG {changes or ''}, varlen={a.varlen}")
    for dv in a.dv:
        shape = dict(SHAPE, DV=dv)
        if a.varlen:
            shape.update(B=16, T=SHAPE["T"] // 16)
        print(f"\n{shape}")
        print(f"{'kernel':5s} {'mode':8s} {'QB/QC':5s} {'w/s':4s} {'regs':>4s} {'spill st/ld B':>14s} {'smem B':>7s} "
              f"{'CTA/SM':>6s}  {'grid':14s} PTX atomics / MMAs")
        for label, launch, r in report(config, shape, a.varlen, a.sweep_warps, a.sweep_stages):
            kw = launch.kwargs
            tile = f"{'QB' if 'QB' in kw else 'QC'}{kw.get('QB', kw.get('QC'))}"
            spills = f"{r['spill_st']}/{r['spill_ld']}"
            ops = "" if a.no_ptx else ptx_ops(launch)
            print(f"{launch.name:5s} {label:8s} {tile:5s} {r['warps']}/{r['stages']:<2d} {r['regs']:4d} {spills:>14s} "
                  f"{r['smem']:7d} {r['ctas_per_sm']:6d}  {str(launch.grid):14s} {ops}")


if __name__ == "__main__":
    main()
