"""Registers / spills / shared memory of the decode GEMV kernels (``hybrid_attention.ops.decode_linear``) for sm_90,
compiled ahead of time on a machine without a GPU (target and ``ptxas`` of ``benchmarks/aot_regs.py``).

    PYTHONPATH=/tmp/t36:. python benchmarks/aot_regs_decode_linear.py      # the device's triton 3.6 first

Shapes of gdn-340m's decode step (hidden 1024, intermediate 2816, vocab 32000), bf16, B in {1, 8}: the MLP's
residual add + norm + gate|up + SwiGLU (add_norm_linear), its down + residual, and the final norm + lm_head.
The block sizes are the launch's own (``triton/kernel.py`` ``block_sizes``); pointers and the ints divisible by 16
carry the JIT's divisibility-16
specialisation (B stays a generic i32: a conservative stand-in for the JIT's B = 1 specialisation).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.aot_regs import TARGET, _print, _ptxas  # noqa: E402
from hybrid_attention.ops.decode_linear.triton import kernel as DK  # noqa: E402

HIDDEN, INTER, VOCAB = 1024, 2816, 32000


def _report(fn, constexprs: dict, ints: dict[str, int], num_warps: int = 4) -> dict:
    """AOT-compile ``fn`` for sm_90 (bf16 pointers, i32 ``ints`` with divisibility 16 where their value has it)."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in ints:
            sig[name] = "i32"
            if name != "B" and ints[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "*bf16"
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": 3})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ck.asm["ptx"])
        out = subprocess.run([_ptxas(), "-v", "-arch=sm_90a", path, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return {"regs": int(re.search(r"Used (\d+) registers", out).group(1)), "spill_st": int(spill.group(1)),
            "spill_ld": int(spill.group(2)), "smem": ck.metadata.shared}


def main(argv: list[str] | None = None) -> None:
    """One line per kernel, shape and batch size (``--batch-sizes``: default 1 and 8)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8], metavar="B",
                   help="decode batch sizes to compile for (default: 1 8)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    print(f"sm_90 AOT compile (triton {triton.__version__}), gdn-340m decode GEMVs, bf16")
    for b in args.batch_sizes:
        for label, n_out, k, swiglu in (("add+gate|up+swiglu", INTER, HIDDEN, True),
                                        ("lm_head", VOCAB, HIDDEN, False)):
            bb, bn, bk = DK.block_sizes(b, n_out, k, 2 if swiglu else 1, None)
            cx = {"EPS": 1e-6, "SWIGLU": swiglu, "HAS_RES": swiglu, "ACC": tl.float32, "BLOCK_B": bb,
                  "BLOCK_N": bn, "BLOCK_K": bk}
            ints = {"B": b, "K": k, "N_OUT": n_out, "sxb": k, "srb": k, "shb": k, "syb": n_out}
            r = _report(DK._norm_linear_kernel, cx, ints)
            _print(f"norm_linear {label} B{b} BN{bn} BK{bk} grid {triton.cdiv(n_out, bn)}", r)
        bb, bn, bk = DK.block_sizes(b, HIDDEN, INTER, 1, None)
        cx = {"ACC": tl.float32, "BLOCK_B": bb, "BLOCK_N": bn, "BLOCK_K": bk}
        r = _report(DK._linear_residual_kernel, cx,
                    {"B": b, "K": INTER, "N": HIDDEN, "sxb": INTER, "srb": HIDDEN, "syb": HIDDEN})
        _print(f"linear_residual down B{b} BN{bn} BK{bk} grid {triton.cdiv(HIDDEN, bn)}", r)


if __name__ == "__main__":
    main()

# sm_90, triton 3.6.0 (this session, CPU AOT):
# norm_linear add+gate|up+swiglu B1 BN16 BK256 grid 176 regs  63  spill st/ld    0/   0 B  smem 4096 B
# norm_linear lm_head B1 BN128 BK64 grid 250 regs 123  spill st/ld    0/   0 B  smem 4096 B
# linear_residual down B1 BN16 BK256 grid 64 regs  55  spill st/ld    0/   0 B  smem 4096 B
# norm_linear add+gate|up+swiglu B8 BN16 BK32 grid 176 regs  48  spill st/ld    0/   0 B  smem 1024 B
# norm_linear lm_head B8 BN128 BK16 grid 250 regs  96  spill st/ld    0/   0 B  smem 4096 B
# linear_residual down B8 BN16 BK64 grid 64 regs  96  spill st/ld    0/   0 B  smem 2048 B
