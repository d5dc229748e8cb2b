"""The all-chunks-at-once core of ``chunk_interdomain`` as one ``torch.autograd.Function`` with a closed-form backward
(``ChunkCore``): a few batched matmuls over every chunk each way and one scan over the chunks.

Layout: complex tensors do the elementwise work; every matmul runs on ``view_as_real`` of a complex tensor whose
mode axis M is last, read as a real axis of 2M interleaved (real, imaginary) entries (written Y^ below; a view, no
copy). The states are stored channel-major, [B, H, N, C, M], so that their key and value rows are such views too.
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


def _scan_(u: torch.Tensor, decay: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """In place: u[n] += decay ⊙ u[n ∓ 1] along the leading axis of u ``[N, B, H, C, M]`` (complex), from n = 1 up
    (from n = N-2 down when ``reverse``); decay ``[H, M]`` complex. Returns u."""
    d = decay[:, None, :]
    order = range(u.shape[0] - 2, -1, -1) if reverse else range(1, u.shape[0])
    step = 1 if reverse else -1
    for n in order:
        u[n].addcmul_(d, u[n + step])
    return u


class ChunkCore(torch.autograd.Function):
    """o and the entering states of every chunk (notation of ``chunk_interdomain``'s docstring), batched over chunks.

    forward(q, k, v, G, Din, P, E, x_init) -> (o ``[N, B, H, L, Dv]``, X0 of the last chunk ``[B, H, C, M]``
    complex) with q, k ``[N, B, H, L, R]``, v ``[N, B, H, L, Dv]`` (tokens in N whole chunks, zero-padded), G
    ``[H, L, L, M]`` and Din ``[H, L, M]`` complex, P ``[H, 2M, 2M]`` the readout as a real map of p^ (r^ = P p^),
    E = λ^L ``[H, M]`` complex and x_init ``[B, H, C, M]`` complex or None (C = R + Dv; states channel-major).

    Per chunk, with X0 the entering state (X0[0] = x_init, X0[n] = E ⊙ X0[n-1] + ΔX[n-1], ΔX = Σ_s z_s G[L-1, s]):
    S = q kᵀ, p = Σ_s S G + Din ⊙ (q X0^k), r = P p, W = Re Σ_m r G, o = W v + Re((r ⊙ Din) X0^vᵀ). Real parts of
    products are real matmuls of interleaved views: Re Σ_m x_m y_m = conj(x)^ · y^. The backward runs the same products
    transposed and the scan in reverse with conj(E). Gradients of complex tensors are ∂f/∂Re + i ∂f/∂Im (PyTorch's
    convention): y = E x gives g_x = conj(E) g_y and g_E = Σ g_y conj(x), and the gradient of a view Y^ is g_Y^.
    """

    @staticmethod
    def forward(ctx, q, k, v, G, Din, P, E, x_init):
        N, Bsz, H, L, R = q.shape
        Gr = interleave(G)  # [H, L, L, 2M]
        z = torch.cat([k, v], dim=-1)  # [N, B, H, L, C]
        # entering states: ΔX[n] = zᵀ G[L-1] (channel-major), then the scan over chunks
        u = torch.empty(N, Bsz, H, z.shape[-1], G.shape[-1], dtype=G.dtype, device=q.device)
        u[0] = 0 if x_init is None else x_init
        if N > 1:
            interleave(u[1:])[:] = z[: N - 1].transpose(-1, -2) @ Gr[:, L - 1]
        X0 = _scan_(u, E)  # [N, B, H, C, M]
        Xr = interleave(X0)  # [N, B, H, C, 2M]
        S = q @ k.transpose(-1, -2)  # [N, B, H, L, L]; G's zeros supply the causal mask
        a = _complex(q @ Xr[..., :R, :])  # q X0^k, [N, B, H, L, M]
        p = _complex(torch.einsum("nbhts,htsj->nbhtj", S, Gr)) + Din * a
        rc = _complex(interleave(p) @ _conj_rows(P).transpose(-1, -2))  # conj(r)
        W = torch.einsum("nbhtj,htsj->nbhts", interleave(rc), Gr)  # Re Σ_m r G
        ec = rc * Din.conj().resolve_conj()  # conj(r ⊙ Din)
        o = W @ v + interleave(ec) @ Xr[..., R:, :].transpose(-1, -2)
        ctx.save_for_backward(q, k, v, z, G, Din, P, E, S, X0, p, rc, ec, W, a)
        ctx.has_init = x_init is not None
        return o, X0[N - 1]

    @staticmethod
    def backward(ctx, go, g_last):
        q, k, v, z, G, Din, P, E, S, X0, p, rc, ec, W, a = ctx.saved_tensors
        N, Bsz, H, L, R = q.shape
        Gr, Xr = interleave(G), interleave(X0)
        din_c = Din.conj().resolve_conj()
        # o = W v + ec^ Xv^ᵀ
        gW = go @ v.transpose(-1, -2)
        gv = W.transpose(-1, -2) @ go
        g_ec = _complex(go @ Xr[..., R:, :])
        # ec = rc ⊙ conj(Din), W = rc^ · G^, rc^ = conj_rows(P) p^
        g_rc = _complex(torch.einsum("nbhts,htsj->nbhtj", gW, Gr)) + g_ec * Din
        gp = _complex(interleave(g_rc) @ _conj_rows(P))
        gP = _conj_rows(torch.einsum("nbhti,nbhtj->hij", interleave(g_rc), interleave(p)))
        # p = S · G^ + Din ⊙ a
        g_din = (g_ec.conj() * rc + gp * a.conj()).sum((0, 1))
        gpr = interleave(gp)
        gS = torch.einsum("nbhtj,htsj->nbhts", gpr, Gr)
        gG = _complex(torch.einsum("nbhts,nbhtj->htsj", torch.cat([gW, S]), torch.cat([interleave(rc), gpr])))
        # S = q kᵀ, a^ = q Xk^; the states' gradients conjugated (gc = conj g), which the scan below runs on
        gq = gS @ k + interleave(gp * din_c) @ Xr[..., :R, :].transpose(-1, -2)
        gk = gS.transpose(-1, -2) @ q
        gc_a = gp.conj() * Din
        e = ec.conj().resolve_conj()  # r ⊙ Din
        gc_X0 = _complex(torch.cat([q.transpose(-1, -2) @ interleave(gc_a), go.transpose(-1, -2) @ interleave(e)],
                                   dim=-2))  # [N, B, H, C, M]
        if g_last is not None:
            gc_X0[N - 1] += g_last.conj()
        hc = _scan_(gc_X0, E, reverse=True)  # conj of the total gradient of each X0[n]
        g_init = hc[0].conj().resolve_conj() if ctx.has_init else None
        gE = torch.zeros_like(E)
        if N > 1:  # ΔX[n]^ = z[n]ᵀ G^[L-1] feeds X0[n+1]: Re Σ_m G conj(h) = conj(G)^ · hc^
            hr = interleave(hc[1:])  # [N-1, B, H, C, 2M]
            gz = interleave(G[:, L - 1].conj().resolve_conj()) @ hr.transpose(-1, -2)  # [N-1, B, H, L, C]
            gG[:, L - 1] += _complex(torch.einsum("nbhsc,nbhcj->hsj", z[: N - 1], hr)).conj()
            gk[: N - 1] += gz[..., :R]
            gv[: N - 1] += gz[..., R:]
            gE = hc[1:].mul_(X0[:-1]).sum((0, 1, 3)).conj()  # Σ h conj(X0[n-1]) (hc is not read after this)
        return gq, gk, gv, gG, g_din, gP, gE, g_init
