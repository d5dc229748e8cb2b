"""The Triton GEMV kernels of `norm_linear`, `add_norm_linear` and `linear_residual`. Imports triton: imported only
through ``..triton`` (guarded)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# DECISION: fuse each decode GEMV with its neighbours. At decode batch sizes (B <= 8) a step is a chain of small
# kernels, each with a fixed launch-and-ramp cost inside the CUDA graph (gdn-340m on the H200 at 1.13 ms/token
# against a 0.16 ms weight-streaming floor, ~47 µs per layer for ~8–10 kernels). The MLP half of a block is four of
# them after inductor's fusion (mixer residual add + RMSNorm, gate|up GEMV, SiLU·mul, down GEMV; the down residual add
# folded into the next block's norm); with these kernels it is two.
# - One program per block of BLOCK_N output columns, looping over K in BLOCK_K chunks, fp32 accumulation (float64 for
#   float64 inputs); the B rows are handled inside the program, so the weights are read once for all of them. The
#   product is a broadcast multiply and a sum over K, not tl.dot: B is tiny (tl.dot needs every dimension >= 16), and
#   a GEMV is bound by the weight stream, not by arithmetic.
# - The norm is the GEMV's prologue: every program re-reads the B rows of x (a few KB, L2 resident) and computes their
#   mean square itself, instead of a separate norm launch and a normed copy in memory. The SwiGLU is the epilogue: a
#   program owns matching gate and up columns (the decoder's gate|up weight is [gate; up], modules/mlp.py).
# - `add_norm_linear` also folds the preceding residual add (h = h + mixer output) into the prologue: every program
#   recomputes h for its norm and program 0 writes it out (the residual stream the down projection adds to); otherwise
#   the add is one more kernel between the mixer and the MLP.
# - The kernels round where the plain step rounds (the normed x, the gain product, gate, up, silu and the GEMV output
#   in the input dtype), so the kernel and plain steps differ only by the order of the K sums.
# - eps is a constexpr (no runtime float argument: the interpreter and the compiled launch see the same kernel).
# - Both kernels are registered custom ops (``hybrid_attention::norm_linear``, ``hybrid_attention::linear_residual``,
#   with fake kernels) so that a compiled decode step traces around them, as ops/decode_attention does.

# The broadcast product of one K chunk is [BLOCK_B, BLOCK_N, BLOCK_K] values held by the program's threads: this many
# per program keeps it at 64 fp32 registers a thread with 4 warps (the SwiGLU kernel holds two: gate and up).
_PRODUCT_BUDGET = 8192



def block_sizes(b: int, n_out: int, k: int, products: int, block_n: int | None) -> tuple[int, int, int]:
    """(BLOCK_B, BLOCK_N, BLOCK_K) for b rows, n_out output columns, reduction size k and `products` weight tiles a
    step. DECISION: BLOCK_N aims at >= 128 programs (one per H200 SM, 132) where n_out allows, in [16, 128]: a GEMV
    is a weight stream, and fewer programs than SMs leave bandwidth idle (gdn-340m: gate|up 2816 columns -> 176
    programs of 16; the down projection's 1024 -> 64 programs of 16, a split-K variant would fill the rest)."""
    bb = triton.next_power_of_2(b)
    if block_n is None:
        block_n = max(16, min(128, 1 << max(0, (n_out // 128).bit_length() - 1)))
    bk = _PRODUCT_BUDGET // (products * bb * block_n)
    bk = max(16, min(256, bk, triton.next_power_of_2(k)))
    return bb, block_n, bk


@triton.jit
def _input_rows(x_ptr, r_ptr, ob, kk, xm, sxb, srb, ACC: tl.constexpr, HAS_RES: tl.constexpr):
    """The [BLOCK_B, BLOCK_K] input tile at columns kk in ACC: x, or h = x + residual rounded to x's dtype (the
    residual add of the plain step) when HAS_RES; xm masks the rows and columns."""
    xdt = x_ptr.dtype.element_ty
    xv = tl.load(x_ptr + ob[:, None] * sxb + kk[None, :], mask=xm, other=0.0).to(ACC)
    if HAS_RES:
        rv = tl.load(r_ptr + ob[:, None] * srb + kk[None, :], mask=xm, other=0.0).to(ACC)
        xv = (xv + rv).to(xdt).to(ACC)
    return xv


@triton.jit
def _norm_linear_kernel(x_ptr, r_ptr, h_ptr, nw_ptr, w_ptr, y_ptr, B, K, N_OUT, sxb, srb, shb, syb,
                        EPS: tl.constexpr, SWIGLU: tl.constexpr, HAS_RES: tl.constexpr, ACC: tl.constexpr,
                        BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[:, cols] = act(RMSNorm(x) W[cols]ᵀ) for this program's BLOCK_N columns (SWIGLU: gate columns `cols` and up
    columns `cols + N_OUT`, combined as silu(gate) * up). Every program re-reads the B rows of x (a few KB, L2
    resident) and computes their norm itself: no extra launch, no normed copy in memory. HAS_RES: x is first
    replaced by h = x + residual (rounded to x.dtype, as the plain step's add), which program 0 also stores."""
    pid = tl.program_id(0)
    ob = tl.arange(0, BLOCK_B)
    bm = ob < B
    on = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = on < N_OUT
    ok = tl.arange(0, BLOCK_K)
    xdt = x_ptr.dtype.element_ty
    ydt = y_ptr.dtype.element_ty
    # pass 1: the mean square of each row (in ACC: float32, float64 for float64 inputs, as modules/norm.py)
    ss = tl.zeros([BLOCK_B], dtype=ACC)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ok
        km = kk < K
        xm = bm[:, None] & km[None, :]
        xv = _input_rows(x_ptr, r_ptr, ob, kk, xm, sxb, srb, ACC, HAS_RES)
        if HAS_RES:
            # program 0 writes h (a tensor comparison: the interpreter refuses a mask combined with a scalar bool)
            hm = xm & (ob[:, None] * 0 + pid == 0)
            tl.store(h_ptr + ob[:, None] * shb + kk[None, :], xv.to(h_ptr.dtype.element_ty), mask=hm)
        ss += tl.sum(xv * xv, 1)
    rstd = 1.0 / tl.sqrt(ss / K + EPS)
    # pass 2: the GEMV over the normed rows; the weights of a column block are read once for all B rows
    acc_g = tl.zeros([BLOCK_B, BLOCK_N], dtype=ACC)
    acc_u = tl.zeros([BLOCK_B, BLOCK_N], dtype=ACC)
    rows_g = on.to(tl.int64) * K
    rows_u = (on + N_OUT).to(tl.int64) * K
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ok
        km = kk < K
        xm = bm[:, None] & km[None, :]
        xv = _input_rows(x_ptr, r_ptr, ob, kk, xm, sxb, srb, ACC, HAS_RES)
        gain = tl.load(nw_ptr + kk, mask=km, other=0.0).to(xdt).to(ACC)
        # RMSNorm.forward's rounding points: the normed x in x.dtype, then times the gain in x.dtype
        h = ((xv * rstd[:, None]).to(xdt).to(ACC) * gain[None, :]).to(xdt).to(ACC)
        wm = nm[:, None] & km[None, :]
        wg = tl.load(w_ptr + rows_g[:, None] + kk[None, :], mask=wm, other=0.0).to(ACC)
        acc_g += tl.sum(h[:, None, :] * wg[None, :, :], 2)
        if SWIGLU:
            wu = tl.load(w_ptr + rows_u[:, None] + kk[None, :], mask=wm, other=0.0).to(ACC)
            acc_u += tl.sum(h[:, None, :] * wu[None, :, :], 2)
    if SWIGLU:
        # SwiGLU.forward_fused's rounding points: gate and up in the output dtype, silu(gate) too, then the product
        g = acc_g.to(ydt).to(ACC)
        s = (g / (1.0 + tl.exp(-g))).to(ydt).to(ACC)
        y = s * acc_u.to(ydt).to(ACC)
    else:
        y = acc_g
    tl.store(y_ptr + ob[:, None] * syb + on[None, :], y.to(ydt), mask=bm[:, None] & nm[None, :])


@triton.jit
def _linear_residual_kernel(x_ptr, w_ptr, r_ptr, y_ptr, B, K, N, sxb, srb, syb, ACC: tl.constexpr,
                            BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[:, cols] = residual[:, cols] + x W[cols]ᵀ for this program's BLOCK_N columns."""
    pid = tl.program_id(0)
    ob = tl.arange(0, BLOCK_B)
    bm = ob < B
    on = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    nm = on < N
    ok = tl.arange(0, BLOCK_K)
    ydt = y_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=ACC)
    rows = on.to(tl.int64) * K
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ok
        km = kk < K
        xv = tl.load(x_ptr + ob[:, None] * sxb + kk[None, :], mask=bm[:, None] & km[None, :], other=0.0).to(ACC)
        wv = tl.load(w_ptr + rows[:, None] + kk[None, :], mask=nm[:, None] & km[None, :], other=0.0).to(ACC)
        acc += tl.sum(xv[:, None, :] * wv[None, :, :], 2)
    om = bm[:, None] & nm[None, :]
    r = tl.load(r_ptr + ob[:, None] * srb + on[None, :], mask=om, other=0.0).to(ACC)
    # `h + down_proj(a)`'s rounding points: the product in the output dtype, then the sum
    y = r + acc.to(ydt).to(ACC)
    tl.store(y_ptr + ob[:, None] * syb + on[None, :], y.to(ydt), mask=om)


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [B, K] with unit stride along K (rows may be strided)."""
    return x if x.stride(-1) == 1 else x.contiguous()


@torch.library.custom_op("hybrid_attention::norm_linear", mutates_args=())
def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, eps: float,
                act: str | None = None, block_n: int | None = None) -> torch.Tensor:
    """x [B, K] (B <= 8), norm_weight [K], weight [N, K] contiguous -> y [B, N] (act None) or [B, N // 2] (act
    "swiglu"), in x.dtype. One launch. A registered custom op (fake kernel below): a compiled decode step treats it
    as one opaque call. Shapes are checked by the dispatcher (``..norm_linear``)."""
    return _launch_norm_linear(x, None, norm_weight, weight, eps, act, block_n)[0]


def _launch_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                        weight: torch.Tensor, eps: float, act: str | None,
                        block_n: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one launch of `norm_linear` / `add_norm_linear`: (y [B, N or N // 2], h = x + residual [B, K] or None)."""
    x = _rows(x)
    b, k = x.shape
    swiglu = act == "swiglu"
    n_out = weight.shape[0] // 2 if swiglu else weight.shape[0]
    y = torch.empty(b, n_out, device=x.device, dtype=x.dtype)
    h = None if residual is None else torch.empty_like(x)
    r = x if residual is None else _rows(residual)
    bb, bn, bk = block_sizes(b, n_out, k, 2 if swiglu else 1, block_n)
    _norm_linear_kernel[(triton.cdiv(n_out, bn),)](
        x, r, y if h is None else h, norm_weight.contiguous(), weight, y, b, k, n_out, x.stride(0), r.stride(0),
        k, y.stride(0), EPS=float(eps), SWIGLU=swiglu, HAS_RES=residual is not None, ACC=_acc(x.dtype),
        BLOCK_B=bb, BLOCK_N=bn, BLOCK_K=bk, num_warps=4,
    )
    return y, h


@norm_linear.register_fake
def _(x, norm_weight, weight, eps, act=None, block_n=None):
    return x.new_empty(x.shape[0], weight.shape[0] // 2 if act == "swiglu" else weight.shape[0])


@torch.library.custom_op("hybrid_attention::add_norm_linear", mutates_args=())
def add_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor,
                    eps: float, act: str | None = None,
                    block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`norm_linear` of h = x + residual (x, residual [B, K]), also returning h: (h [B, K], y). One launch (the
    residual add of the previous sub-block folded into this GEMV's prologue; program 0 writes h)."""
    y, h = _launch_norm_linear(x, residual, norm_weight, weight, eps, act, block_n)
    return h, y


@add_norm_linear.register_fake
def _(x, residual, norm_weight, weight, eps, act=None, block_n=None):
    n_out = weight.shape[0] // 2 if act == "swiglu" else weight.shape[0]
    return x.new_empty(x.shape), x.new_empty(x.shape[0], n_out)


@torch.library.custom_op("hybrid_attention::linear_residual", mutates_args=())
def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                    block_n: int | None = None) -> torch.Tensor:
    """x [B, K] (B <= 8), weight [N, K] contiguous, residual [B, N] -> residual + x Wᵀ [B, N] in residual.dtype.
    One launch; a registered custom op like `norm_linear`."""
    x = _rows(x)
    residual = _rows(residual)
    b, k = x.shape
    n = weight.shape[0]
    y = torch.empty(b, n, device=x.device, dtype=residual.dtype)
    bb, bn, bk = block_sizes(b, n, k, 1, block_n)
    _linear_residual_kernel[(triton.cdiv(n, bn),)](
        x, weight, residual, y, b, k, n, x.stride(0), residual.stride(0), y.stride(0), ACC=_acc(x.dtype),
        BLOCK_B=bb, BLOCK_N=bn, BLOCK_K=bk, num_warps=4,
    )
    return y


@linear_residual.register_fake
def _(x, weight, residual, block_n=None):
    return residual.new_empty(residual.shape)
