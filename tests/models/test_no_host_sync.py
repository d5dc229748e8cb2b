"""Whole-model dense forwards read nothing on the host: a tiny model of every mixer runs on the ``meta``
device, where any host read (``.item()``, ``int(tensor)``, ``nonzero``, a data-dependent shape) raises.

The GPU form is what runs: each mixer's backend is "triton" (conftest sets ``TRITON_INTERPRET=1`` on the CPU, so
the Triton wrappers accept non-CUDA tensors) and every kernel launch is a no-op (``_no_launches``), so the host
side of the wrappers, the layers and the model runs as on the GPU, minus the kernels themselves (which never read
back). The S4D mixer has no Triton form; its CUDA "auto" choices (Toeplitz up to 2K tokens, FFT above) and its chunked
form run as such.
The CUDA-only tests at the end check the same calls with ``torch.cuda.set_sync_debug_mode("error")``.
Packed documents (``cu_seqlens``): the training call with the offsets on the meta device as well, for every
mixer with a sync-free packed form (all but S4D's Toeplitz / FFT forms; its chunked form, which "auto" runs for
packed documents, is one).
"""

from __future__ import annotations

import pytest
import torch

from hybrid_attention.layers.natsl.routing import RoutingRecorder
from hybrid_attention.models.configuration import HybridConfig
from hybrid_attention.models.modeling import HybridForCausalLM

T = 64  # 4 chunks of the tiny preset's 16
CASES = {
    "softmax": (["softmax"], {}),
    "gdn": (["gdn"], {}),
    "natsl": (["natsl"], {}),
    "interdomain": (["interdomain"], {}),
    "s4d-toeplitz": (["s4d"], {"s4d": {"backend": "toeplitz"}}),
    "s4d-fft": (["s4d"], {"s4d": {"backend": "fft"}}),
    "s4d-chunk": (["s4d"], {"s4d": {"backend": "chunk"}}),
    "s4d_bilinear": (["s4d_bilinear"], {}),
    "natsl+gdn": (["gdn", "natsl", "gdn", "natsl"], {}),
    "conv-triton": (["gdn", "natsl", "interdomain"], {name: {"conv_backend": "triton"}
                                                      for name in ("gdn", "natsl", "interdomain")}),
}

CONV_KERNELS = {"_conv_fwd_walk_kernel", "_conv_bwd_walk_kernel"}  # the short convolutions' default forms at K = 4


def _model(layers: list[str], options: dict, device: str, backend: str = "triton", **natsl) -> HybridForCausalLM:
    opts = {name: {"backend": backend} for name in ("gdn", "natsl", "interdomain", "s4d_bilinear")}
    for name, extra in options.items():
        opts[name] = {**opts.get(name, {}), **extra}
    opts["natsl"] = {**opts["natsl"], **natsl}
    cfg = HybridConfig.from_preset("tiny", layers=layers, num_hidden_layers=len(layers), mixer_options=opts)
    with torch.device(device):
        return HybridForCausalLM(cfg)


@pytest.fixture
def _no_launches(monkeypatch):
    """Every Triton kernel launch (``kernel[grid](...)``) does nothing; returns the list of launched kernel names.

    The diagonal-SSM ops (Interdomain, bilinear S4D) and the short convolution call registered ``torch.library`` ops,
    whose meta kernel is the shape-only fake: here they call the eager autograd Function instead, which runs the same
    host implementations and gradient rule with the same default config (``ops/common/triton/eager.py``)."""
    import triton.runtime.jit as jit

    from hybrid_attention.ops.causal_conv.triton import ops as causal_conv_ops
    from hybrid_attention.ops.interdomain.triton import ops as interdomain_ops
    from hybrid_attention.ops.s4d_bilinear.triton import ops as s4d_bilinear_ops

    launched: list[str] = []
    # the Triton wrappers accept the meta tensors only as they accept CPU ones, under the interpreter's flag (read at
    # call time); on a CUDA machine conftest leaves it unset, and no kernel runs here either way
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def getitem(self, grid):
        launched.append(getattr(self, "__name__", None) or getattr(getattr(self, "fn", None), "__name__", "?"))
        return lambda *args, **kwargs: None

    monkeypatch.setattr(jit.KernelInterface, "__getitem__", getitem)
    for mod, op, eager in ((interdomain_ops, "interdomain_fwd_op", interdomain_ops._EagerInterdomain.apply),
                           (s4d_bilinear_ops, "s4d_bilinear_fwd_op", s4d_bilinear_ops._EagerS4DBilinear.apply),
                           (causal_conv_ops, "causal_conv1d_fwd_op", causal_conv_ops._run_eager)):
        monkeypatch.setattr(mod, op, lambda *args, fn=eager, mod=mod: fn(mod.DEFAULT_CONFIG, mod.NO_HOOKS, *args))
    return launched


@pytest.mark.parametrize("case", list(CASES))
def test_training_forward_and_backward_read_nothing_on_the_host(case, _no_launches):
    layers, options = CASES[case]
    model = _model(layers, options, "meta").train()
    ids = torch.zeros(2, T, dtype=torch.long, device="meta")
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, T, model.config.vocab_size) and out.loss.device.type == "meta"
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    if case not in ("softmax", "s4d-toeplitz", "s4d-fft", "s4d-chunk"):
        assert _no_launches, "the Triton forms did not run"
    if case == "conv-triton":  # the short convolutions ran their kernels' host side, both directions
        assert CONV_KERNELS <= set(_no_launches)


