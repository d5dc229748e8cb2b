"""The all-chunks-at-once core of ``chunk_interdomain`` as one ``torch.autograd.Function`` with a closed-form backward
(``ChunkCore``): a few batched matmuls over every chunk each way and one scan over the chunks.

Layout: chunks batched as [N, B, H, ...]; complex tensors do the elementwise work, and every matmul runs on
``interleave`` of a complex tensor (mode axis M last, read as 2M interleaved real entries: Y^ below, a view). The
entering states are channel-major, key and value channels apart ([N, B, H, R, M], [N, B, H, Dv, M]).
"""

from __future__ import annotations

import torch

__all__ = ["ChunkCore", "interleave"]


def interleave(x: torch.Tensor) -> torch.Tensor:
    """Y^: a complex tensor [..., M] as real [..., 2M] (real, imaginary) pairs (a view when x is contiguous)."""
    return torch.view_as_real(x).flatten(-2)


def _complex(x: torch.Tensor) -> torch.Tensor:
    """The inverse of ``interleave``: real [..., 2M] -> complex [..., M] (a view of a contiguous x)."""
    return torch.view_as_complex(x.unflatten(-1, (-1, 2)))


def _conj_rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2M, K] with its imaginary rows (odd row index) negated: P -> the map of p^ to conj(r)^ (r^ = P p^)."""
    return (x.unflatten(-2, (-1, 2)) * x.new_tensor([1.0, -1.0])[:, None]).flatten(-3, -2)


def _per_head(x: torch.Tensor) -> torch.Tensor:
    """[N, B, H, L, K] -> [H, N·B·L, K] (a copy): the rows of each head, for a matmul with a per-head matrix."""
    return x.permute(2, 0, 1, 3, 4).reshape(x.shape[2], -1, x.shape[-1])


def _from_per_head(x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """The inverse of ``_per_head``: [H, N·B·L, K] -> [N, B, H, L, K] (``shape`` without K; a view)."""
    n, b, h, length = shape[:4]
    return x.view(h, n, b, length, x.shape[-1]).permute(1, 2, 0, 3, 4)


def _scan_(us: tuple[torch.Tensor, ...], decay: torch.Tensor, reverse: bool = False,
           dot: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor | None:
    """In place, for each u ``[N, B, H, C, M]`` (complex) of ``us``: u[n] += decay ⊙ u[n ∓ 1] along the leading axis,
    from n = 1 up (from n = N-2 down when ``reverse``); decay ``[H, M]`` complex.

    ``dot`` (only with ``reverse``): one x per u, of u's shape; returns Σ_{n>=1, b, c} u[n] ⊙ x[n-1] ``[H, M]`` over
    the scanned u (summed over ``us``), accumulated while each u[n] is fresh (None without ``dot``)."""
    d = decay[:, None, :]
    n_chunks = us[0].shape[0]
    order = range(n_chunks - 2, -1, -1) if reverse else range(1, n_chunks)
    step = 1 if reverse else -1
    acc = [torch.zeros_like(u[0]) for u in us] if dot is not None else None
    for n in order:
        for i, u in enumerate(us):
            u[n].addcmul_(d, u[n + step])
            if acc is not None:  # reverse: u[n + 1] is final, the term of n + 1 >= 1
                acc[i].addcmul_(u[n + 1], dot[i][n])
    return None if acc is None else sum(a.sum((0, 2)) for a in acc)


class ChunkCore(torch.autograd.Function):
    """o and the entering states of every chunk (notation of ``chunk_interdomain``'s docstring), batched over chunks.

    forward(q, k, v, G, Din, P, E, x_init) -> (o ``[N, B, H, L, Dv]``, X0 of the last chunk ``[B, H, C, M]``
    complex) with q, k ``[N, B, H, L, R]``, v ``[N, B, H, L, Dv]`` (tokens in N whole chunks, zero-padded), G
    ``[H, L, L, M]`` and Din ``[H, L, M]`` complex, P ``[H, 2M, 2M]`` the readout as a real map of p^ (r^ = P p^),
    E = λ^L ``[H, M]`` complex and x_init ``[B, H, C, M]`` complex or None (C = R + Dv; states channel-major).

    Per chunk, with X0 the entering state (X0[0] = x_init, X0[n] = E ⊙ X0[n-1] + ΔX[n-1], ΔX = Σ_s z_s G[L-1, s]):
    S = q kᵀ, p = Σ_s S G + Din ⊙ (q X0^k), r = P p, W = Re Σ_m r G, o = W v + Re((r ⊙ Din) X0^vᵀ). Real parts of
    products are real matmuls of interleaved views: Re Σ_m x_m y_m = conj(x)^ · y^. The backward runs the same products
    transposed, and the scan in reverse on the conjugated state gradients (gc = conj g: then the decay is E itself and
    no state-sized tensor is conjugated). Gradients of complex tensors are ∂f/∂Re + i ∂f/∂Im (PyTorch's convention):
    y = E x gives g_x = conj(E) g_y and g_E = Σ g_y conj(x), and the gradient of a view Y^ is g_Y^.
    """

    @staticmethod
    def forward(ctx, q, k, v, G, Din, P, E, x_init):
        N, Bsz, H, L, R = q.shape
        Gr = interleave(G)  # [H, L, L, 2M]
        gl = Gr[:, L - 1]  # [H, L, 2M]: λ^{L-1-s} B̄, the weight of token s in the state a chunk leaves
        # entering states: X0[0] = x_init, ΔX[n] = zᵀ G[L-1] (channel-major), then the scan over chunks
        states = []
        for x, lo, hi in ((k, 0, R), (v, R, None)):
            u = torch.empty(N, Bsz, H, x.shape[-1], G.shape[-1], dtype=G.dtype, device=q.device)
            u[0] = 0 if x_init is None else x_init[:, :, lo:hi]
            if N > 1:
                torch.matmul(x[: N - 1].transpose(-1, -2), gl, out=interleave(u[1:]))
            states.append(u)
        Xk, Xv = states
        _scan_((Xk, Xv), E)
        S = q @ k.transpose(-1, -2)  # [N, B, H, L, L]; G's zeros supply the causal mask
        a = _complex(q @ interleave(Xk))  # q X0^k, [N, B, H, L, M]
        p = _complex(torch.einsum("nbhts,htsj->nbhtj", S, Gr)) + Din * a
        p_h = _per_head(interleave(p))  # [H, N·B·L, 2M]
        rc = _complex(_from_per_head(p_h @ _conj_rows(P).transpose(-1, -2), q.shape).contiguous())  # conj(r)
        W = torch.einsum("nbhtj,htsj->nbhts", interleave(rc), Gr)  # Re Σ_m r G
        ec = rc * Din.conj().resolve_conj()  # conj(r ⊙ Din)
        o = W @ v + interleave(ec) @ interleave(Xv).transpose(-1, -2)
        ctx.save_for_backward(q, k, v, G, Din, P, E, S, Xk, Xv, p_h, rc, ec, W, a)
        ctx.has_init = x_init is not None
        return o, torch.cat([Xk[N - 1], Xv[N - 1]], dim=-2)

    @staticmethod
    def backward(ctx, go, g_last):
        q, k, v, G, Din, P, E, S, Xk, Xv, p_h, rc, ec, W, a = ctx.saved_tensors
        N, Bsz, H, L, R = q.shape
        Gr = interleave(G)
        # o = W v + ec^ Xv^ᵀ
        gW = go @ v.transpose(-1, -2)
        gv = W.transpose(-1, -2) @ go
        g_ec = _complex(go @ interleave(Xv))
        # ec = rc ⊙ conj(Din), W = rc^ · G^, rc^ = conj_rows(P) p^
        g_rc = _complex(torch.einsum("nbhts,htsj->nbhtj", gW, Gr)) + g_ec * Din
        g_rc_h = _per_head(interleave(g_rc))
        gp = _complex(_from_per_head(g_rc_h @ _conj_rows(P), q.shape).contiguous())
        gP = _conj_rows(g_rc_h.transpose(-1, -2) @ p_h)
        # p = S · G^ + Din ⊙ a
        g_din = (g_ec.conj() * rc + gp * a.conj()).sum((0, 1))
        gpr = interleave(gp)
        gS = torch.einsum("nbhtj,htsj->nbhts", gpr, Gr)
        gG = _complex(torch.einsum("nbhts,nbhtj->htsj", torch.cat([gW, S]), torch.cat([interleave(rc), gpr])))
        # S = q kᵀ, a^ = q Xk^; the states' gradients conjugated (gc = conj g), which the scan below runs on
        gq = gS @ k + interleave(gp * Din.conj()) @ interleave(Xk).transpose(-1, -2)
        gk = gS.transpose(-1, -2) @ q
        gc_k = _complex(q.transpose(-1, -2) @ interleave(gp.conj() * Din))  # [N, B, H, R, M]
        gc_v = _complex(go.transpose(-1, -2) @ interleave(ec.conj().resolve_conj()))  # [N, B, H, Dv, M]
        if g_last is not None:
            gc_k[N - 1] += g_last[:, :, :R].conj()
            gc_v[N - 1] += g_last[:, :, R:].conj()
        # conj of the total gradient of each X0[n]; gE = Σ g_{X0[n]} conj(X0[n-1]) = conj(Σ gc[n] X0[n-1])
        gE = _scan_((gc_k, gc_v), E, reverse=True, dot=(Xk, Xv)).conj()
        g_init = torch.cat([gc_k[0], gc_v[0]], dim=-2).conj().resolve_conj() if ctx.has_init else None
        if N > 1:  # ΔX[n]^ = x[n]ᵀ G^[L-1] feeds X0[n+1]: Re Σ_m G conj(g) = conj(G)^ · gc^
            glc = interleave(G[:, L - 1].conj().resolve_conj())  # [H, L, 2M]
            g_gl = 0
            for x, gx, hc in ((k, gk, gc_k), (v, gv, gc_v)):
                hr = interleave(hc[1:])  # [N-1, B, H, C, 2M]
                gx[: N - 1] += glc @ hr.transpose(-1, -2)
                g_gl = g_gl + (x[: N - 1] @ hr).sum((0, 1))
            gG[:, L - 1] += _complex(g_gl).conj()
        return gq, gk, gv, gG, g_din, gP, gE, g_init
