"""StaticDecoder: static-buffer decode steps equal the model's eager (Python-side state) decoding, without host syncs.

Oracle: `model.prefill` then `model(token, cache=...)` one token at a time (float64 on the CPU), itself tested against
the full forward pass in tests/models and tests/layers. CUDA graphs cannot run here; `step` is the captured code.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch.overrides import TorchFunctionMode
from triton_device import DEVICE

from benchmarks.decode_latency import decode_latency
from hybrid_attention.layers.base import TokenMixer
from hybrid_attention.layers.natsl import NatsLAttention
from hybrid_attention.layers.natsl.routing import RoutingRecorder, RoutingSpec, force_routing
from hybrid_attention.models.configuration import HybridConfig
from hybrid_attention.models.modeling import HybridForCausalLM
from hybrid_attention.serving import StaticDecoder

C = 16  # chunk size of the tiny preset
KERNEL_DEVICE = DEVICE  # the Triton tests' device: the GPU when there is one, else the interpreter's CPU


def make_model(layers, dtype=torch.float64, sharp_router=True, natsl_rope=False,
               readout: str = "transpose", **natsl_options) -> HybridForCausalLM:
    cfg = HybridConfig.from_preset("tiny", layers=layers,
                                   mixer_options={"natsl": {"rope": natsl_rope, **natsl_options},
                                                  "interdomain": {"readout": readout}})
    model = HybridForCausalLM(cfg).eval().to(dtype)
    with torch.no_grad():
        for blk in model.model.layers:
            if isinstance(blk.mixer, NatsLAttention) and sharp_router:
                # Larger router weights make the chunk types depend on the input, so rows and chunks differ.
                blk.mixer.score_proj.weight.mul_(30)
    return model


@torch.no_grad()
def eager_and_static(model, ids, t0, use_kernels=False, extra=3, routing=None, **kwargs):
    """Logits [N+1, B, V] of eager and static decoding (prefill of t0 tokens, then ids[:, t0:] one at a time);
    ``routing``: a RoutingRecorder that sees the eager calls only (the chunk types of the eager cache, in order)."""
    b, t = ids.shape
    watch = lambda: routing.attach(model) if routing is not None else contextlib.nullcontext()  # noqa: E731
    with watch():
        logits, cache = model.prefill(ids[:, :t0])
    kwargs.setdefault("fused_gemv", use_kernels)  # the kernel runs cover the fused decode GEMVs too (opt-in)
    dec = StaticDecoder(model, b, t + extra, use_kernels=use_kernels, **kwargs)
    eager, static = [logits], [dec.prefill(ids[:, :t0]).clone()]
    for i in range(t0, t):
        with watch():
            out = model(ids[:, i:i + 1], cache=cache, use_cache=True)
        cache = out.cache
        eager.append(out.logits[:, -1])
        static.append(dec.step(ids[:, i:i + 1]).clone())
    return torch.stack(eager), torch.stack(static), cache, dec


def assert_close(a, b, tol):
    scale = a.abs().max()
    assert scale > 0
    assert (a - b).abs().max() <= tol * scale, float((a - b).abs().max() / scale)


@pytest.mark.parametrize("layers", ["softmax", "gdn", "interdomain", "interdomain+hermitian", "interdomain+real",
                                    "s4d", "s4d_bilinear", "natsl", "natsl+rope", "natsl+own_conv",
                                    ["gdn", "natsl", "softmax"]])
def test_steps_match_eager_decode(layers):
    """Odd prompt in mid-chunk, then steps across three NAtS-L chunk ends; B = 2, float64."""
    if layers == "natsl+rope":
        model = make_model("natsl", natsl_rope=True)
    elif layers == "natsl+own_conv":  # the softmax q / k's own convolutions in the fused step (attn_qk="own_conv")
        model = make_model("natsl", attn_qk="own_conv")
    elif isinstance(layers, str) and layers.startswith("interdomain+"):
        model = make_model("interdomain", readout=layers.split("+")[1])
    else:
        model = make_model(layers)
    ids = torch.randint(0, 259, (2, 21 + 45))
    eager, static, cache, _ = eager_and_static(model, ids, 21)
    assert_close(eager, static, 1e-10)


@pytest.mark.parametrize("t0", [5, 32])
def test_natsl_prefill_lengths(t0):
    """A prompt shorter than a chunk and a chunk-aligned prompt (the first step starts a fresh chunk)."""
    model = make_model("natsl")
    ids = torch.randint(0, 259, (2, t0 + 2 * C + 3))
    eager, static, _, _ = eager_and_static(model, ids, t0)
    assert_close(eager, static, 1e-10)


def test_natsl_rows_route_differently():
    """B = 2 rows whose chunk types differ: the compacted caches hold different chunks per row, and the per-row
    device-side counts equal the eager layer's."""
    model = make_model(["natsl", "natsl"])
    ids = torch.randint(0, 259, (2, 7 + 4 * C))
    rec = RoutingRecorder()
    eager, static, cache, dec = eager_and_static(model, ids, 7, routing=rec)
    assert_close(eager, static, 1e-10)
    for i, (layer_state, mixer) in enumerate(zip(cache.states, dec.states)):
        types = rec.chunk_types(i)  # [B, chunks, Hn], True = softmax
        assert types.any() and not types.all(), "test needs both chunk types"
        assert torch.equal(mixer.n_kept, layer_state.n_kept)
    types = rec.chunk_types(0)
    assert not torch.equal(types[0], types[1]), "test needs rows with different routings"


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_natsl_forced_fraction(fraction):
    """A forced softmax fraction types chunk n by its number n (from the device position in the static step)."""
    model = make_model("natsl")
    force_routing(model, fraction)
    ids = torch.randint(0, 259, (2, 5 * C + 3))
    eager, static, cache, dec = eager_and_static(model, ids, 2 * C - 3)
    assert_close(eager, static, 1e-10)
    assert int(dec.states[0].n_kept[0, 0]) == round(5 * fraction)
    assert torch.equal(dec.states[0].n_kept, cache.states[0].n_kept)


