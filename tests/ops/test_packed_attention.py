"""Packed causal attention (``ops/packed_attention``): the reference form == a separate causal SDPA per document
(float64, 1e-12, outputs and q/k/v gradients); "auto" picks the reference on CPU; ``causal_kwargs`` reads both
``varlen_attn`` signatures; the flash wrapper's plumbing through a stand-in op (CPU); the flash form itself on CUDA
only (bf16 vs the float64 reference, eager and under ``torch.compile(fullgraph=True)``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hybrid_attention.layers import SoftmaxAttention
from hybrid_attention.ops.common.varlen import cu_seqlens_from_lengths
from hybrid_attention.ops.packed_attention import (
    FLASH_AVAILABLE,
    causal_kwargs,
    flash_packed_causal_attention,
    packed_causal_attention,
    reference_packed_causal_attention,
    resolve_packed_backend,
)
from hybrid_attention.ops.packed_attention import flash as flash_mod

F64 = torch.float64
LENGTHS = (1, 5, 1, 37, 2, 1)  # single tokens, short and long documents, one at each end
H, D = 2, 8
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (FlashAttention)")


def _inputs(lengths=LENGTHS, dtype=F64, device="cpu", d=D):
    T = sum(lengths)
    q, k, v = (torch.randn(1, T, H, d, dtype=F64, device=device).to(dtype).requires_grad_() for _ in range(3))
    return q, k, v, cu_seqlens_from_lengths(list(lengths)).to(device)


def _per_document(q, k, v, lengths):
    """Each document alone through SDPA(is_causal=True), joined along T: the definition."""
    parts, start = [], 0
    for n in lengths:
        qd, kd, vd = (z[:, start:start + n].transpose(1, 2) for z in (q, k, v))
        parts.append(F.scaled_dot_product_attention(qd, kd, vd, is_causal=True).transpose(1, 2))
        start += n
    return torch.cat(parts, dim=1)


def _with_grads(fn, q, k, v, do):
    o = fn(q, k, v)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_reference_equals_each_document_alone(index_dtype):
    q, k, v, cu = _inputs()
    do = torch.randn_like(q)
    got = _with_grads(lambda *a: reference_packed_causal_attention(*a, cu.to(index_dtype)), q, k, v, do)
    want = _with_grads(lambda *a: _per_document(*a, LENGTHS), q, k, v, do)
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)


def test_reference_differs_from_one_causal_sequence():
    """Control: the document boundaries matter (the same inputs as one causal sequence give another result)."""
    q, k, v, cu = _inputs()
    whole = F.scaled_dot_product_attention(*(z.transpose(1, 2) for z in (q, k, v)), is_causal=True).transpose(1, 2)
    assert (reference_packed_causal_attention(q, k, v, cu) - whole).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_auto_picks_the_reference_on_cpu(dtype):
    q, k, v, cu = _inputs(dtype=dtype)
    assert resolve_packed_backend("auto", q) == "reference"
    assert torch.equal(packed_causal_attention(q, k, v, cu), reference_packed_causal_attention(q, k, v, cu))


def test_supported_rule(monkeypatch):
    """The flash rule on stand-ins for q (only is_cuda, dtype and shape are read): CUDA, fp16 / bf16, D <= 256 and
    D % 8 == 0, and the op present."""
    monkeypatch.setattr(flash_mod, "FLASH_AVAILABLE", True)
    q = lambda d, dtype=torch.bfloat16, is_cuda=True: SimpleNamespace(  # noqa: E731
        shape=(1, 4, 2, d), dtype=dtype, is_cuda=is_cuda)
    assert flash_mod.supported(q(64)) and flash_mod.supported(q(256, torch.float16)) and flash_mod.supported(q(8))
    assert not flash_mod.supported(q(264)) and not flash_mod.supported(q(60))
    assert not flash_mod.supported(q(64, torch.float32)) and not flash_mod.supported(q(64, is_cuda=False))
    monkeypatch.setattr(flash_mod, "FLASH_AVAILABLE", False)
    assert not flash_mod.supported(q(64))


def test_causal_kwargs_reads_both_signatures():
    def v2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        pass

    def v2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
              window_size=(-1, -1), enable_gqa=False):
        pass

    def neither(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k):
        pass

    assert causal_kwargs(v2_11) == {"is_causal": True}
    assert causal_kwargs(v2_12) == {"window_size": (-1, 0)}
    assert causal_kwargs(neither) is None and causal_kwargs(None) is None


def test_installed_torch_is_detected():
    """This torch's ``varlen_attn``, when it has one, is read as one of the two known forms."""
    if flash_mod.varlen_attn is None:
        assert not FLASH_AVAILABLE
        return
    assert FLASH_AVAILABLE and causal_kwargs(flash_mod.varlen_attn) in ({"is_causal": True},
                                                                        {"window_size": (-1, 0)})


