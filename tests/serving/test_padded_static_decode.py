"""StaticDecoder with prompts of different lengths (left-padded attention_mask, per-row positions): batched greedy
static decoding == each prompt decoded alone by the model's eager path (the oracle, float64 on the CPU).

Prompt lengths 5, 10, 3 with chunk size 4: the rows sit at chunk phases 1, 2, 3, so NAtS-L rows complete their chunks
at different steps, and one step in four completes none (both step phases of the per-row mode run).
"""

from __future__ import annotations

import pytest
import torch
from test_static_decode import _NoHostSync
from triton_device import DEVICE

from hybrid_attention.layers.natsl import NatsLAttention
from hybrid_attention.layers.natsl.routing import force_routing
from hybrid_attention.models.configuration import HybridConfig
from hybrid_attention.models.modeling import HybridForCausalLM
from hybrid_attention.serving import StaticDecoder

LENGTHS = (5, 10, 3)
C = 4
NEW = 10
PAD_ID = 258
KERNEL_DEVICE = DEVICE  # the Triton tests' device: the GPU when there is one, else the interpreter's CPU


def _model(layers: list[str], natsl_rope: bool = False, dtype: torch.dtype = torch.float64) -> HybridForCausalLM:
    torch.manual_seed(0)
    cfg = HybridConfig.from_preset("tiny", layers=layers, num_hidden_layers=len(layers), chunk_size=C,
                                   mixer_options={"natsl": {"num_attn_heads": 4, "rope": natsl_rope}})
    model = HybridForCausalLM(cfg).eval().to(dtype)
    with torch.no_grad():
        for blk in model.model.layers:
            if isinstance(blk.mixer, NatsLAttention):
                blk.mixer.score_proj.weight.mul_(30)  # input-dependent chunk types: rows and chunks differ
    return model


def _batch(lengths=LENGTHS, device="cpu") -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Prompts [1, L_i] and their left-padded batch: ids [B, T] (PAD_ID at padding), mask [B, T]."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (1, n), generator=g).to(device) for n in lengths]
    t = max(lengths)
    ids = torch.full((len(lengths), t), PAD_ID, device=device)
    mask = torch.zeros(len(lengths), t, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, t - p.shape[1]:], mask[i, t - p.shape[1]:] = p[0], 1
    return prompts, ids, mask


