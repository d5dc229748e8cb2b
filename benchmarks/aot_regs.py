"""Registers / spills / shared memory of the state-scan Triton kernels shared by Interdomain and the bilinear S4D op
(``hybrid_attention.ops.common.triton.ssm_scan_kernels``), of the Interdomain chunk kernels
(``hybrid_attention.ops.interdomain.triton.kernels``) and of the bilinear S4D readout kernels
(``hybrid_attention.ops.s4d_bilinear.triton.kernels``) for sm_90, compiled ahead of time on a machine without a
GPU: ``triton.compile`` for GPUTarget("cuda", 90, 64), then ``ptxas -v`` (the one triton
uses for that target) on the PTX.

    python benchmarks/aot_regs.py            # the benchmark shape: R = D = M = 64, L = 32, bf16 activations
    python benchmarks/aot_regs.py --chunk-only --set warps_chunk_fwd=8 --set bwd_split=1   # another config
    python benchmarks/aot_regs.py --chunk-only --set chunk_dots=bf16 --set state_dtype=bf16   # bf16 operands, states
    python benchmarks/aot_regs.py --bilinear-only     # only the bilinear S4D readout kernels (S4DBilinearConfig)

The bilinear S4D readout kernels compile as ``s4d_bilinear/triton/ops.py`` launches them under its
``DEFAULT_CONFIG`` (BT = kernel_chunk(64), JT, warps_fwd / warps_bwd; bf16 a, b, do and o), the backward once per
launch part (PART 0 fused and PARTs 1 / 2 of the split form, whichever ``bwd_split`` the default has).

The chunk kernels compile with the constexprs and warps of the launch in ``interdomain/triton/ops.py`` under
``DEFAULT_CONFIG`` (GPU: DOT_PREC = dot_prec, LP_DOT for the bf16 q/k), once per readout variant (CONJ_P False:
"transpose", True: "hermitian"; REAL_C: "real" in one pass, r = Cᵀ Re(C p)); the forward's output ``o`` is
bf16 (the activation dtype; the two-pass "real" and the denominator write float32, which does not change the
kernel's tiles).

The report is for the triton that runs it. To match the device's compiler (triton 3.6 on the H200; this machine's
venv may hold another), put that wheel first on the path (it is one `pip install --no-deps --target` away):

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36:. python benchmarks/aot_regs.py --chunk-only     # benchmarks/aot_regs_gdn.py likewise

Prints one line per kernel variant: registers per thread, spill stores / loads (bytes), static shared memory (bytes
reported by triton for the launch) and the matrix instructions in its PTX (``wgmma.mma_async``: Hopper's warpgroup
MMA; ``mma.sync``: the per-warp MMA of earlier architectures). A kernel with > 0 spill bytes or 255 registers is
the first suspect of a slow stage.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks.common import config_with  # noqa: E402
from hybrid_attention.ops.common.triton import ssm_scan_kernels as K  # noqa: E402
from hybrid_attention.ops.interdomain.triton import kernels as IK  # noqa: E402
from hybrid_attention.ops.interdomain.triton.config import DEFAULT_CONFIG, InterdomainConfig  # noqa: E402
from hybrid_attention.ops.interdomain.triton.ops import kernel_chunk  # noqa: E402

TARGET = GPUTarget("cuda", 90, 64)
INT_ARGS = {"T", "H", "M", "R", "D", "NT"}
BF16_ARGS = {"q", "k", "v", "do"}  # activations in the benchmark; the host's buffers are float32 unless a kernel's
# variant names them (bf16 states, gradients in the activations' dtype, bf16 backward buffers)
INT_PTR_ARGS = {"cu", "ci"}  # varlen chunk tables (never read by a dense launch)
# The JIT launch specialises every 16-byte-aligned pointer (torch allocations are) and every int divisible by 16 as
# tt.divisibility 16, which decides the load/store vector widths (and so the registers); the model dims M, R, D (64
# here) always are, T / H / NT depend on the call and stay generic.
DIV16_INTS = {"M", "R", "D"}


def _ptxas() -> str:
    """The ptxas triton itself runs for sm_90 (from 3.9 on the wheel's newer ``ptxas-blackwell``: the PTX it emits
    has a version the legacy ``ptxas`` refuses)."""
    return get_ptxas(TARGET.arch).path


def compile_report(fn, constexprs: dict, num_warps: int, num_stages: int, bf16_args: set[str] = BF16_ARGS) -> dict:
    """AOT-compiles ``fn`` (a @triton.jit kernel) for sm_90 and returns {regs, spill_st, spill_ld, smem}; pointer
    arguments named in ``bf16_args`` are bf16, ``cu`` / ``ci`` int32, the others float32; pointers and the
    ``DIV16_INTS`` carry the launch's divisibility-16 specialisation."""
    jit = fn
    sig = {}
    attrs = {}
    for i, name in enumerate(jit.arg_names):
        if name in constexprs:
            sig[name] = "constexpr"
            continue
        if name in INT_ARGS:
            sig[name] = "i32"
        elif name in INT_PTR_ARGS:
            sig[name] = "*i32"
        else:
            sig[name] = "*bf16" if name in bf16_args else "*fp32"
        if name not in INT_ARGS or name in DIV16_INTS:
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(fn=jit, signature=sig, constexprs=constexprs, attrs=attrs)
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
    return {"regs": regs, "spill_st": int(spill.group(1)), "spill_ld": int(spill.group(2)), "smem": ck.metadata.shared,
            **mma_counts(ck.asm["ptx"])}