@pytest.mark.parametrize("causal", [{"is_causal": True}, {"window_size": (-1, 0)}])
def test_flash_wrapper_passes_the_op_what_it_needs(monkeypatch, causal):
    """The flash form's plumbing on CPU, through a stand-in ``varlen_attn`` (per-document SDPA from the offsets it
    is given): [T, H, D] inputs, int32 offsets on q's device for both q and k, max_q = max_k = T, the causal
    keyword of the detected signature; the result is unsqueezed back to [1, T, H, D]."""
    calls = []

    def fake(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kw):
        calls.append((query.shape, cu_seq_q.dtype, cu_seq_k is cu_seq_q, max_q, max_k, kw))
        lengths = (cu_seq_q[1:] - cu_seq_q[:-1]).tolist()
        return _per_document(query[None], key[None], value[None], lengths)[0]

    monkeypatch.setattr(flash_mod, "varlen_attn", fake)
    monkeypatch.setattr(flash_mod, "_CAUSAL", causal)
    monkeypatch.setattr(flash_mod, "FLASH_AVAILABLE", True)
    q, k, v, cu = _inputs()
    o = flash_packed_causal_attention(q, k, v, cu)  # cu is int64: the wrapper casts it
    T = sum(LENGTHS)
    assert calls == [((T, H, D), torch.int32, True, T, T, causal)]
    torch.testing.assert_close(o, reference_packed_causal_attention(q, k, v, cu), rtol=0, atol=1e-12)


def test_errors():
    q, k, v, cu = _inputs()
    with pytest.raises(ValueError, match="backend must be one of 'auto', 'reference', 'flash', got 'loop'"):
        packed_causal_attention(q, k, v, cu, backend="loop")
    with pytest.raises(ValueError, match=r"q, k, v must all be \[1, T, H, D\]"):
        packed_causal_attention(q, k[:, :-1], v, cu)
    with pytest.raises(ValueError, match="cu_seqlens"):
        packed_causal_attention(q, k, v, cu[:-1])  # the offsets end before T
    with pytest.raises(ValueError, match="backend must be one of"):
        SoftmaxAttention(32, num_heads=2, backend="loop")


def test_flash_refuses_when_unavailable(monkeypatch):
    monkeypatch.setattr(flash_mod, "FLASH_AVAILABLE", False)
    q, k, v, cu = _inputs()
    with pytest.raises(RuntimeError, match="varlen_attn"):
        flash_packed_causal_attention(q, k, v, cu)


# ------------------------------------------------------------------------------------------------------ CUDA only
def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _check_flash_against_reference(fn, lengths, d):
    q, k, v, cu = _inputs(lengths, torch.bfloat16, "cuda", d)
    do = torch.randn_like(q)
    got = _with_grads(lambda *a: fn(*a, cu), q, k, v, do)
    q64, k64, v64 = (z.detach().double().requires_grad_() for z in (q, k, v))
    want = _with_grads(lambda *a: _per_document(*a, lengths), q64, k64, v64, do.double())
    for name, a, b in zip(("o", "dq", "dk", "dv"), got, want, strict=True):
        assert a.dtype == torch.bfloat16 and _rel(a, b) <= 2e-2, (name, _rel(a, b))


@cuda
@pytest.mark.parametrize("d", [64, 128])
def test_flash_bf16_matches_the_float64_reference(d):
    assert resolve_packed_backend("auto", torch.empty(1, 1, H, d, dtype=torch.bfloat16, device="cuda")) == "flash"
    _check_flash_against_reference(lambda *a: packed_causal_attention(*a, backend="flash"),
                                   (1, 7, 300, 1, 129, 64, 2), d)


@cuda
def test_flash_under_compile_fullgraph():
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: packed_causal_attention(*a, backend="flash"), fullgraph=True)
    _check_flash_against_reference(fn, (3, 250, 1, 90), 64)


def test_the_layer_and_mixer_options_pass_their_backend(monkeypatch):
    """SoftmaxAttention's packed path calls the op with its ``backend`` (mixer_options["softmax"]["backend"])."""
    from hybrid_attention.layers import softmax as softmax_layer
    from hybrid_attention.models.configuration import HybridConfig
    from hybrid_attention.models.modeling import HybridForCausalLM

    seen = []

    def spy(q, k, v, cu_seqlens, *, backend):
        seen.append(backend)
        return packed_causal_attention(q, k, v, cu_seqlens, backend=backend)

    monkeypatch.setattr(softmax_layer, "packed_causal_attention", spy)
    cfg = HybridConfig.from_preset("tiny", layers=["softmax"], num_hidden_layers=1,
                                   mixer_options={"softmax": {"backend": "reference"}})
    model = HybridForCausalLM(cfg)
    ids = torch.zeros(1, 12, dtype=torch.long)
    model(ids, cu_seqlens=cu_seqlens_from_lengths([5, 7]))
    layer = SoftmaxAttention(32, num_heads=2).double()
    layer(torch.randn(1, 12, 32, dtype=F64), cu_seqlens=cu_seqlens_from_lengths([5, 7]))
    assert seen == ["reference", "auto"]


@cuda
def test_the_layer_takes_the_flash_form_under_autocast_without_a_sync(monkeypatch):
    """A float32 SoftmaxAttention under CUDA bf16 autocast (the training setup): q, k, v are bf16, so "auto" runs
    the flash form; forward and backward make no synchronising call (device offsets, max_q = T)."""
    from hybrid_attention.ops import packed_attention

    ran = []
    flash = packed_attention._FORMS["flash"]
    monkeypatch.setitem(packed_attention._FORMS, "flash", lambda *a: ran.append(1) or flash(*a))
    layer = SoftmaxAttention(128, num_heads=2).cuda()
    x = torch.randn(1, 300, 128, device="cuda", requires_grad=True)
    cu = torch.tensor([0, 1, 100, 299, 300], dtype=torch.int32, device="cuda")

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            y, _ = layer(x, cu_seqlens=cu)
        y.float().square().mean().backward()

    step()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ran == [1, 1]
