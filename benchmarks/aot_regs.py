"""Registers / spills / shared memory of the state-scan Triton kernels shared by Interdomain and the bilinear S4D op
(``hybrid_attention.ops.common.triton.ssm_scan_kernels``) for sm_90, compiled ahead of time on a machine without a
GPU: ``triton.compile`` for GPUTarget("cuda", 90, 64), then the wheel's ``ptxas -v`` on the PTX.

    python benchmarks/aot_regs.py            # the benchmark shape: R = D = M = 64, L = 32, bf16 activations

Prints one line per kernel variant: registers per thread, spill stores / loads (bytes), static shared memory (bytes
reported by triton for the launch). A kernel with > 0 spill bytes or 255 registers is the first suspect of a slow stage.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hybrid_attention.ops.common.triton import ssm_scan_kernels as K  # noqa: E402

TARGET = GPUTarget("cuda", 90, 64)
INT_ARGS = {"T", "H", "M", "R", "D", "NT"}
BF16_ARGS = {"q", "k", "v", "do"}  # activations in the benchmark; every buffer the host allocates is float32


def _ptxas() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_report(fn, constexprs: dict, num_warps: int, num_stages: int) -> dict:
    """AOT-compiles ``fn`` (a @triton.jit kernel) for sm_90 and returns {regs, spill_st, spill_ld, smem}."""
    jit = fn
    sig = {}
    for name in jit.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in INT_ARGS:
            sig[name] = "i32"
        else:
            sig[name] = "*bf16" if name in BF16_ARGS else "*fp32"
    src = triton.compiler.ASTSource(fn=jit, signature=sig, constexprs=constexprs)
    ck = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ck.asm["ptx"])
        out = subprocess.run(
            [_ptxas(), "-v", "-arch=sm_90a", path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stderr
    regs = int(re.search(r"Used (\d+) registers", out).group(1))
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return {"regs": regs, "spill_st": int(spill.group(1)), "spill_ld": int(spill.group(2)), "smem": ck.metadata.shared}


def variants(BT: int = 32, M: int = 64, NC: int = 128):
    """(label, kernel, constexprs, warps, stages) of the backward state kernels at the benchmark configuration."""
    common_scan = {"HAS_DFINAL": False, "STORE_DINIT": False, "USE_WHILE": False, "BT": BT}
    yield "state_bwd BMS32 BCH32 w4", K._state_bwd, {**common_scan, "BMS": 32, "BCH": 32}, 4, 2
    yield "chunk_dz BCH64 w8", K._chunk_dz, {"BT": BT, "BM": M, "BCH": 64, "DOT_PREC": "tf32"}, 8, 1
    for bch, warps in ((16, 4), (16, 8), (32, 4), (32, 8)):
        cfg = {**common_scan, "BM": M, "BCH": bch, "DOT_PREC": "tf32"}
        yield f"state_bwd_dz BM{M} BCH{bch} w{warps}", K._state_bwd_dz, cfg, warps, 2
    yield (
        "state_fwd BMS32 BCH32 w4",
        K._state_fwd,
        {
            "HAS_INIT": False,
            "STORE_STATES": True,
            "STORE_FINAL": False,
            "USE_WHILE": False,
            "BT": BT,
            "BMS": 32,
            "BCH": 32,
            "DOT_PREC": "tf32",
        },
        4,
        2,
    )


def main(argv: list[str] | None = None) -> None:
    """Print the registers, spills and shared memory of every kernel variant (no options)."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(f"sm_90 AOT compile (triton {triton.__version__}), BT=32, M=64, R=D=64")
    for label, fn, cfg, warps, stages in variants():
        r = compile_report(fn, cfg, warps, stages)
        spills = f"{r['spill_st']:4d}/{r['spill_ld']:4d} B"
        print(f"{label:34s} regs {r['regs']:3d}  spill st/ld {spills}  smem {r['smem']} B")


if __name__ == "__main__":
    main()
