"""The s4d FFT convolution as two custom ops under torch.compile: no FFT node reaches the compiler's graphs (CPU
inductor of torch 2.11 miscompiles ``aten._fft_r2c``), and the ops equal the autograd FFT form with its gradients."""

from __future__ import annotations

import torch

from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.ops.s4d.fft import _causal_convolve, fft_convolve, s4d_fft_convolve


def _inputs(dtype: torch.dtype, T: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2, T, 3, 4, generator=g, dtype=dtype, requires_grad=True)
    K = torch.randn(3, T, generator=g, dtype=dtype, requires_grad=True)
    return z, K


def test_ops_pass_opcheck() -> None:
    z, K = _inputs(torch.float32)
    torch.library.opcheck(s4d_fft_convolve, (z, K))
    dy = torch.randn(2, 13, 3, 4)
    torch.library.opcheck(torch.ops.hybrid_attention.s4d_fft_convolve_backward, (dy, z.detach(), K.detach()))


def test_op_equals_the_autograd_form_with_gradients() -> None:
    """float64, T = 1 and 13 (odd, FFT size 30): output, dz and dK equal the autograd FFT form to rounding; the
    custom backward passes gradcheck."""
    for T in (1, 13):
        z, K = _inputs(torch.float64, T)
        y_ref = _causal_convolve(z, K)
        y = s4d_fft_convolve(z, K)
        torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
        w = torch.randn_like(y)
        g_ref = torch.autograd.grad((y_ref * w).sum(), (z, K))
        g = torch.autograd.grad((y * w).sum(), (z, K))
        for a, b in zip(g, g_ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert torch.autograd.gradcheck(s4d_fft_convolve, _inputs(torch.float64, T))
    z, K = _inputs(torch.float64, 6)  # the definition: y[t] = Σ_{s<=t} K[t-s] z[s]
    y = torch.stack([sum(K[:, t - s][None, :, None] * z[:, s] for s in range(t + 1)) for t in range(6)], 1)
    torch.testing.assert_close(fft_convolve(z, K), y, rtol=1e-12, atol=1e-12)


def test_compiled_s4d_training_graphs_hold_no_fft_node() -> None:
    """A compiled training step of an fft-backend s4d model: the forward and backward ATen graphs call the two
    custom ops and hold no ``aten._fft_*`` node; loss and gradients equal eager's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=["s4d", "s4d"],
                                                       mixer_options={"s4d": {"backend": "fft"}})).train()
    ids = torch.randint(0, 259, (2, 32))
    targets: list[str] = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    def step(fn):
        model.zero_grad(set_to_none=True)
        loss = fn(ids, labels=ids).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    loss_e, g_e = step(model)
    torch._dynamo.reset()
    loss_c, g_c = step(torch.compile(model, backend=aot_autograd(fw_compiler=record, bw_compiler=record)))
    torch._dynamo.reset()
    assert not [t for t in targets if t.startswith("aten._fft")]
    assert any("s4d_fft_convolve.default" in t for t in targets)
    assert any("s4d_fft_convolve_backward.default" in t for t in targets)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=1e-6)
    for a, b in zip(g_c, g_e, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