@torch.no_grad()
def _eager_alone(model: HybridForCausalLM, prompt: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: greedy eager decoding of one prompt -> (new tokens [n], logits [n, V])."""
    logits, cache = model.prefill(prompt)
    toks, outs = [], []
    for i in range(n):
        outs.append(logits[0])
        nxt = logits.argmax(-1, keepdim=True)
        toks.append(nxt[0, 0])
        if i + 1 < n:
            out = model(nxt, cache=cache, use_cache=True)
            logits, cache = out.logits[:, -1], out.cache
    return torch.stack(toks), torch.stack(outs)


@torch.no_grad()
def _static_batched(dec: StaticDecoder, ids: torch.Tensor, mask: torch.Tensor | None, n: int):
    """Greedy static decoding of the batch -> (new tokens [B, n], logits [B, n, V], the step phases seen)."""
    logits = dec.prefill(ids, attention_mask=mask).clone()
    toks, outs, phases = [], [], set()
    for i in range(n):
        outs.append(logits)
        nxt = logits.argmax(-1, keepdim=True)
        toks.append(nxt)
        if i + 1 < n:
            phases.add(dec._phase(dec.length))
            logits = dec.step(nxt).clone()
    return torch.cat(toks, 1), torch.stack(outs, 1), phases


CASES = [["softmax"], ["gdn"], ["interdomain"], ["s4d"], ["s4d_bilinear"], ["natsl"], "natsl+rope",
         ["gdn", "natsl", "softmax", "interdomain"]]


@pytest.mark.parametrize("layers", CASES, ids=lambda v: v if isinstance(v, str) else "+".join(v))
def test_padded_static_generation_equals_each_prompt_alone(layers) -> None:
    model = _model(["natsl"], natsl_rope=True) if layers == "natsl+rope" else _model(layers)
    prompts, ids, mask = _batch()
    dec = StaticDecoder(model, len(prompts), max(LENGTHS) + NEW)
    toks, logits, phases = _static_batched(dec, ids, mask, NEW)
    assert dec.per_row and dec.row_pos.tolist() == [n + NEW - 1 for n in LENGTHS]
    for i, p in enumerate(prompts):
        alone_toks, alone_logits = _eager_alone(model, p, NEW)
        assert torch.equal(toks[i], alone_toks)
        torch.testing.assert_close(logits[i], alone_logits, rtol=0, atol=1e-8)
    assert torch.equal(dec.generate(ids, NEW, attention_mask=mask)[:, ids.shape[1]:], toks)
    if any(c is not None for c in dec.chunk_sizes):  # NAtS-L: both per-row step phases ran
        assert len(phases) == 2


@torch.no_grad()
def test_padded_natsl_rows_keep_their_own_chunks() -> None:
    """The per-row chunk ends: every row's kept-chunk counts equal its own eager decode state's (rows route
    differently and complete chunks at different steps); the control feeds the padding as tokens."""
    model = _model(["natsl", "natsl"])
    prompts, ids, mask = _batch()
    dec = StaticDecoder(model, len(prompts), max(LENGTHS) + NEW)
    toks, _, _ = _static_batched(dec, ids, mask, NEW)
    kept = []
    for i, p in enumerate(prompts):
        cache = model.prefill(p)[1]
        for t in torch.cat([p, toks[i:i + 1, :-1]], 1)[0, p.shape[1]:]:
            cache = model(t.view(1, 1), cache=cache, use_cache=True).cache
        kept.append(torch.stack([st.n_kept[0] for st in cache.states]))
        for layer, st in enumerate(dec.states):
            assert torch.equal(st.n_kept[i], kept[i][layer])
    kept = torch.stack(kept)  # [B, layers, Hn]
    assert kept.any() and not torch.equal(kept[0], kept[1]), "test needs rows that keep different chunks"
    unpadded = StaticDecoder(model, len(prompts), max(LENGTHS) + NEW).generate(ids, NEW)[:, ids.shape[1]:]
    assert not torch.equal(unpadded[2], toks[2])  # the control: the padding read as tokens changes the shortest row


@torch.no_grad()
def test_padded_natsl_forced_fraction() -> None:
    """A forced softmax fraction types chunk n of a row by the row's own chunk number n (per-row positions)."""
    model = _model(["natsl", "softmax"])
    force_routing(model, 0.5)
    prompts, ids, mask = _batch((7, 2, 13))
    dec = StaticDecoder(model, len(prompts), 13 + NEW)
    toks, logits, _ = _static_batched(dec, ids, mask, NEW)
    for i, p in enumerate(prompts):
        alone_toks, alone_logits = _eager_alone(model, p, NEW)
        assert torch.equal(toks[i], alone_toks)
        torch.testing.assert_close(logits[i], alone_logits, rtol=0, atol=1e-8)
        n = p.shape[1] + NEW - 1  # tokens fed: chunks completed in the row = n // C, every second one kept
        assert int(dec.states[0].n_kept[i, 0]) == (n // C) // 2  # chunks 1, 3, 5, ...


@torch.no_grad()
def test_all_ones_mask_is_the_equal_length_path() -> None:
    model = _model(["gdn", "natsl", "softmax", "interdomain"])
    ids = torch.randint(0, 256, (2, 7))
    a, b = StaticDecoder(model, 2, 16), StaticDecoder(model, 2, 16)
    la, lb = a.prefill(ids, attention_mask=torch.ones_like(ids)).clone(), b.prefill(ids).clone()
    assert not a.per_row and torch.equal(la, lb)
    for _ in range(5):
        nxt = la.argmax(-1, keepdim=True)
        la, lb = a.step(nxt).clone(), b.step(nxt).clone()
        assert torch.equal(la, lb)
    # a later unpadded prefill leaves the per-row mode
    _, ids, mask = _batch()
    c = StaticDecoder(model, 3, 16)
    c.prefill(ids, attention_mask=mask)
    assert c.per_row
    c.prefill(ids)
    assert not c.per_row and int(c.pos) == c.length == max(LENGTHS)


@torch.no_grad()
def test_padded_step_has_no_host_sync_and_fixed_addresses() -> None:
    model = _model(["gdn", "natsl", "softmax", "interdomain", "s4d"], natsl_rope=True, dtype=torch.float32)
    _, ids, mask = _batch()
    dec = StaticDecoder(model, 3, 24)
    dec.prefill(ids, attention_mask=mask)
    buffers = [dec.tokens, dec.logits, dec.pos, dec.row_pos] + [b for m in dec.states for b in m.buffers()]
    ptrs = [b.data_ptr() for b in buffers]
    for _ in range(4):  # every chunk phase of the rows: three chunk-final steps (one row each) and one without
        phase = dec._phase(dec.length)
        with _NoHostSync():
            dec._step_impl(phase, True)
        dec.length += 1
    assert [b.data_ptr() for b in buffers] == ptrs
    assert dec.row_pos.tolist() == [n + 4 for n in LENGTHS]
    assert dec._all_phases(True) == [(False,) * 5, (False, True, False, False, False)]


@torch.no_grad()
def test_padded_step_traces_as_one_graph() -> None:
    """torch.compile(fullgraph=True) of the per-row step in both phases equals the plain per-row step. aot_eager:
    Dynamo's trace plus AOT functionalisation of the in-place scatters into buffer views (inductor's own codegen is
    left to test_decoder_compile: ~60 s here)."""
    model = _model(["gdn", "natsl", "softmax", "interdomain"], natsl_rope=True, dtype=torch.float32)
    _, ids, mask = _batch()
    dec, ref = StaticDecoder(model, 3, 24), StaticDecoder(model, 3, 24)
    dec._run_rows = torch.compile(dec._own_step_impl(), backend="aot_eager", fullgraph=True, dynamic=False)
    for d in (dec, ref):
        d.prefill(ids, attention_mask=mask)
    tok = torch.tensor([[3], [5], [7]])
    for _ in range(4):
        assert torch.allclose(dec.step(tok), ref.step(tok), atol=1e-6, rtol=0)
        tok = ref.logits.argmax(-1, keepdim=True)


@torch.no_grad()
def test_padded_fused_kernels_float32() -> None:
    """The fused Triton decode steps and the split-KV attention with per-row lengths (the interpreter here) equal the
    plain per-row step (SDPA, PyTorch recurrences), float32."""
    model = _model(["gdn", "interdomain", "natsl", "softmax"], dtype=torch.float32).to(KERNEL_DEVICE)
    _, ids, mask = _batch(device=KERNEL_DEVICE)
    fused = StaticDecoder(model, 3, 16, use_kernels=True, compile=False)
    plain = StaticDecoder(model, 3, 16, use_kernels=False, compile=False)
    a, b = fused.prefill(ids, attention_mask=mask).clone(), plain.prefill(ids, attention_mask=mask).clone()
    for _ in range(4):
        nxt = b.argmax(-1, keepdim=True)
        a, b = fused.step(nxt).clone(), plain.step(nxt).clone()
        assert (a - b).abs().max() <= (2e-4 if KERNEL_DEVICE == "cpu" else 2e-3) * b.abs().max()


def test_padded_errors() -> None:
    model = _model(["softmax"])
    _, ids, mask = _batch()
    dec = StaticDecoder(model, 3, 12)
    with pytest.raises(ValueError, match=r"^attention_mask must have the shape of input_ids \(3, 10\)"):
        dec.prefill(ids, attention_mask=mask[:, 1:])
    bad = mask.clone()
    bad[0, -1] = 0
    with pytest.raises(ValueError, match="^attention_mask must be left padding") as err:
        dec.prefill(ids, attention_mask=bad)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"prompt \(10\) \+ max_new_tokens \(4\) exceeds max_length=12"):
        dec.generate(ids, 4, attention_mask=mask)
    dec.generate(ids, 3, attention_mask=mask)  # the longest row fits (10 + 3 - 1 fed tokens <= 12)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@torch.no_grad()
def test_cuda_graphs_of_the_per_row_mode() -> None:
    """GPU: graphs of both modes captured before any prefill (the per-row one while equal-length), then a padded
    prefill: replays equal the uncaptured per-row step (fused kernels, compiled by default on CUDA); a mode without
    graphs is refused in one line."""
    model = _model(["gdn", "natsl", "softmax", "interdomain"], natsl_rope=True, dtype=torch.float32).cuda()
    _, ids, mask = _batch(device="cuda")
    graphs, plain = StaticDecoder(model, 3, 32), StaticDecoder(model, 3, 32, compile=False)
    graphs.capture()
    graphs.capture(per_row=True)
    assert sorted(graphs.graphs) == [(False, (False,) * 4), (False, (False, True, False, False)),
                                     (True, (False,) * 4), (True, (False, True, False, False))]
    a, b = graphs.prefill(ids, attention_mask=mask).clone(), plain.prefill(ids, attention_mask=mask).clone()
    for _ in range(2 * C + 1):
        nxt = b.argmax(-1, keepdim=True)
        a, b = graphs.step(nxt).clone(), plain.step(nxt).clone()
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()
    only = StaticDecoder(model, 3, 32)
    only.capture()
    only.prefill(ids, attention_mask=mask)
    with pytest.raises(ValueError, match="no CUDA graph for the per-row"):
        only.step(ids[:, :1])