def mma_counts(ptx: str) -> dict[str, int]:
    """{wgmma, mma_sync}: the matrix instructions in a kernel's PTX (Hopper's warpgroup ``wgmma.mma_async`` and the
    per-warp ``mma.sync`` of earlier architectures)."""
    return {"wgmma": len(re.findall(r"\bwgmma\.mma_async\b", ptx)), "mma_sync": len(re.findall(r"\bmma\.sync\b", ptx))}


def variants(cfg: InterdomainConfig = DEFAULT_CONFIG, BT: int = 32, M: int = 64, NC: int = 128):
    """(label, kernel, constexprs, warps, stages, bf16 args) of the backward state kernels at the benchmark
    configuration (the fused scan as the Interdomain op launches it with ``cfg``: bf16 outputs dko / dvo, its chunk
    states and local adjoints in the config's storage)."""
    common_scan = {"HAS_DFINAL": False, "STORE_DINIT": False, "USE_WHILE": False, "BT": BT}
    yield "state_bwd BMS32 BCH32 w4", K._state_bwd, {**common_scan, "BMS": 32, "BCH": 32}, 4, 2, BF16_ARGS
    cx = {"BT": BT, "BM": M, "BCH": 64, "DOT_PREC": "tf32"}
    yield "chunk_dz BCH64 w8", K._chunk_dz, cx, 8, 1, BF16_ARGS
    fused = BF16_ARGS | {"dko", "dvo"} | state_args(cfg) | grad_buffer_args(cfg, "dx")
    for bch, warps in ((16, 4), (16, 8), (32, 4), (32, 8)):
        cx = {**common_scan, "BM": M, "BCH": bch, "DOT_PREC": "tf32"}
        yield f"state_bwd_dz BM{M} BCH{bch} w{warps}", K._state_bwd_dz, cx, warps, 2, fused


def state_args(cfg: InterdomainConfig) -> set[str]:
    """{"states"} when the config stores the chunk states in bf16 for the benchmark's bf16 activations
    (``ScanConfig.state_dtype``), else empty."""
    return {"states"} if cfg.state_torch_dtype(torch.bfloat16) == torch.bfloat16 else set()


def grad_buffer_args(cfg: InterdomainConfig, *names: str) -> set[str]:
    """``names`` when the config keeps the backward's per-chunk buffers (local adjoints, dC partials) in bf16 for
    the benchmark's bf16 activations (``InterdomainConfig.buffer_dtype``), else empty."""
    return set(names) if cfg.buffers(torch.bfloat16) == torch.bfloat16 else set()


def scan_fwd_variants(cfg: InterdomainConfig = DEFAULT_CONFIG, chunk_size: int = 64, M: int = 64, NC: int = 128):
    """(label, kernel, constexprs, warps, stages) of the forward state scan as ``ssm_scan.states_fwd`` launches it
    with ``cfg`` (dense, no initial state, states stored)."""
    BT = kernel_chunk(chunk_size, cfg)
    BMS = min(cfg.BMS, triton.next_power_of_2(M))
    BCH = min(cfg.BCH, triton.next_power_of_2(NC))
    tiles = {"BT": BT, "BMS": BMS, "BCH": BCH}
    flags = {"IS_VARLEN": False, "HAS_INIT": False, "STORE_STATES": True, "STORE_FINAL": False, "USE_WHILE": False}
    w = cfg.warps_state
    cx = {**flags, **tiles, "DOT_PREC": cfg.dot_prec}
    yield f"state_fwd BMS{BMS} BCH{BCH} w{w}", K._state_fwd, cx, w, cfg.stages_state


