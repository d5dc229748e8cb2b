"""Chunked form of the S4D-only control (``chunk_s4d``): a Toeplitz matmul inside chunks, complex states between them
(the same masked Toeplitz structure one level up, `_decay_scan`), so packed documents run without a per-document loop
or a host sync and one compiled graph serves every document layout."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..common.autocast import autocast_off
from ..common.planar import Planar, as_planar
from ..common.ssm import compute_dtypes, validate_chunk_size
from ..common.varlen import bucket_of, check_cu_seqlens
from .conv_form import _cmul, _kernel, _tables, _vandermonde
from .naive import validate_s4d_inputs

__all__ = ["chunk_s4d", "SCAN_BLOCK"]

# Chunks per block of the chunk-level scan (step 3): NC <= SCAN_BLOCK runs as one dense masked [NC, NC] lag matmul
# per head and mode; more chunks are grouped by SCAN_BLOCK and recursed on the group-end states.
SCAN_BLOCK = 32


def _lower_toeplitz(v: torch.Tensor) -> torch.Tensor:
    """W[..., i, j] = v[..., i - j] for j <= i, else 0: ``[..., N, N]`` from v ``[..., N]``."""
    n = v.shape[-1]
    idx = torch.arange(n, device=v.device)
    lag = idx[:, None] - idx[None, :]
    return torch.where(lag >= 0, v[..., lag.clamp(min=0)], v.new_zeros(()))


def _decay_scan(xr: torch.Tensor, xi: torch.Tensor, log_mu: Planar, ids: torch.Tensor | None,
                rdtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """S_n = Σ_{j <= n, ids[j] == ids[n]} μ^{n-j} x_j along dim 2 of the planar complex x (xr, xi ``[H, M, N, Y]``),
    μ = exp(log_mu) (planar float64 ``[H, M]``, |μ| < 1); ids ``[N]`` (int64 >= 0, equal ids contiguous) or None (one
    sequence). Blocks of SCAN_BLOCK: a masked lag matmul inside each, the block-end states recursed with μ^G."""
    H, M, N, Y = xr.shape
    G = min(N, SCAN_BLOCK)
    NG = -(-N // G)
    pad = NG * G - N
    if pad:
        xr, xi = F.pad(xr, (0, 0, 0, pad)), F.pad(xi, (0, 0, 0, pad))
        if ids is not None:
            ids = F.pad(ids, (0, pad), value=-1)
    Vr, Vi = _vandermonde(log_mu, G + 1)  # μ^k, k = 0..G: float64 [H, G + 1, M]
    Vr, Vi = Vr.transpose(1, 2).to(rdtype), Vi.transpose(1, 2).to(rdtype)  # [H, M, G + 1]
    Wr, Wi = _lower_toeplitz(Vr[..., :G])[:, :, None], _lower_toeplitz(Vi[..., :G])[:, :, None]  # [H, M, 1, G, G]
    xr, xi = xr.reshape(H, M, NG, G, Y), xi.reshape(H, M, NG, G, Y)
    idg = None
    if ids is not None:
        idg = ids.view(NG, G)
        same = (idg[:, :, None] == idg[:, None, :]).to(rdtype)  # [NG, G, G]
        Wr, Wi = Wr * same, Wi * same  # [H, M, NG, G, G]
    Sr = torch.matmul(Wr, xr) - torch.matmul(Wi, xi)  # [H, M, NG, G, Y]
    Si = torch.matmul(Wr, xi) + torch.matmul(Wi, xr)
    if NG > 1:
        Pr, Pi = _decay_scan(Sr[:, :, :, -1], Si[:, :, :, -1], log_mu.map(lambda t: t * G),
                             None if idg is None else idg[:, -1],
                             rdtype)  # block-end states [H, M, NG, Y]
        Pr, Pi = F.pad(Pr[:, :, :-1], (0, 0, 1, 0)), F.pad(Pi[:, :, :-1], (0, 0, 1, 0))  # carried into block g
        Dr, Di = Vr[:, :, None, 1:], Vi[:, :, None, 1:]  # μ^{i+1}: [H, M, 1, G]
        if idg is not None:
            prev = F.pad(idg[:-1, -1], (1, 0), value=-1)  # the id running at the end of block g - 1
            cont = (idg == prev[:, None]).to(rdtype)  # [NG, G]
            Dr, Di = Dr * cont, Di * cont
        Dr, Di, Pr, Pi = Dr[..., None], Di[..., None], Pr[:, :, :, None], Pi[:, :, :, None]
        Sr = Sr + Dr * Pr - Di * Pi
        Si = Si + Dr * Pi + Di * Pr
    return Sr.reshape(H, M, NG * G, Y)[:, :, :N], Si.reshape(H, M, NG * G, Y)[:, :, :N]


def _check_packed(cu_seqlens: torch.Tensor, a: torch.Tensor, initial_state: torch.Tensor | None, H: int, M: int,
                  n_ch: int) -> int:
    """The packed checks without a host sync: the offsets (``check_cu_seqlens``: a CPU tensor in full, except while
    torch.compile traces) and initial_state ``[N, H, M, R + D]``. Returns N."""
    n_docs = check_cu_seqlens(cu_seqlens, a.shape[1], a.shape[0])
    if initial_state is not None:
        want = (n_docs, H, M, n_ch)
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != want:
            got = tuple(initial_state.shape) if isinstance(initial_state, torch.Tensor) else repr(initial_state)
            raise ValueError(f"initial_state must hold one state per sequence with cu_seqlens: [N, H, M, R + D] = "
                             f"{want}, got {got}")
        if initial_state.device != a.device:
            raise ValueError(f"initial_state must be on the same device as a ({a.device}), got {initial_state.device}")
    return n_docs


def chunk_s4d(
    a: torch.Tensor,
    b: torch.Tensor,
    log_lam: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    w: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """S4D-only control in chunks of ``chunk_size`` tokens (equal to ``naive_s4d`` to rounding).

    Shapes: a ``[B, T, H, R]``, b ``[B, T, H, D]`` real; log_lam, B ``[H, M]`` complex; C ``[H, M, M]`` complex
    (or each a ``Planar`` pair of real tensors: no complex op then without states); w ``[H, M]`` real;
    initial_state ``[B, H, M, R + D]`` complex (``[N, ...]`` with ``cu_seqlens [N + 1]``, B == 1).
    Any T >= 0, any positive ``chunk_size``. Returns ``y [B, T, H, R + D]`` in ``a.dtype`` and the final state
    (``[B, ...]``, or ``[N, ...]`` per sequence; complex128 for float64 inputs, else complex64) or ``None``.

    Same contract as ``naive_s4d`` (naive.py: the definition), including ``cu_seqlens`` (``ops/common/varlen.py``):
    initial states ``[N, H, M, R + D]`` per sequence, final states per sequence. With c̃ = Cᵀw and K(l) = Re(Σ_m c̃_m
    B_m λ_m^l) as in conv_form.py, the output splits at chunk boundaries (chunks of L = ``chunk_size`` tokens, L = T
    when T < ``chunk_size``; T is zero-padded up to NC·L, the padded tail is a "document" of its own that nothing
    reads):

    1. Document ids. ``doc[t]`` for every padded position from ``cu_seqlens`` by ``torch.searchsorted`` on the device
       (the tail gets id N); without ``cu_seqlens`` every row is one document and no mask is built at all (the padded
       tail follows the last real token, so causality alone keeps it out).
    2. Intra-chunk: y_intra = (Toeplitz_L(K[:L]) ⊙ [doc(t) == doc(s)]) @ z per chunk, one batched real matmul
       ([H, L, L] shared by every chunk without ``cu_seqlens``, [NC, H, L, L] masked with them).
    3. Chunk-end states, planar (real, imaginary) float parts ``[H, M, NC, B, R + D]``: the local part of chunk n,
       restricted to the document d_n running at its last row, b_n = Σ_{s in n, doc(s) = d_n} λ^{L-1-s} B z_s (one
       einsum), plus the initial state X0 of d_n decayed to the chunk end, λ^{L - o} X0 (o: the document's start offset
       in the chunk), when d_n starts in chunk n. Then S_n = Σ_{j <= n, d_j = d_n} μ^{n-j} b_j with μ = λ^L: the same
       masked Toeplitz structure one level up (``_decay_scan``), as complex-times-complex matmuls of [SCAN_BLOCK]² lag
       matrices of μ powers; above SCAN_BLOCK chunks the chunks are grouped by SCAN_BLOCK and the group-end states go
       through the same function with μ^SCAN_BLOCK (a static recursion of depth log_SCAN_BLOCK(NC)), so the weights
       stay H·M·NC·SCAN_BLOCK entries (no [NC, NC] matrix per head and mode at T = 32K).
    4. Inter-chunk readout: tokens of chunk n whose document ran at the end of chunk n - 1 get
       Re(Σ_m c̃_m λ_m^{p+1} S_{n-1}[m, :]), p the token's row in the chunk. Tokens of a document's first chunk get the
       initial-state term Re(Σ_m c̃_m λ_m^{pos+1} X0[m, :]) instead (pos < L: its position in the document), gathered
       from one [N, L] table per document.
    5. Final states (``output_final_state``): per document i ending at row r of chunk n, Σ_{s <= r, doc(s) = i}
       λ^{r-s} B z_s over chunk n (gathered), plus λ^{r+1} S_{n-1} if i started before chunk n, else λ^{r-o+1} X0_i.
    Every λ power is λ^k with 0 <= k <= L (or μ^k with 0 <= k <= SCAN_BLOCK): they only decay, nothing overflows, and
    nothing is divided by a power of λ. Every shape follows from (B, T, H, R, D, M, chunk_size, N = numel(cu_seqlens) -
    1): no ``.item()``, ``.tolist()`` or ``nonzero`` on the offsets (CPU offsets are still checked in full, eagerly;
    not while torch.compile traces, where their values are not readable without a graph break), so one compiled graph
    serves every document layout of the same T and N, and the whole form is differentiable by autograd.

    Precision. The λ tables are built in float64 in real arithmetic, |λ|^k (cos, sin)(k Im log λ), as in conv_form.py
    (the phases k·L·Im log λ of the chunk-level powers grow large), then cast to the real compute dtype
    (``compute_dtypes``: float32, float64 for float64 inputs; bf16/fp16 inputs are computed in float32 and y cast
    back). Under autocast the intra-chunk Toeplitz matmul runs in the autocast dtype, the decision of toeplitz.py ("the
    matmuls run in the dtype of the autocast region they are called in ... like every Linear layer": it is the same
    lower-triangular Toeplitz matmul, cut to L lags); everything that builds, carries or reads a state (steps 3-5) runs
    in the compute dtype with autocast off, the decision of conv_form.py for its state terms (DESIGN.md via
    ``compute_dtypes``: the complex state is never kept in low precision), so the final states keep float32 accuracy.

    Cost per (head, channel column), T tokens, M modes: intra T·L multiply-adds (autocast dtype), b_n 2·M·T, the chunk
    scan 4·M·NC·min(NC, SCAN_BLOCK) (+ a carry term of 4·M·T per level above one), readout 2·M·T and final states
    2·M·N·L (compute dtype), against T² for the dense Toeplitz form. At B×T = 16×2048, H = 8, R = D = M = 64, L = 64
    (NC = 32), forward: 2.1 GMAC (bf16) + 12.9 GMAC (fp32) vs 68.7 GMAC (bf16) for toeplitz_s4d, i.e. 4.6x fewer
    multiply-adds but most of them in float32; the chunk states b, S are H·M·NC·B·C complex, 268 MB each in float32
    there (twice the inputs' float32 bytes at M = L), vs the dense form's 67 MB [H, T, T] bf16 matrix.
    """
    validate_chunk_size(chunk_size)
    packed = cu_seqlens is not None
    validate_s4d_inputs(a, b, log_lam, B, C, w, None if packed else initial_state)
    Bsz, T, H, R = a.shape
    D = b.shape[-1]
    M = log_lam.shape[1]
    Cn = R + D
    dev = a.device
    n_docs = _check_packed(cu_seqlens, a, initial_state, H, M, Cn) if packed else 1
    out_dtype = a.dtype
    rdtype, cdtype = compute_dtypes(a, b)
    X0 = None if initial_state is None else initial_state.to(cdtype)
    if T == 0:  # (never packed: documents are non-empty)
        y = a.new_zeros(Bsz, 0, H, Cn, dtype=out_dtype)
        if not output_final_state:
            return y, None
        return y, (X0 if X0 is not None else torch.zeros(Bsz, H, M, Cn, dtype=cdtype, device=dev))

    L = min(chunk_size, T)
    NC = -(-T // L)
    Tp = NC * L
    z = torch.cat([a.to(rdtype), b.to(rdtype)], dim=-1)  # [B, T, H, C]
    z = F.pad(z, (0, 0, 0, 0, 0, Tp - T)).view(Bsz, NC, L, H, Cn)
    ct, Bc, Vr, Vi = _tables(log_lam, B, C, w, L + 1)  # float64: c̃, B [H, M] planar; λ^l, l = 0..L [H, L + 1, M]
    ll = as_planar(log_lam, torch.float64)
    rows = torch.arange(L, device=dev)

    # document tables: per padded token, and per document (start, last token); one document per row without offsets
    if packed:
        cu = cu_seqlens.to(device=dev, dtype=torch.long)
        tok_doc = bucket_of(cu_seqlens.to(dev), torch.arange(Tp, device=dev))  # [Tp], N on the tail
        dc = tok_doc.view(NC, L)
        ce = dc[:, -1]  # the document running at each chunk end [NC]
        starts, last = cu[:-1], cu[1:] - 1
        if X0 is not None:
            X0 = X0[None]  # [1, N, H, M, C]
    else:
        starts = torch.zeros(1, dtype=torch.long, device=dev)
        last = torch.full((1,), T - 1, dtype=torch.long, device=dev)
        if X0 is not None:
            X0 = X0[:, None]  # [B, 1, H, M, C]

    # 2. intra-chunk: the Toeplitz matmul over L lags, in the ambient autocast dtype (toeplitz.py's decision)
    Tm = _lower_toeplitz(_kernel(ct, Bc, Vr[:, :L], Vi[:, :L]).to(rdtype))  # [H, L, L]
    if packed:
        A = Tm[None] * (dc[:, :, None] == dc[:, None, :]).to(rdtype)[:, None]  # [NC, H, L, L]
        y = torch.matmul(A, z.permute(0, 1, 3, 2, 4)).permute(0, 1, 3, 2, 4)  # [1, NC, L, H, C]
    else:
        zh = z.permute(3, 2, 0, 1, 4).reshape(H, L, Bsz * NC * Cn)
        y = torch.matmul(Tm, zh).view(H, L, Bsz, NC, Cn).permute(2, 3, 1, 0, 4)  # [B, NC, L, H, C]
    y = y.to(rdtype)

    with autocast_off(dev.type):  # 3.-5.: the states, in the compute dtype (conv_form.py's decision)
        # 3. chunk-end states b_n [H, M, NC, B, C] (planar), then the chunk-level scan S_n
        Wbr, Wbi = _cmul(Bc.re[:, None, :], Bc.im[:, None, :], Vr[:, :L].flip(1), Vi[:, :L].flip(1))  # [H, L, M]
        zb = z if not packed else z * (dc == ce[:, None]).to(rdtype)[None, :, :, None, None]
        bb = torch.einsum("hsm,xnshc->hmnxc", torch.cat([Wbr, Wbi], -1).to(rdtype), zb)  # [H, 2M, NC, B, C]
        br, bi = bb[:, :M], bb[:, M:]
        if X0 is not None:
            X0r, X0i = X0.real.to(rdtype), X0.imag.to(rdtype)  # [B, Nd, H, M, C]
            if packed:  # X0 of the document at each chunk end that starts inside that chunk, decayed λ^{L - o}
                d = ce.clamp(max=n_docs - 1)
                inj = ((ce < n_docs) & (starts[d] // L == torch.arange(NC, device=dev))).to(rdtype)
                e = L - starts[d] % L  # 1..L
                Ur = (Vr[:, e].to(rdtype) * inj[None, :, None]).transpose(1, 2)[..., None, None]  # [H, M, NC, 1, 1]
                Ui = (Vi[:, e].to(rdtype) * inj[None, :, None]).transpose(1, 2)[..., None, None]
                Xr, Xi = X0r[0, d].permute(1, 2, 0, 3)[:, :, :, None], X0i[0, d].permute(1, 2, 0, 3)[:, :, :, None]
                br, bi = br + Ur * Xr - Ui * Xi, bi + Ur * Xi + Ui * Xr
            else:  # every row's document starts at chunk 0: λ^L X0 enters b_0
                Ur, Ui = Vr[:, L].to(rdtype)[:, :, None, None], Vi[:, L].to(rdtype)[:, :, None, None]  # [H, M, 1, 1]
                Xr, Xi = X0r[:, 0].permute(1, 2, 0, 3), X0i[:, 0].permute(1, 2, 0, 3)  # [H, M, B, C]
                add_r, add_i = (Ur * Xr - Ui * Xi)[:, :, None], (Ur * Xi + Ui * Xr)[:, :, None]
                br = torch.cat([br[:, :, :1] + add_r, br[:, :, 1:]], dim=2)
                bi = torch.cat([bi[:, :, :1] + add_i, bi[:, :, 1:]], dim=2)
        Sr, Si = _decay_scan(br.reshape(H, M, NC, Bsz * Cn), bi.reshape(H, M, NC, Bsz * Cn), ll.map(lambda t: t * L),
                             ce if packed else None, rdtype)  # [H, M, NC, B·C]

        # 4. inter-chunk readout Re(Σ_m c̃_m λ_m^{p+1} S_{n-1}), for the tokens of the document that ran at n - 1
        Pr, Pi = _cmul(ct.re[:, None, :], ct.im[:, None, :], Vr[:, 1:], Vi[:, 1:])  # [H, L, M]
        P = torch.cat([Pr, -Pi], -1).to(rdtype)  # [H, L, 2M]: Re(P S) = Pr Sr - Pi Si
        Sp = F.pad(torch.cat([Sr, Si], 1)[:, :, :-1], (0, 0, 1, 0)).view(H, 2 * M, NC, Bsz, Cn)  # S_{n-1}, 0 at n = 0
        y_inter = torch.einsum("hpm,hmnxc->xnphc", P, Sp)  # [B, NC, L, H, C]
        if packed:
            prev = F.pad(ce[:-1], (1, 0), value=-1)
            y_inter = y_inter * (dc == prev[:, None]).to(rdtype)[None, :, :, None, None]
        y = y + y_inter

        # the initial-state term for the tokens of each document's first chunk: Re(Σ_m c̃_m λ_m^{pos+1} X0[m, :])
        if X0 is not None:
            X0c = torch.cat([X0r, X0i], dim=-2)  # [B, Nd, H, 2M, C]
            Y0 = torch.einsum("hpm,xihmc->xiphc", P, X0c)  # [B, Nd, L, H, C]
            if packed:
                t = torch.arange(Tp, device=dev)
                dt = tok_doc.clamp(max=n_docs - 1)
                first = ((tok_doc < n_docs) & (t // L == starts[dt] // L)).to(rdtype)
                idx = dt * L + (t - starts[dt]).clamp(0, L - 1)
                y0 = Y0.reshape(n_docs * L, H, Cn)[idx] * first[:, None, None]  # [Tp, H, C]
                y = y + y0.view(1, NC, L, H, Cn)
            else:
                y = torch.cat([y[:, :1] + Y0, y[:, 1:]], dim=1)

        # 5. final states per document: the partial chunk holding its last token, plus the state carried into it
        final = None
        if output_final_state:
            n_end, r_end = last // L, last % L  # [Nd]
            c0, o0 = starts // L, starts % L
            lag = r_end[:, None] - rows[None, :]  # [Nd, L]
            valid = lag >= 0
            if packed:
                valid = valid & (dc[n_end] == torch.arange(n_docs, device=dev)[:, None])
            lg = lag.clamp(min=0)
            Wfr, Wfi = _cmul(Bc.re[:, None, None, :], Bc.im[:, None, None, :], Vr[:, lg], Vi[:, lg])  # [H,Nd,L,M]
            vm = valid.to(rdtype)[None, :, :, None]
            Wf = torch.cat([Wfr, Wfi], -1).to(rdtype) * vm  # [H, Nd, L, 2M]
            fb = torch.einsum("hism,xishc->xihmc", Wf, z[:, n_end])  # [B, Nd, H, 2M, C]
            fr, fi = fb[..., :M, :], fb[..., M:, :]
            use_s = (c0 < n_end).to(rdtype)[None, :, None, None]  # [1, Nd, 1, 1]: started before its last chunk
            e = r_end + 1  # 1..L
            Er = (Vr[:, e].to(rdtype).transpose(0, 1)[None, ..., None]) * use_s[..., None]  # [1, Nd, H, M, 1]
            Ei = (Vi[:, e].to(rdtype).transpose(0, 1)[None, ..., None]) * use_s[..., None]
            Sg = torch.cat([Sr, Si], 1).index_select(2, (n_end - 1).clamp(min=0))  # [H, 2M, Nd, B·C]
            Sg = Sg.view(H, 2 * M, n_docs, Bsz, Cn).permute(3, 2, 0, 1, 4)  # [B, Nd, H, 2M, C]
            Sgr, Sgi = Sg[..., :M, :], Sg[..., M:, :]
            fr, fi = fr + Er * Sgr - Ei * Sgi, fi + Er * Sgi + Ei * Sgr
            if X0 is not None:
                e0 = (r_end - o0 + 1).clamp(1, L)
                keep = 1 - use_s[..., None]
                Gr = Vr[:, e0].to(rdtype).transpose(0, 1)[None, ..., None] * keep
                Gi = Vi[:, e0].to(rdtype).transpose(0, 1)[None, ..., None] * keep
                fr, fi = fr + Gr * X0r - Gi * X0i, fi + Gr * X0i + Gi * X0r
            final = torch.complex(fr.contiguous(), fi.contiguous()).to(cdtype)
            final = final[0] if packed else final[:, 0]

    return y.reshape(Bsz, Tp, H, Cn)[:, :T].to(out_dtype), final