PACKED_NATSL = {"router": {}, "forced": {"force_routing": 0.5}, "counterfactual": {"counterfactual_grad": True}}
# The S4D mixer's Toeplitz / FFT forms run packed documents through their per-document reference form, which reads
# the offsets on the host (ops/common/varlen.py, per_document); its chunked form (ops/s4d/chunk.py) reads nothing,
# and "auto" (the layer's default, "s4d-auto") runs it for packed documents.
PACKED_ONLY = {"s4d-auto": (["s4d"], {})}
PACKED_CASES = [case for case in CASES if case not in ("s4d-toeplitz", "s4d-fft")] + list(PACKED_ONLY)
PACKED_RUNS = [(case, natsl) for case in PACKED_CASES for natsl in PACKED_NATSL
               if natsl == "router" or "natsl" in {**CASES, **PACKED_ONLY}[case][0]]


@pytest.mark.parametrize("case,natsl", PACKED_RUNS)
def test_packed_training_forward_and_backward_read_nothing_on_the_host(case, natsl, _no_launches):
    """Packed documents: ``cu_seqlens`` is a meta tensor too, so its values cannot be read; every shape
    comes from T, N = cu_seqlens.numel() - 1 and the chunk size (NAtS-L: its chunk list padded to the static bounds
    T // C and ``max_chunks``). NAtS-L: the router's routing, a forced fraction, the counterfactual gradient."""
    layers, options = {**CASES, **PACKED_ONLY}[case]
    model = _model(layers, options, "meta", **PACKED_NATSL[natsl]).train()
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    cu = torch.empty(5, dtype=torch.int32, device="meta")  # 4 documents
    out = model(ids, labels=ids, cu_seqlens=cu)
    assert out.logits.shape == (1, T, model.config.vocab_size) and out.loss.device.type == "meta"
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    if case not in ("softmax", "s4d-chunk", "s4d-auto"):
        assert _no_launches, "the Triton forms did not run"
    if case == "conv-triton":
        assert CONV_KERNELS <= set(_no_launches)


def test_a_recorder_on_a_packed_pass_reads_the_chunk_count(_no_launches):
    """Control: a RoutingRecorder attached to a packed pass keeps only its real chunks (the layer pads the list to a
    static bound), a selection that reads their count on the host; the meta device catches it. Without a recorder
    the same pass reads nothing (above)."""
    model = _model(["natsl"], {}, "meta").train()
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    rec = RoutingRecorder()
    with rec.attach(model), pytest.raises((RuntimeError, NotImplementedError)):
        model(ids, cu_seqlens=torch.empty(5, dtype=torch.int32, device="meta"))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("natsl", [{"prefill_cache": "full"}, {"force_routing": 0.5}], ids=["router-full", "forced"])
def test_prefill_with_a_recorder_reads_nothing_on_the_host(case, natsl, _no_launches):
    """The benchmark's prefill (benchmarks/models.py): ``model(ids, use_cache=True, logits_to_keep=1)`` building the
    decode state, with a RoutingRecorder attached. NAtS-L: the router's routing with prefill_cache="full", or a
    forced fraction (its slot count is known on the host)."""
    layers, options = CASES[case]
    model = _model(layers, options, "meta", **natsl).eval()
    ids = torch.zeros(2, T + 5, dtype=torch.long, device="meta")
    rec = RoutingRecorder()
    with torch.no_grad(), rec.attach(model):
        out = model(ids, use_cache=True, logits_to_keep=1)
    assert out.logits.shape == (2, 1, model.config.vocab_size)
    assert len(out.cache.states) == len(layers)
    for key in model.routing_layers():
        assert rec.last(key).shape == (2, T // 16, model.config.num_heads)


def test_the_default_trim_prefill_reads_the_kept_count(_no_launches):
    """Control: the default prefill_cache="trim" with the router's routing reads the largest kept count (one host
    sync per NAtS-L layer and prefill, the leanest decode cache); the meta device catches it."""
    model = _model(["natsl"], {}, "meta").eval()
    ids = torch.zeros(1, T, dtype=torch.long, device="meta")
    with torch.no_grad(), pytest.raises((RuntimeError, NotImplementedError)):
        model(ids, use_cache=True, logits_to_keep=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (sync debug mode)")
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_forward_backward_and_prefill_make_no_sync(case):
    """CUDA only: the same calls with "auto" backends (the kernels run) raise on any synchronising call."""
    layers, options = CASES[case]
    model = _model(layers, options, "cuda", backend="auto", prefill_cache="full")
    ids = torch.randint(0, model.config.vocab_size, (2, 4 * T), device="cuda")
    model(ids, labels=ids).loss.backward()  # warm-up: kernel compilation, allocator, cuBLAS handles
    with torch.no_grad():
        model(ids, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(ids, labels=ids).loss.backward()
        with torch.no_grad():
            model(ids, use_cache=True, logits_to_keep=1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (sync debug mode)")
@pytest.mark.parametrize("case", PACKED_CASES)
def test_cuda_packed_forward_backward_make_no_sync(case):
    """CUDA only: the packed training call with device offsets ("auto" backends, the kernels run) raises on any
    synchronising call."""
    layers, options = {**CASES, **PACKED_ONLY}[case]
    model = _model(layers, options, "cuda", backend="auto")
    ids = torch.randint(0, model.config.vocab_size, (1, 4 * T), device="cuda")
    cu = torch.tensor([0, 1, 17, 100, 4 * T], dtype=torch.int32, device="cuda")
    model(ids, labels=ids, cu_seqlens=cu).loss.backward()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model(ids, labels=ids, cu_seqlens=cu).loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