def chunk_variants(
    cfg: InterdomainConfig = DEFAULT_CONFIG, chunk_size: int = 64, M: int = 64, R: int = 64, D: int = 64
):
    """(label, kernel, constexprs, warps, stages, bf16 args) of the Interdomain chunk kernels as ``ops.py`` launches
    them on the GPU with ``cfg`` (dense inputs, bf16 q/k/v/do, bf16 o), one per readout variant (CONJ_P, REAL_C)
    and, for the backward, per launch part (PART 0 fused, or 1 / 2 when ``cfg.bwd_split``)."""
    BT = kernel_chunk(chunk_size, cfg)
    common = {
        "IS_VARLEN": False,
        "BT": BT,
        "BC": min(cfg.BC, BT),
        "BR": triton.next_power_of_2(R),
        "BD": triton.next_power_of_2(D),
        "BM": triton.next_power_of_2(M),
        "DOT_PREC": "bf16" if cfg.bf16_dots(torch.bfloat16) else cfg.dot_prec,  # cfg.chunk_prec() on the GPU
        "LP_DOT": True,
        "REAL_PREC": "bf16" if cfg.bf16_dots(torch.bfloat16) else cfg.real_dot_prec,
    }
    parts = (1, 2) if cfg.bwd_split else (0,)
    variants = [("trans", False, False, {}), ("herm", True, False, {}), ("real1", False, True, {})]
    # the opt-in precision of the chained C products, for the spill comparison
    if cfg.real_dot_prec != "tf32x3" and not cfg.bf16_dots(torch.bfloat16):
        variants.append(("real1x3", False, True, {"REAL_PREC": "tf32x3"}))
    for ro, conj, real_c, over in variants:
        fwd = {**common, "CONJ_P": conj, "REAL_C": real_c, **over}
        label = f"chunk_fwd {ro} BT{BT} BC{common['BC']} w{cfg.warps_chunk_fwd}"
        yield label, IK._chunk_fwd, fwd, cfg.warps_chunk_fwd, cfg.stages, BF16_ARGS | {"o"} | state_args(cfg)
        for part in parts:
            bwd = {**common, "CONJ_P": conj, "REAL_C": real_c, "PART": part, **over}
            label = f"chunk_bwd{part} {ro} BT{BT} BC{common['BC']} w{cfg.warps_chunk_bwd}"
            bf16 = BF16_ARGS | {"dq"} | state_args(cfg) | grad_buffer_args(cfg, "dxloc", "gk_part")
            yield label, IK._chunk_bwd, bwd, cfg.warps_chunk_bwd, cfg.stages, bf16


def bilinear_variants(chunk_size: int = 64, M: int = 64, R: int = 64):
    """(label, kernel, constexprs, warps, stages, bf16 args) of the bilinear S4D readout kernels as its ``ops.py``
    launches them on the GPU under its ``DEFAULT_CONFIG`` (dense inputs), the backward for PART 0, 1 and 2."""
    from hybrid_attention.ops.s4d_bilinear.triton import kernels as SK
    from hybrid_attention.ops.s4d_bilinear.triton import ops as sops
    from hybrid_attention.ops.s4d_bilinear.triton.config import DEFAULT_CONFIG as SCFG

    BT = sops.kernel_chunk(chunk_size, SCFG)
    JT = min(SCFG.JT, triton.next_power_of_2(R))
    common = {"IS_VARLEN": False, "M": M, "BT": BT, "BM": triton.next_power_of_2(M), "JT": JT,
              "DOT_PREC": SCFG.dot_prec}  # fmt: skip
    act = {"a", "b", "do"}
    label = f"readout_fwd BT{BT} JT{JT} w{SCFG.warps_fwd}"
    yield label, SK._readout_fwd, common, SCFG.warps_fwd, SCFG.stages, act | {"o"}
    for part in (0, 1, 2):
        label = f"readout_bwd{part} BT{BT} JT{JT} w{SCFG.warps_bwd}"
        yield label, SK._readout_bwd, {**common, "PART": part}, SCFG.warps_bwd, SCFG.stages, act


def _print(label: str, r: dict) -> None:
    spills = f"{r['spill_st']:4d}/{r['spill_ld']:4d} B"
    print(f"{label:34s} regs {r['regs']:3d}  spill st/ld {spills}  smem {r['smem']} B  "
          f"wgmma {r['wgmma']:3d}  mma.sync {r['mma_sync']:3d}")


def main(argv: list[str] | None = None) -> None:
    """Print the registers, spills and shared memory of every kernel variant."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk-only", action="store_true",
                    help="only the Interdomain chunk kernels and the forward state scan the config selects")
    ap.add_argument("--bilinear-only", action="store_true", help="only the bilinear S4D readout kernels")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="InterdomainConfig override")
    args = ap.parse_args(argv)
    cfg = config_with(DEFAULT_CONFIG, args.set)
    print(f"sm_90 AOT compile (triton {triton.__version__}), BT=32, M=64, R=D=64")
    if args.bilinear_only:
        for label, fn, cx, warps, stages, bf16 in bilinear_variants():
            _print(label, compile_report(fn, cx, warps, stages, bf16))
        return
    if not args.chunk_only:
        for label, fn, cx, warps, stages, bf16 in variants(cfg):
            _print(label, compile_report(fn, cx, warps, stages, bf16))
    for label, fn, cx, warps, stages in scan_fwd_variants(cfg):
        _print(label, compile_report(fn, cx, warps, stages, BF16_ARGS | state_args(cfg)))
    for label, fn, cx, warps, stages, bf16 in chunk_variants(cfg):
        _print(label, compile_report(fn, cx, warps, stages, bf16))
    if not args.chunk_only:
        for label, fn, cx, warps, stages, bf16 in bilinear_variants():
            _print(label, compile_report(fn, cx, warps, stages, bf16))


if __name__ == "__main__":
    main()
