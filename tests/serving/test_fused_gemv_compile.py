"""The compiled step with the fused decode GEMVs (`StaticDecoder(fused_gemv=True)`) is one Dynamo graph for the
whole model, whatever the layer count: no graph break, no recompile over steps, the registered ops traced once per
call site (not a frame per layer). Guard for the H200 report (the fused variant of `benchmarks.profile_decode` did
not finish within ~300 s while the plain one compiled in well under a minute); on the CPU both compile in seconds
(gdn-340m widths, 1/2/4 layers, one graph each, the fused inductor compile no slower than the plain one),
so this pins what the CPU can check. The kernels run on the GPU when there is one, else in the interpreter."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from test_static_decode import KERNEL_DEVICE, make_model
from torch._dynamo.utils import counters

from hybrid_attention.serving import StaticDecoder


@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("fused", [False, True])
@torch.no_grad()
def test_fused_step_compiles_to_one_graph(layers, fused):
    # on the GPU when there is one (the kernels refuse CPU tensors outside the interpreter), else in the interpreter
    model = make_model(["gdn", "softmax", "gdn"][:layers], dtype=torch.float32).to(KERNEL_DEVICE)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    dec = StaticDecoder(model, 1, 16, use_kernels=True, compile=False, fused_gemv=fused)
    assert dec.fused_mlp == fused
    ref = StaticDecoder(model, 1, 16, use_kernels=True, compile=False, fused_gemv=fused)
    dec._run = torch.compile(dec._own_step_impl(), backend=backend, fullgraph=True, dynamic=False)
    ids = torch.randint(0, 259, (1, 8), device=KERNEL_DEVICE)
    dec.prefill(ids[:, :5])
    ref.prefill(ids[:, :5])
    torch._dynamo.reset()
    counters.clear()
    for i in range(5, 8):
        assert torch.allclose(dec.step(ids[:, i:i + 1]), ref.step(ids[:, i:i + 1]), atol=1e-5, rtol=0)
    assert len(graphs) == 1, f"{len(graphs)} graphs for {layers} layers"
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    ops = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    names = [str(t) for t in ops if "hybrid_attention" in str(t)]
    fused_calls = sum(("norm_linear" in n) or ("linear_residual" in n) for n in names)
    assert fused_calls == (2 * layers + 1 if fused else 0), names
    torch._dynamo.reset()
