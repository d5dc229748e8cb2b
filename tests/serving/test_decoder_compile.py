"""StaticDecoder(compile=...): eager by default on the CPU, compiled by default on CUDA; the compiled step (inductor,
here on the CPU) equals the plain one. CUDA graphs of the compiled step are tested on the GPU (test_static_decode)."""

from __future__ import annotations

import pytest
import torch
from test_static_decode import make_model

from hybrid_attention.serving import StaticDecoder


def test_compile_flag_defaults_and_plain_path():
    """On the CPU the default is the plain step (today's path), as with compile=False; compile=True wraps it."""
    model = make_model("softmax", dtype=torch.float32)
    for dec in (StaticDecoder(model, 1, 8), StaticDecoder(model, 1, 8, compile=False)):
        assert not dec.compile and dec._run == dec._step_impl
    forced = StaticDecoder(model, 1, 8, compile=True)
    assert forced.compile and forced._run != forced._step_impl


@torch.no_grad()
def test_inductor_compiled_step_matches_plain_step():
    """Inductor (C++ on the CPU) of both chunk phases of a softmax + NAtS-L (RoPE) model: ~30 s on 2 cores."""
    model = make_model(["softmax", "natsl"], dtype=torch.float32, natsl_rope=True)
    ids = torch.randint(0, 259, (2, 18))
    dec, ref = StaticDecoder(model, 2, 24, compile=True), StaticDecoder(model, 2, 24, compile=False)
    dec.prefill(ids[:, :14])
    ref.prefill(ids[:, :14])
    for i in range(14, 18):  # positions 14 (inside a chunk), 15 (chunk-final), then the next chunk
        out = dec.step(ids[:, i:i + 1]).clone()
        assert torch.allclose(out, ref.step(ids[:, i:i + 1]), atol=1e-5, rtol=0)
    assert torch.equal(dec.states[1].n_kept, ref.states[1].n_kept)



@torch.no_grad()
def test_many_compiled_decoders_in_one_process():
    """Each decoder compiles its own step (its own code object): more decoders of different sizes than Dynamo's
    recompile_limit (8) in one process must not hit the limit (a hard error under fullgraph=True), and each compiled
    step equals the plain one. Traced with the eager backend (the property is Dynamo's cache, not inductor's code);
    the control compiles the shared `_step_impl` and must hit the limit."""
    import torch._dynamo

    model = make_model("softmax", dtype=torch.float32)
    ids, tok = torch.randint(0, 259, (1, 3)), torch.zeros(1, 1, dtype=torch.long)
    n = torch._dynamo.config.recompile_limit + 2
    for i in range(n):
        dec, ref = StaticDecoder(model, 1, 8 + i, compile=False), StaticDecoder(model, 1, 8 + i, compile=False)
        dec._run = torch.compile(dec._own_step_impl(), backend="eager", fullgraph=True, dynamic=False)
        dec.prefill(ids)
        ref.prefill(ids)
        assert torch.allclose(dec.step(tok), ref.step(tok), atol=1e-6, rtol=0)
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        for i in range(n):
            dec = StaticDecoder(model, 1, 8 + i, compile=False)
            dec._run = torch.compile(dec._step_impl, backend="eager", fullgraph=True, dynamic=False)
            dec.prefill(ids)
            dec.step(tok)
    torch._dynamo.reset()


@torch.no_grad()
def test_inductor_compiled_step_with_fused_kernels(device):
    """The compiled step over the registered fused decode ops (Triton; the interpreter on the CPU): Interdomain's op
    mutates its state, which inductor must functionalise (a complex state failed with "auto_functionalized_v2 was not
    removed" on the H200; the op now takes real views). GDN and softmax beside it; equals the plain step."""
    dev = device  # the kernels natively on a GPU, else the interpreter
    model = make_model(["interdomain", "gdn", "softmax"], dtype=torch.float32, readout="real").to(dev)
    ids = torch.randint(0, 259, (2, 12), device=dev)
    dec = StaticDecoder(model, 2, 16, use_kernels=True, compile=True, fused_gemv=True)
    ref = StaticDecoder(model, 2, 16, use_kernels=True, compile=False, fused_gemv=True)
    dec.prefill(ids[:, :9])
    ref.prefill(ids[:, :9])
    for i in range(9, 12):
        out = dec.step(ids[:, i:i + 1]).clone()
        assert torch.allclose(out, ref.step(ids[:, i:i + 1]), atol=1e-5, rtol=0)
    assert torch.allclose(dec.states[0].ssm, ref.states[0].ssm, atol=1e-6, rtol=0)


def test_kernels_on_cpu_without_the_interpreter_are_refused(monkeypatch):
    """use_kernels=True on a CPU model needs the Triton interpreter; without it, one line instead of a Triton launch
    error on CPU pointers (what the H200 run of the test above showed)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match=r"^use_kernels=True needs a CUDA model or TRITON_INTERPRET=1"):
        StaticDecoder(make_model("gdn", dtype=torch.float32), 1, 8, use_kernels=True)
