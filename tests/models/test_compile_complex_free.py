"""The compiled training graphs of the S4D-only control and of Interdomain Attention hold no complex tensor.

Inductor generates no code for complex dtypes: each complex node of a compiled graph is an unfused eager kernel
(the H200 `small` s4d step was launch-bound on them). Counted by ``benchmarks/compile_graph_stats.py`` on a
2-layer model at toy widths, with the backend each mixer runs on the GPU (Toeplitz S4D on the CPU, Triton Interdomain on
CUDA or through the interpreter on a CPU machine), forward and backward, bf16 autocast as in training.
"""

from __future__ import annotations

import pytest
import triton_device

from benchmarks.compile_graph_stats import TINY, measure
from hybrid_attention.ops.interdomain.triton import HAS_TRITON


@pytest.mark.slow  # ~60 s per mixer on 2 CPU cores: inductor's C++ build of two graphs
@pytest.mark.parametrize("mixer", [
    "s4d",
    pytest.param("interdomain", marks=pytest.mark.skipif(not HAS_TRITON, reason="triton is not importable")),
])
def test_compiled_training_graph_has_no_complex_nodes(mixer):
    # the Triton op runs on the Triton tests' device (CUDA on a GPU machine); the Toeplitz S4D form on the CPU
    device = triton_device.DEVICE if mixer == "interdomain" else "cpu"
    stats = measure(mixer, batch=1, seq=32, device=device, **TINY)
    assert stats.graphs == 2, "one forward and one backward graph (no graph break)"
    assert (stats.complex_fwd, stats.complex_bwd) == (0, 0), stats.complex_ops
    assert stats.fallback == 0, "no ATen op left to run eagerly"