@pytest.mark.parametrize("force", ["softmax", "gdn"])
def test_natsl_forced_routing(force):
    """All chunks softmax (cache fills to its capacity) or all GDN (nothing kept, every chunk committed)."""
    model = make_model(["natsl", "softmax"])
    model.model.layers[0].mixer.routing = RoutingSpec(force)
    ids = torch.randint(0, 259, (1, 3 * C))  # max_length = 3C: the last chunk completes on the last position
    eager, static, _, dec = eager_and_static(model, ids, 9, extra=0)
    assert_close(eager, static, 1e-10)
    assert int(dec.states[0].n_kept.max()) == (3 if force == "softmax" else 0)
    # a capacity of exactly the kept chunks (GDN: none at all) is enough
    eager, static, _, dec = eager_and_static(model, ids, 9, extra=0,
                                             natsl_cache_chunks=3 if force == "softmax" else 0)
    assert_close(eager, static, 1e-10)
    assert not dec.overflowed()


@torch.no_grad()
def test_natsl_capacity_overflow_is_reported():
    model = make_model("natsl")
    force_routing(model, "softmax")
    ids = torch.randint(0, 259, (2, 9))
    with pytest.raises(ValueError, match="natsl_cache_chunks=0"):
        StaticDecoder(model, 2, 64, natsl_cache_chunks=0).prefill(torch.randint(0, 259, (2, C + 1)))
    dec = StaticDecoder(model, 2, 64, natsl_cache_chunks=1)
    dec.generate(ids, C)  # positions up to 24: one chunk kept
    assert not dec.overflowed()
    with pytest.raises(RuntimeError, match="natsl_cache_chunks=1"):
        dec.generate(ids, 2 * C)  # a second kept chunk


@pytest.mark.parametrize("layers,readout", [(["gdn", "interdomain", "natsl", "softmax"], "transpose"),
                                            (["interdomain"], "hermitian"), (["interdomain"], "real")])
