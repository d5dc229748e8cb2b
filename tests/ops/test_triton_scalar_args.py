"""Regression test: the gated-delta and chunk-attention Triton kernels take no Python-float runtime arguments.

``torch.compile`` traces these launches and inductor re-compiles the kernels, typing Python float runtime arguments
fp64 (and possibly specialising ints); a float scale multiplied into an fp32 loop-carried state then turns it fp64 and
Triton refuses the loop ("Loop-carried variable dS has initial type fp32 but is re-assigned to fp64"). Two checks:

* every launch of a forward + backward (and the decode step) is recorded under the interpreter: no argument bound to
  a runtime (non-constexpr) parameter is a Python float;
* each recorded kernel is compiled ahead of time for sm_90 (no GPU needed) in a subprocess without the interpreter,
  with the signature inductor would give it: ints as i64, any float as fp64.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from triton_device import INTERPRET

from hybrid_attention.ops.gated_delta.triton import HAS_TRITON as TRITON_AVAILABLE

pytestmark = [
    pytest.mark.skipif(not TRITON_AVAILABLE, reason="triton is not installed"),
    pytest.mark.skipif(not INTERPRET, reason="records launches under TRITON_INTERPRET=1 (the CPU interpreter)"),
]

# kernel -> module that defines it (for the AOT subprocess)
MODULES = {
    "gated_delta": "hybrid_attention.ops.gated_delta.triton.kernels",
    "decode": "hybrid_attention.ops.gated_delta.triton.decode",
    "chunk_attention": "hybrid_attention.ops.chunk_attention.triton.kernels",
}
# interpreter-only constexprs -> their value on the GPU
GPU_CONSTEXPRS = {"WHILE_LOOP": False, "UPCAST": False, "PREC": "tf32"}


def _is_constexpr(fn, name: str) -> bool:
    ann = inspect.signature(fn).parameters[name].annotation
    return ann is not inspect.Parameter.empty and "constexpr" in str(ann)


def _record_launches(monkeypatch) -> list[dict]:
    from hybrid_attention.ops.chunk_attention.triton import kernels as ca
    from hybrid_attention.ops.gated_delta.triton import decode as dec
    from hybrid_attention.ops.gated_delta.triton import kernels as gk

    kernels = {}
    for mod_key, mod in (("gated_delta", gk), ("decode", dec), ("chunk_attention", ca)):
        for name, obj in vars(mod).items():
            if name.endswith("_kernel") and hasattr(obj, "run"):
                kernels[id(obj)] = (mod_key, name)
    launches: list[dict] = []
    cls = type(gk._state_bwd_kernel)
    orig_run = cls.run

    def spy(self, *args, **kwargs):
        if id(self) in kernels:
            mod_key, name = kernels[id(self)]
            names = self.arg_names
            bound = dict(zip(names, args))
            bound.update({k: v for k, v in kwargs.items() if k in names})
            launches.append({"module": mod_key, "kernel": name, "args": bound,
                             "constexpr": {n for n in names if _is_constexpr(self.fn, n)},
                             "num_warps": kwargs.get("num_warps", 4), "num_stages": kwargs.get("num_stages", 1)})
        return orig_run(self, *args, **kwargs)

    monkeypatch.setattr(cls, "run", spy)
    return launches


def _run_ops():
    from hybrid_attention.ops.chunk_attention.triton import triton_chunk_attention
    from hybrid_attention.ops.gated_delta import gated_delta
    from hybrid_attention.ops.gated_delta.triton import triton_gated_delta_step

    B, T, H, K, V, C = 1, 20, 1, 16, 16, 16
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v = torch.randn(B, T, H, V)
    g, beta = -0.5 * torch.rand(B, T, H), torch.rand(B, T, H)
    commit = torch.rand(B, 2, H)
    S0 = torch.randn(B, H, K, V)
    xs = [x.requires_grad_() for x in (q, k, v, g, beta, commit, S0)]
    o, S = gated_delta(*xs[:5], commit=xs[5], chunk_size=C, initial_state=xs[6], output_final_state=True,
                       backend="triton")
    (o.sum() + S.sum()).backward()
    triton_gated_delta_step(q[:, 0].detach(), k[:, 0].detach(), v[:, 0].detach(), g[:, 0].detach(),
                            beta[:, 0].detach(), S0.detach().clone())
    qa, ka, va = (torch.randn(B, 2 * C, 2, 16).requires_grad_() for _ in range(3))
    routing = torch.tensor([[[1.0], [0.0]]]).expand(B, 2, 1)
    bias = torch.zeros(B, 2, 1, requires_grad=True)
    triton_chunk_attention(qa, ka, va, routing, chunk_size=C, group_size=2, routing_bias=bias).sum().backward()
    # packed documents (cu_seqlens): the VARLEN specialisations of every gated-delta and chunk-attention kernel
    cu = torch.tensor([0, 3, T], dtype=torch.int32)
    o, S = gated_delta(*xs[:5], commit=torch.rand(B, 3, H, requires_grad=True), chunk_size=C,
                       initial_state=torch.randn(2, H, K, V, requires_grad=True), output_final_state=True,
                       backend="triton", cu_seqlens=cu)
    (o.sum() + S.sum()).backward()
    cu_a = torch.tensor([0, 5, 2 * C], dtype=torch.int32)
    triton_chunk_attention(qa, ka, va, torch.tensor([[[1.0], [0.0], [1.0]]]), chunk_size=C, group_size=2,
                           routing_bias=torch.zeros(B, 3, 1, requires_grad=True), cu_seqlens=cu_a).sum().backward()


EXPECTED = {
    "gated_delta": {"_prep_kernel", "_state_fwd_kernel", "_output_kernel", "_bwd_local_kernel", "_state_bwd_kernel",
                    "_bwd_k_kernel", "_bwd_finish_kernel"},
    "decode": {"_step_kernel"},
    "chunk_attention": {"_fwd_kernel", "_dq_kernel", "_dkv_kernel"},
}


def _aot_spec(launches: list[dict]) -> list[dict]:
    """One compile spec per distinct (kernel, constexprs): signature as inductor types it (i64 ints, fp64 floats)."""
    specs, seen = [], set()
    for rec in launches:
        sig, cx = {}, {}
        for name, val in rec["args"].items():
            if name in rec["constexpr"]:
                sig[name] = "constexpr"
                cx[name] = GPU_CONSTEXPRS.get(name, val)
            elif isinstance(val, torch.Tensor):
                sig[name] = "*" + {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
                                   torch.int32: "i32", torch.int64: "i64", torch.bool: "i1"}[val.dtype]
            elif isinstance(val, bool):
                sig[name] = "i1"
            elif isinstance(val, int):
                sig[name] = "i64"
            elif isinstance(val, float):
                sig[name] = "fp64"
            else:
                raise AssertionError(f"{rec['kernel']}: unexpected argument {name}={val!r}")
        key = (rec["module"], rec["kernel"], json.dumps(cx, sort_keys=True))
        if key not in seen:
            seen.add(key)
            specs.append({"module": MODULES[rec["module"]], "kernel": rec["kernel"], "signature": sig,
                          "constexprs": cx, "num_warps": rec["num_warps"], "num_stages": rec["num_stages"]})
    return specs


AOT_SCRIPT = textwrap.dedent("""
    import importlib, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    failed = []
    for spec in json.load(sys.stdin):
        fn = getattr(importlib.import_module(spec["module"]), spec["kernel"])
        src = triton.compiler.ASTSource(fn=fn, signature=spec["signature"], constexprs=spec["constexprs"])
        try:
            triton.compile(src, target=GPUTarget("cuda", 90, 64),
                           options={"num_warps": spec["num_warps"], "num_stages": spec["num_stages"]})
        except Exception as e:  # noqa: BLE001
            msg = " ".join(str(e).split())
            failed.append(spec["kernel"] + ": " + type(e).__name__ + ": " + msg[-300:])
    print(json.dumps(failed))
""")


def test_no_python_float_runtime_args_and_fp64_safe(monkeypatch):
    launches = _record_launches(monkeypatch)
    _run_ops()
    monkeypatch.undo()
    seen = {(r["module"], r["kernel"]) for r in launches}
    for mod, names in EXPECTED.items():
        missing = {n for n in names if (mod, n) not in seen}
        assert not missing, f"{mod}: kernels not launched: {missing}"
    floats = [f"{r['kernel']}.{n}" for r in launches for n, v in r["args"].items()
              if n not in r["constexpr"] and isinstance(v, float)]
    assert not floats, f"Python-float runtime arguments (inductor types them fp64): {sorted(set(floats))}"

    if os.environ.get("HYBRID_SKIP_AOT"):
        return
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except Exception:  # pragma: no cover
        pytest.skip("this triton has no AOT GPUTarget")
    specs = _aot_spec(launches)
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    proc = subprocess.run([sys.executable, "-c", AOT_SCRIPT], input=json.dumps(specs), capture_output=True,
                          text=True, env=env, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"AOT subprocess failed: {proc.stderr[-2000:]}")
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failed, "sm_90 compile with fp64 floats / i64 ints failed:\n" + "\n".join(failed)
