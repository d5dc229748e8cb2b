"""Registers / spills / shared memory of the causal short-convolution kernels (``hybrid_attention.ops.causal_conv``) for
sm_90, compiled ahead of time on a machine without a GPU (the launch recorder and compile report of
``benchmarks/aot_regs_gdn.py``).

    PYTHONPATH=/path/to/triton-3.6:. python benchmarks/aot_regs_conv.py   # the device's triton 3.6 first
    python benchmarks/aot_regs_conv.py --varlen --set BT=128 warps_bwd=8   # packed documents, another config
    python benchmarks/aot_regs_conv.py --bwd-forms shifted --set fwd_form=tile BC=64 BC_BWD=32  # the tile forms

The launches are those of one forward + backward call of ``ops.py``'s ``_fwd_impl`` / ``_bwd_impl`` on meta
tensors, the kernels swapped for recorders: the training call (no initial or final state), or with ``--state`` an
initial state, the final state and its gradient; bf16 x, dy and states, float32 weight, SiLU, K = 4. Shapes:
``small`` B=16, T=2048 and ``340m`` B=4, T=4096, at the
layer's channel widths (q / k and v); ``--varlen`` packs the B rows as documents of one row. Each backward form of
``--bwd-forms`` (``CausalConvConfig.bwd_form``; default ``DEFAULT_CONFIG``'s) adds its backward kernel's line
(``conv_bwd``: "reload", ``conv_bwd_shifted``: "shifted", ``conv_bwd_walk``: "walk"); the kernels the forms share are
listed once. The tile forms take their own channel blocks: ``--bwd-forms shifted --set fwd_form=tile BC=64
BC_BWD=32``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from types import SimpleNamespace

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.aot_regs_gdn import Launch, _Recorder, compile_launch  # noqa: E402
from benchmarks.common import config_with  # noqa: E402
from hybrid_attention.ops.causal_conv.triton import kernels as _kernels  # noqa: E402
from hybrid_attention.ops.causal_conv.triton import ops as O  # noqa: E402
from hybrid_attention.ops.causal_conv.triton.config import BWD_FORMS, DEFAULT_CONFIG, CausalConvConfig  # noqa: E402
from hybrid_attention.ops.common.varlen import max_chunks  # noqa: E402

KERNELS = ("_conv_fwd_kernel", "_conv_fwd_walk_kernel", "_conv_final_kernel", "_conv_bwd_kernel",
           "_conv_bwd_shifted_kernel", "_conv_bwd_walk_kernel", "_conv_dinit_kernel")
SHAPES: dict[str, tuple[int, int, tuple[int, ...]]] = {"small": (16, 2048, (512, 1024)), "340m": (4, 4096, (768, 1536))}


def record_launches(B: int, T: int, C: int, config: CausalConvConfig = DEFAULT_CONFIG, *, varlen: bool = False,
                    state: bool = False, K: int = 4) -> list[Launch]:
    """The launches of one forward + backward call on meta tensors (nothing runs); ``state``: with an initial state,
    the final state and its gradient (else the training call: neither)."""
    meta = torch.device("meta")
    n_seq = B
    cu = co = ci = None
    if varlen:
        B, T = 1, B * T
        i32 = torch.int32
        cu = torch.empty(n_seq + 1, device=meta, dtype=i32)
        co = torch.empty(n_seq + 1, device=meta, dtype=i32)
        ci = torch.empty(max_chunks(T, n_seq, config.BT), 2, device=meta, dtype=i32)
    x = torch.empty(B, T, C, device=meta, dtype=torch.bfloat16)
    w = torch.empty(C, K, device=meta, dtype=torch.float32)
    init = torch.empty(n_seq, C, K - 1, device=meta, dtype=torch.bfloat16) if state else None
    dfin = torch.empty(n_seq, C, K - 1, device=meta, dtype=torch.bfloat16) if state else None
    log: list[Launch] = []
    saved = O.K
    O.K = SimpleNamespace(**{name: _Recorder(name, getattr(_kernels, name), log) for name in KERNELS})
    try:
        O._fwd_impl(x, w, init, cu, co, ci, True, state, [C], cfg=config)
        O._bwd_impl(x, w, init, cu, co, ci, [torch.empty_like(x)], dfin, True, cfg=config)
    finally:
        O.K = saved
    return log


def record_forms(B: int, T: int, C: int, config: CausalConvConfig, forms: list[str], **kw) -> list[Launch]:
    """``record_launches`` with each backward form of ``forms`` in turn (``kw``: its keywords); a kernel the forms
    share is listed once, at its first launch."""
    out: dict[str, Launch] = {}
    for form in forms:
        for launch in record_launches(B, T, C, dataclasses.replace(config, bwd_form=form), **kw):
            out.setdefault(launch.name, launch)
    return list(out.values())


def main(argv: list[str] | None = None) -> None:
    """One line per kernel, shape and channel width."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--varlen", action="store_true", help="packed documents (the B rows as documents of one row)")
    p.add_argument("--state", action="store_true", help="with an initial state, the final state and its gradient")
    p.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="CausalConvConfig fields to replace")
    p.add_argument("--bwd-forms", nargs="+", default=[DEFAULT_CONFIG.bwd_form], choices=BWD_FORMS,
                   help="backward forms whose kernel is compiled (bwd_form; default: DEFAULT_CONFIG's)")
    a = p.parse_args(argv)
    config = config_with(DEFAULT_CONFIG, a.set)
    changes = " ".join(a.set)
    print(f"sm_90 AOT compile (triton {triton.__version__}), DEFAULT_CONFIG {changes or ''}, varlen={a.varlen}, "
          f"state={a.state}, backward forms {' '.join(a.bwd_forms)}")
    print(f"{'shape':6s} {'C':>5s} {'kernel':16s} {'tiles':14s} {'w/s':4s} {'regs':>4s} {'spill st/ld B':>14s} "
          f"{'smem B':>7s} {'CTA/SM':>6s}  grid")
    for shape in a.shapes:
        B, T, widths = SHAPES[shape]
        for C in widths:
            for launch in record_forms(B, T, C, config, a.bwd_forms, varlen=a.varlen, state=a.state):
                r = compile_launch(launch)
                kw = launch.kwargs
                tiles = " ".join(f"{k}{kw[k]}" for k in ("BT", "KP", "BC") if k in kw)
                print(f"{shape:6s} {C:5d} {launch.name:16s} {tiles:14s} {r['warps']}/{r['stages']:<2d} {r['regs']:4d} "
                      f"{r['spill_st']:>6d}/{r['spill_ld']:<7d} {r['smem']:7d} {r['ctas_per_sm']:6d}  {launch.grid}")


if __name__ == "__main__":
    main()