def test_fused_kernels_float32(layers, readout):
    """The fused Triton decode steps and the split-KV attention (CUDA; the Triton interpreter here) inside the static
    decoder, float32, for every Interdomain readout."""
    model = make_model(layers, dtype=torch.float32, readout=readout).to(KERNEL_DEVICE)
    ids = torch.randint(0, 259, (2, 13 + C + 2), device=KERNEL_DEVICE)
    eager, static, _, _ = eager_and_static(model, ids, 13, use_kernels=True)
    # the interpreter computes the kernels' dots in true float32; on the GPU they are tf32 (10-bit mantissa inputs):
    # measured 3.3e-4 on the H200, so the GPU bound is 2e-3
    assert_close(eager, static, 2e-4 if KERNEL_DEVICE == "cpu" else 2e-3)


class _NoHostSync(TorchFunctionMode):
    """Fails on every tensor -> Python conversion (what a captured CUDA graph cannot contain)."""

    BANNED = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy", "cpu"}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.BANNED:
            raise AssertionError(f"host sync in step: {name}")
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def test_step_has_no_host_sync_and_fixed_addresses():
    model = make_model(["gdn", "natsl", "softmax", "interdomain", "s4d"], dtype=torch.float32, natsl_rope=True)
    dec = StaticDecoder(model, 2, 40)
    dec.prefill(torch.randint(0, 259, (2, 14)))
    buffers = [dec.tokens, dec.logits, dec.pos] + [b for m in dec.states for b in m.buffers()]
    ptrs = [b.data_ptr() for b in buffers]
    tok = torch.zeros(2, 1, dtype=torch.long)
    for _ in range(4):  # crosses the chunk end at position 15 (phase: chunk-final)
        phase = dec._phase(dec.length)
        with _NoHostSync():
            dec._step_impl(phase)
        dec.length += 1
        dec.tokens.copy_(tok)
    assert [b.data_ptr() for b in buffers] == ptrs
    assert int(dec.pos) == dec.length == 18
    assert dec._all_phases() == [(False,) * 5, (False, True, False, False, False)]


@torch.no_grad()
def test_generate_is_greedy():
    model = make_model(["gdn", "natsl"])
    ids = torch.randint(0, 259, (2, 11))
    out = StaticDecoder(model, 2, 11 + 20).generate(ids, 21)
    cur, (logits, cache) = ids, model.prefill(ids)
    for _ in range(21):
        nxt = logits.argmax(-1, keepdim=True)
        cur = torch.cat([cur, nxt], 1)
        o = model(nxt, cache=cache, use_cache=True)
        logits, cache = o.logits[:, -1], o.cache
    assert torch.equal(out, cur)


