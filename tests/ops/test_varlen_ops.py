"""Packed documents (``cu_seqlens``) through every op form: packed run == each document run alone (float64, 1e-10),
outputs, final states and gradients; the one-line errors of bad offsets; flex refuses (the Triton kernels that take
packed inputs are tested in test_varlen_triton.py)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from ssm_cases import make_ssm_params

from hybrid_attention.ops.chunk_attention import chunk_attention
from hybrid_attention.ops.common.varlen import (
    chunk_layout,
    chunk_offsets,
    cu_seqlens_from_lengths,
    document_ids,
    max_chunks,
    positions_in_document,
    validate_cu_seqlens,
)
from hybrid_attention.ops.gated_delta import gated_delta
from hybrid_attention.ops.interdomain import interdomain
from hybrid_attention.ops.natsl_mixed import natsl_mixed
from hybrid_attention.ops.s4d import s4d
from hybrid_attention.ops.s4d_bilinear import s4d_bilinear

F64, C128 = torch.float64, torch.complex128
TOL = 1e-10
C = 4  # chunk size: documents of length 1, below, equal to and across it
LENGTHS = (1, 3, 4, 9, 2)
H, R, D, M = 2, 3, 4, 5


@dataclass
class Case:
    """tok: per-token inputs [1, T, ...]; chunk: per-chunk inputs [1, Nc, ...]; fixed: other arguments; state: the
    initial state [N, ...] or None; call(backend, **inputs, initial_state=..., cu_seqlens=...) -> (o, state)."""

    tok: dict[str, torch.Tensor]
    chunk: dict[str, torch.Tensor | None]
    fixed: dict
    state: torch.Tensor | None
    call: Callable


def _ssm_case(op: str, seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    T = sum(LENGTHS)
    rn = lambda *s: torch.randn(*s, dtype=F64, generator=g)  # noqa: E731
    if op == "interdomain":
        log_lam, B, Cm = make_ssm_params(H, M, seed)
        tok = {"q": rn(1, T, H, R), "k": rn(1, T, H, R), "v": rn(1, T, H, D)}
        state = 0.3 * torch.randn(len(LENGTHS), H, M, R + D, dtype=C128, generator=g)
        call = lambda be, q, k, v, **kw: interdomain(q, k, v, log_lam, B, Cm, chunk_size=C, backend=be,  # noqa: E731
                                                     output_final_state=True, **kw)
    elif op == "s4d":
        log_lam, B, Cm, w = make_ssm_params(H, M, seed, with_w=True)
        tok = {"a": rn(1, T, H, R), "b": rn(1, T, H, D)}
        state = 0.3 * torch.randn(len(LENGTHS), H, M, R + D, dtype=C128, generator=g)
        call = lambda be, a, b, **kw: s4d(a, b, log_lam, B, Cm, w, backend=be,  # noqa: E731
                                          output_final_state=True, **kw)
    else:
        log_lam, B, Cm = make_ssm_params(H, M, seed)
        tok = {"a": rn(1, T, H, R), "b": rn(1, T, H, R)}
        state = 0.3 * torch.randn(len(LENGTHS), H, M, 2 * R, dtype=C128, generator=g)
        call = lambda be, a, b, **kw: s4d_bilinear(a, b, log_lam, B, Cm, chunk_size=C, backend=be,  # noqa: E731
                                                   output_final_state=True, **kw)
    return Case(tok, {}, {}, state, call)


def _gdn_tok(g: torch.Generator, T: int) -> dict[str, torch.Tensor]:
    rn = lambda *s: torch.randn(*s, dtype=F64, generator=g)  # noqa: E731
    return {"q": rn(1, T, H, R), "k": rn(1, T, H, R), "v": rn(1, T, H, D),
            "g": -0.5 * torch.rand(1, T, H, dtype=F64, generator=g),
            "beta": torch.rand(1, T, H, dtype=F64, generator=g)}


def _n_chunks() -> int:
    return sum(math.ceil(n / C) for n in LENGTHS)


def _gdn_case(with_commit: bool, seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    tok = _gdn_tok(g, sum(LENGTHS))
    commit = torch.randint(0, 2, (1, _n_chunks(), H), generator=g).to(F64) if with_commit else None
    state = torch.randn(len(LENGTHS), H, R, D, dtype=F64, generator=g)
    call = lambda be, q, k, v, g, beta, commit=None, **kw: gated_delta(  # noqa: E731
        q, k, v, g, beta, commit=commit, chunk_size=C, backend=be, output_final_state=True, **kw)
    return Case(tok, {"commit": commit}, {}, state, call)


def _attn_case(seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    T, Hs, G = sum(LENGTHS), 4, 2
    tok = {n: torch.randn(1, T, Hs, R, dtype=F64, generator=g) for n in ("q", "k", "v")}
    routing = torch.rand(1, _n_chunks(), Hs // G, generator=g) < 0.5
    bias = torch.zeros(1, _n_chunks(), Hs // G, dtype=F64)
    call = lambda be, q, k, v, routing, routing_bias, initial_state=None, **kw: (  # noqa: E731
        chunk_attention(q, k, v, routing, chunk_size=C, group_size=G, routing_bias=routing_bias, backend=be, **kw),
        None)
    return Case(tok, {"routing": routing, "routing_bias": bias}, {}, None, call)


CASES = {
    "interdomain": lambda: _ssm_case("interdomain"),
    "s4d": lambda: _ssm_case("s4d"),
    "s4d_bilinear": lambda: _ssm_case("s4d_bilinear"),
    "gated_delta": lambda: _gdn_case(False),
    "gated_delta-commit": lambda: _gdn_case(True),
    "chunk_attention": _attn_case,
}


def _leaves(case: Case, with_state: bool) -> list[torch.Tensor]:
    """Fresh differentiable copies of every float input (the packed run and the separate runs share no graph)."""
    xs = [*case.tok.values(), *(x for x in case.chunk.values() if x is not None and x.is_floating_point())]
    if with_state and case.state is not None:
        xs.append(case.state)
    return [x.detach().clone().requires_grad_() for x in xs]


def _split(case: Case, leaves: list[torch.Tensor], with_state: bool):
    n_tok = len(case.tok)
    tok = dict(zip(case.tok, leaves[:n_tok], strict=True))
    floats = [n for n, x in case.chunk.items() if x is not None and x.is_floating_point()]
    chunk = {**case.chunk, **dict(zip(floats, leaves[n_tok:n_tok + len(floats)], strict=True))}
    state = leaves[-1] if with_state and case.state is not None else None
    return tok, chunk, state


def _loss(o: torch.Tensor, state: torch.Tensor | None) -> torch.Tensor:
    w = torch.linspace(-1, 1, o.numel(), dtype=F64).view_as(o)
    loss = (o * w).sum()
    if state is not None:
        sr = torch.view_as_real(state) if state.is_complex() else state
        loss = loss + (sr * torch.linspace(-1, 1, sr.numel(), dtype=F64).view_as(sr)).sum()
    return loss


def _separate(case: Case, leaves: list[torch.Tensor], with_state: bool, backend: str):
    """Each document alone (no cu_seqlens), joined: the oracle."""
    tok, chunk, state = _split(case, leaves, with_state)
    offs = cu_seqlens_from_lengths(LENGTHS).tolist()
    coffs = chunk_offsets(torch.tensor(offs), C).tolist()
    os, ss = [], []
    for i in range(len(LENGTHS)):
        t_i = {n: x[:, offs[i]:offs[i + 1]] for n, x in tok.items()}
        c_i = {n: (x[:, coffs[i]:coffs[i + 1]] if x is not None else None) for n, x in chunk.items()}
        o, s = case.call(backend, **t_i, **c_i, initial_state=state[i:i + 1] if state is not None else None)
        os.append(o)
        ss.append(s)
    return torch.cat(os, 1), (torch.cat(ss, 0) if ss[0] is not None else None)


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("backend", ["naive", "reference", "auto"])
@pytest.mark.parametrize("name", list(CASES))
def test_packed_equals_separate(name: str, backend: str, with_state: bool) -> None:
    case = CASES[name]()
    if with_state and case.state is None:
        pytest.skip("the op takes no state")
    ref_leaves = _leaves(case, with_state)
    o_ref, s_ref = _separate(case, ref_leaves, with_state, "naive")
    leaves = _leaves(case, with_state)
    tok, chunk, state = _split(case, leaves, with_state)
    o, s = case.call(backend, **tok, **chunk, initial_state=state, cu_seqlens=cu_seqlens_from_lengths(LENGTHS))
    assert o.shape == o_ref.shape
    assert (o - o_ref).abs().max().item() < TOL
    if s_ref is not None:
        assert s.shape[0] == len(LENGTHS)
        assert (s - s_ref).abs().max().item() < TOL
    g_ref = torch.autograd.grad(_loss(o_ref, s_ref), ref_leaves, allow_unused=True)
    g = torch.autograd.grad(_loss(o, s), leaves, allow_unused=True)
    for a, b, x in zip(g, g_ref, leaves, strict=True):
        a, b = (torch.zeros_like(x) if y is None else y for y in (a, b))
        assert (a - b).abs().max().item() < TOL


def test_packed_differs_from_concatenated() -> None:
    """The test above can fail: without cu_seqlens the state leaks across documents and the outputs differ."""
    case = CASES["gated_delta"]()
    o_ref, _ = _separate(case, _leaves(case, False), False, "naive")
    o, _ = case.call("reference", **case.tok, **case.chunk)
    assert (o - o_ref).abs().max().item() > 1e-3


def test_natsl_mixed_reference_packed() -> None:
    gdn, attn = _gdn_case(True), _attn_case()
    cu = cu_seqlens_from_lengths(LENGTHS)
    t = gdn.tok
    qa, ka, va = attn.tok.values()
    o_g, S, o_a = natsl_mixed(t["q"], t["k"], t["v"], t["g"], t["beta"], gdn.chunk["commit"], qa, ka, va,
                              attn.chunk["routing"], chunk_size=C, group_size=2, output_final_state=True,
                              backend="auto", cu_seqlens=cu)
    og_ref, S_ref = _separate(gdn, _leaves(gdn, False), False, "naive")
    oa_ref, _ = _separate(attn, _leaves(attn, False), False, "naive")
    assert (o_g - og_ref).abs().max().item() < TOL and (S - S_ref).abs().max().item() < TOL
    assert (o_a - oa_ref).abs().max().item() < TOL


@pytest.mark.parametrize("backend", ["naive", "reference"])
@pytest.mark.parametrize("name", ["gated_delta-commit", "chunk_attention"])
def test_per_chunk_inputs_padded_to_max_chunks(name: str, backend: str) -> None:
    """Per-chunk inputs of the sync-free row count max_chunks(T, N, C) (the NAtS-L layer's packed routing): the rows
    past Nc are ignored (junk there changes nothing, their gradient is zero); one row more raises."""
    case = CASES[name]()
    cu = cu_seqlens_from_lengths(LENGTHS)
    nc, rows = _n_chunks(), max_chunks(sum(LENGTHS), len(LENGTHS), C)
    assert rows > nc
    pad = {n: torch.cat([x, torch.ones_like(x[:, :1]).expand(1, rows - nc, *x.shape[2:])], 1)
           for n, x in case.chunk.items()}
    o_ref, _ = case.call(backend, **case.tok, **case.chunk, cu_seqlens=cu)
    leaves = {n: x.detach().clone().requires_grad_() if x.is_floating_point() else x for n, x in pad.items()}
    tok = {n: x.detach().clone().requires_grad_() for n, x in case.tok.items()}
    o, _ = case.call(backend, **tok, **leaves, cu_seqlens=cu)
    assert torch.equal(o, o_ref)
    for x in leaves.values():
        if x.requires_grad:
            (g,) = torch.autograd.grad(_loss(o, None), x, allow_unused=True)
            assert g is None or g[:, nc:].abs().max().item() == 0
    one_more = {n: torch.cat([x, x[:, :1]], 1) for n, x in pad.items()}
    first = next(iter(case.chunk))
    with pytest.raises(ValueError, match=rf"^{first} must be \[1, Nc, \.\.\.\] with Nc = {nc} chunks, or up to "
                                         rf"max_chunks = {rows} rows"):
        case.call(backend, **case.tok, **one_more, cu_seqlens=cu)


def test_chunk_layout_with_the_static_row_count() -> None:
    """chunk_layout(cu, C, T): max_chunks rows without a host read (meta offsets), the chunks first, then spare rows of
    length 0."""
    cu = cu_seqlens_from_lengths([1, 3, 5])
    starts, lens = chunk_layout(cu, 2, 9)
    assert starts.numel() == max_chunks(9, 3, 2) == 6  # == Nc here: no spare row
    assert (starts.tolist(), lens.tolist()) == ([0, 1, 3, 4, 6, 8], [1, 2, 1, 2, 2, 1])
    cu = cu_seqlens_from_lengths([2, 2, 2, 3])  # Nc = 5, max_chunks = 6
    starts, lens = chunk_layout(cu, 2, 9)
    exact = chunk_layout(cu, 2)
    assert starts[:5].tolist() == exact[0].tolist() and lens[:5].tolist() == exact[1].tolist()
    assert lens[5:].tolist() == [0] and (starts[5:] >= 9).all()
    meta = chunk_layout(torch.empty(4, dtype=torch.int32, device="meta"), 2, 9)
    assert meta[0].shape == meta[1].shape == (6,) and meta[0].device.type == "meta"


def test_flex_backend_refuses_cu_seqlens() -> None:
    """(gated_delta's and chunk_attention's Triton kernels take cu_seqlens: tests/ops/test_varlen_triton.py.)"""
    cu = cu_seqlens_from_lengths(LENGTHS)
    attn = CASES["chunk_attention"]()
    with pytest.raises(NotImplementedError, match="flex backend of chunk_attention"):
        attn.call("flex", **attn.tok, **attn.chunk, cu_seqlens=cu)


def test_helpers() -> None:
    cu = cu_seqlens_from_lengths([1, 3, 5])
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 1, 4, 9]
    assert document_ids(cu).tolist() == [0, 1, 1, 1, 2, 2, 2, 2, 2]
    assert positions_in_document(cu).tolist() == [0, 0, 1, 2, 0, 1, 2, 3, 4]
    assert chunk_offsets(cu, 2).tolist() == [0, 1, 3, 6]
    starts, lens = chunk_layout(cu, 2)
    assert starts.tolist() == [0, 1, 3, 4, 6, 8] and lens.tolist() == [1, 2, 1, 2, 2, 1]


@pytest.mark.parametrize("cu,T,B,msg", [
    (torch.tensor([1, 4, 9]), 9, 1, r"^cu_seqlens must start at 0, got cu_seqlens\[0\] = 1$"),
    (torch.tensor([0, 4, 4, 9]), 9, 1, r"^cu_seqlens must be strictly increasing"),
    (torch.tensor([0, 5, 4, 9]), 9, 1, r"^cu_seqlens must be strictly increasing"),
    (torch.tensor([0, 4, 8]), 9, 1, r"^cu_seqlens must end at T = 9"),
    (torch.tensor([0.0, 9.0]), 9, 1, r"^cu_seqlens must have dtype int32 or int64, got torch.float32$"),
    (torch.tensor([0, 9]), 9, 2, r"^cu_seqlens requires inputs of batch size 1"),
    (torch.tensor([[0, 9]]), 9, 1, r"^cu_seqlens must be a 1-d tensor"),
])
def test_bad_cu_seqlens(cu: torch.Tensor, T: int, B: int, msg: str) -> None:
    with pytest.raises(ValueError, match=msg) as info:
        validate_cu_seqlens(cu, T, B)
    assert "\n" not in str(info.value)


def test_bad_cu_seqlens_through_an_op() -> None:
    case = CASES["s4d"]()
    with pytest.raises(ValueError, match="^cu_seqlens must end at T = 19"):
        case.call("reference", **case.tok, cu_seqlens=torch.tensor([0, 5, 18], dtype=torch.int32))
    gdn = CASES["gated_delta-commit"]()
    cu = cu_seqlens_from_lengths(LENGTHS)
    with pytest.raises(ValueError, match=r"^commit must be \[1, Nc, \.\.\.\] with Nc = 7"):
        gdn.call("reference", **gdn.tok, commit=gdn.chunk["commit"][:, :-1], cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"^initial_state must hold one state per sequence"):
        gdn.call("reference", **gdn.tok, initial_state=gdn.state[:2], cu_seqlens=cu)