def test_errors():
    model = make_model("softmax")
    dec = StaticDecoder(model, 2, 6)
    with pytest.raises(ValueError, match="batch_size"):
        dec.prefill(torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_length"):
        dec.prefill(torch.zeros(2, 7, dtype=torch.long))
    dec.prefill(torch.zeros(2, 5, dtype=torch.long))
    dec.step(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="max_length=6 exceeded"):
        dec.step(torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token_ids must be \[batch_size=2, 1\]"):
        dec.step(torch.zeros(1, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"length must be in \[0, max_length=6\]"):
        dec.fill_random(7)
    with pytest.raises(ValueError, match="softmax_fraction"):
        dec.fill_random(3, softmax_fraction=1.5)
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        StaticDecoder(model, 2, 0)
    with pytest.raises(ValueError, match="dtype"):
        StaticDecoder(model, 2, 8, dtype=torch.float32)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="capture"):
            dec.capture()

    class Other(TokenMixer):
        pass

    model.model.layers[0].mixer = Other()
    with pytest.raises(ValueError, match="allowed mixer classes"):
        StaticDecoder(model, 2, 8)


def test_decode_latency_smoke():
    model = make_model(["natsl", "softmax", "gdn", "interdomain", "s4d"], dtype=torch.float32, sharp_router=False)
    rows = decode_latency(model, contexts=[20, 40], batch_sizes=[1, 2], iters=3, warmup=1,
                          natsl_softmax_fraction=0.5)
    assert [(r["batch_size"], r["context"]) for r in rows] == [(1, 20), (1, 40), (2, 20), (2, 40)]
    for r in rows:
        assert r["error"] is None and r["eager_ms"] > 0 and r["graph_ms"] is None
    # NAtS-L capacity: half of the context's chunks (round(0.5 * 2) = 1 at 40 tokens) + 1 chunk end + 1 spare
    assert [r["natsl_cache_chunks"] for r in rows] == [2, 3, 2, 3]


@torch.no_grad()
def test_bfloat16_interdomain_static_step():
    """bf16 weights (the GPU benchmark's dtype): the S4D parameters are discretised from a float32 copy (complex
    tensors need float32 parts) and the static step runs; its output matches the float32 model's on the same state."""
    model = make_model(["interdomain", "s4d"], dtype=torch.float32)
    ref = StaticDecoder(model, 1, 8)
    ref.fill_random(5)
    model16 = copy.deepcopy(model).to(torch.bfloat16)
    dec = StaticDecoder(model16, 1, 8)
    for a, b in zip(ref.states, dec.states):
        for x, y in zip(a.buffers(), b.buffers()):
            y.copy_(x)
    dec.set_length(5)
    tok = torch.tensor([[7]])
    out16 = dec.step(tok).float()
    out32 = ref.step(tok)
    assert out16.dtype == torch.float32 and dec.logits.dtype == torch.bfloat16 and ref.logits.dtype == torch.float32
    assert_close(out32, out16, 5e-2)


@pytest.mark.parametrize("force", [None, 0.5])
@torch.no_grad()
def test_step_traces_as_one_graph(force):
    """torch.compile(fullgraph=True) (tracing only, eager backend) of both step phases: any host sync, data-dependent
    shape or Python branch on a tensor value would be a graph break and raise here."""
    model = make_model(["gdn", "natsl", "softmax", "interdomain", "s4d"], dtype=torch.float32, natsl_rope=True)
    model.model.layers[1].mixer.routing = RoutingSpec(force)
    dec = StaticDecoder(model, 2, 40)
    ids = torch.randint(0, 259, (2, 18))
    dec.prefill(ids[:, :14])
    ref = StaticDecoder(model, 2, 40)
    ref.prefill(ids[:, :14])
    compiled = torch.compile(dec._step_impl, backend="eager", fullgraph=True)
    for i in range(14, 18):  # positions 14 (inside a chunk) and 15 (chunk-final), then the next chunk
        for d in (dec, ref):
            d.tokens.copy_(ids[:, i:i + 1])
        compiled(dec._phase(i))
        ref.step(ids[:, i:i + 1])
        assert torch.allclose(dec.logits, ref.logits, atol=1e-6, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@torch.no_grad()
def test_cuda_graphs_match_eager_decode():
    """GPU: captured graphs (both chunk phases, fused kernels) vs the model's eager decode and the uncaptured step."""
    model = make_model(["gdn", "natsl", "softmax", "interdomain", "s4d"], dtype=torch.float32,
                       natsl_rope=True).cuda()
    ids = torch.randint(0, 259, (2, 21 + 3 * C), device="cuda")
    logits, cache = model.prefill(ids[:, :21])
    graphs, plain = StaticDecoder(model, 2, ids.shape[1] + 1), StaticDecoder(model, 2, ids.shape[1] + 1)
    graphs.capture()  # before the prefill: capturing must not depend on (or change) the state
    assert len(graphs.graphs) == 2
    graphs.prefill(ids[:, :21])
    plain.prefill(ids[:, :21])
    eager, via_graph, via_step = [], [], []
    for i in range(21, ids.shape[1]):
        out = model(ids[:, i:i + 1], cache=cache, use_cache=True)
        cache = out.cache
        eager.append(out.logits[:, -1])
        via_graph.append(graphs.step(ids[:, i:i + 1]).clone())
        via_step.append(plain.step(ids[:, i:i + 1]).clone())
    eager, via_graph, via_step = torch.stack(eager), torch.stack(via_graph), torch.stack(via_step)
    assert_close(via_step, via_graph, 1e-5)
    assert_close(eager, via_graph, 5e-3)  # eager kernels vs the fused decode kernels, tf32 dots: 2.1e-3 measured
    # capture() mid-sequence leaves the state unchanged
    plain.capture()
    nxt = ids[:, -1:]
    assert_close(graphs.step(nxt).clone(), plain.step(nxt).clone(), 1e-5)


@pytest.mark.parametrize("num_splits,len_dtype,broadcast", [(1, torch.int64, False), (3, torch.int64, False),
                                                             (7, torch.int32, False), (16, torch.int32, True)])
def test_split_kv_decode_attention(num_splits, len_dtype, broadcast):
    """The Triton split-KV kernel vs its PyTorch definition: two key ranges per (row, head) with lengths from device
    tensors (int32 or int64, read through their strides: per (row, head) or all broadcast from [1, 1]), empty first
    ranges, splits that get no key, fp32 and bf16 buffers."""
    from hybrid_attention.ops.decode_attention import decode_attention, decode_attention_reference

    b, h, L, d, dv = 2, 3, 90, 24, 40  # non-power-of-2 head sizes
    dev = KERNEL_DEVICE
    q = torch.randn(b, h, d, device=dev)
    len1 = torch.tensor([[0, 5, 40], [17, 1, 0]], device=dev, dtype=len_dtype)
    start2 = torch.full((1, 1), 60, device=dev, dtype=len_dtype)
    len2 = torch.tensor([[3, 30, 1], [1, 12, 30]], device=dev, dtype=len_dtype)
    if broadcast:  # one length for every (row, head); 16 splits of 6 keys: most splits empty
        len1, len2 = len1[:1, 1:2], len2[1:, 0:1]
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        k, v = torch.randn(b, h, L, d, dtype=dt, device=dev), torch.randn(b, h, L, dv, dtype=dt, device=dev)
        o = decode_attention(q.to(dt), k, v, len1, start2, len2, d**-0.5, num_splits, block_n=16)
        ref = decode_attention_reference(q.to(dt).double(), k.double(), v.double(), len1, start2, len2, d**-0.5)
        assert o.dtype == dt and o.shape == (b, h, dv)
        assert (o.double() - ref).abs().max() < tol


@torch.no_grad()
@pytest.mark.parametrize("batch", [3, 9])
def test_fused_mlp_gemvs_in_the_step(monkeypatch, batch):
    """use_kernels at B <= 8: every block's MLP half is ops/decode_linear's two launches (the mixer's residual add +
    RMSNorm + gate|up + SwiGLU, down + residual) and the final norm + lm_head one; the step equals the plain one.
    At B = 9 (above the kernels' rows) the decoder keeps the PyTorch MLP."""
    import hybrid_attention.serving.decoder as decoder_mod

    calls = {"add_norm_linear": 0, "norm_linear": 0, "linear_residual": 0}

    def counted(name):
        fn = getattr(decoder_mod, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in calls:
        monkeypatch.setattr(decoder_mod, name, counted(name))
    model = make_model(["gdn", "softmax"], dtype=torch.float32).to(KERNEL_DEVICE)
    ids = torch.randint(0, 259, (batch, 9), device=KERNEL_DEVICE)
    fused = StaticDecoder(model, batch, 12, use_kernels=True, compile=False, fused_gemv=True)
    plain = StaticDecoder(model, batch, 12, use_kernels=False, compile=False, fused_gemv=True)
    assert fused.fused_mlp == (batch <= 8) and not plain.fused_mlp  # the GEMVs need use_kernels
    assert not StaticDecoder(model, batch, 12, use_kernels=True, compile=False).fused_mlp  # opt-in (not measured)
    fused.prefill(ids[:, :7])
    plain.prefill(ids[:, :7])
    for i in range(7, 9):
        out = fused.step(ids[:, i:i + 1]).clone()
        assert_close(out, plain.step(ids[:, i:i + 1]), 2e-4 if KERNEL_DEVICE == "cpu" else 2e-3)
    n = 2 if batch <= 8 else 0  # steps
    assert calls == {"add_norm_linear": n * 2, "norm_linear": n, "linear_residual": n * 2}
