"""The S4D-core mixers' parameter layout and seeded outputs are fixed: checkpoints keep loading and a seed keeps its
model (state_dict keys and shapes in order, parameter counts, a float64 forward of the naive ops)."""

import pytest
import torch

from hybrid_attention.layers import InterdomainAttention, S4DBilinearMixer, S4DMixer

_SHARED = [("key_norm.weight", (2, 8)), ("key_norm.bias", (2, 8)), ("value_norm.weight", (2, 8)),
           ("value_norm.bias", (2, 8)), ("ssm.log_dt", (2,)), ("ssm.A_log_re", (2, 6)), ("ssm.A_im", (2, 6)),
           ("ssm.B", (16,)), ("ssm.C", (2, 6, 6, 2))]
_GENERIC = [("proj.a.weight", (16, 32)), ("proj.b.weight", (16, 32)), ("convs.a.weight", (16, 1, 4)),
            ("convs.b.weight", (16, 1, 4))]

# cls -> (state_dict keys and shapes in order, parameter count, (Σ y, Σ y², y[1, -1, :3])) of `_seeded`
CASES = {
    InterdomainAttention: (
        [("proj.q.weight", (16, 32)), ("proj.k.weight", (16, 32)), ("proj.v.weight", (16, 32)),
         ("convs.q.weight", (16, 1, 4)), ("convs.k.weight", (16, 1, 4)), *_SHARED, ("o_proj.weight", (32, 16))],
        2426,
        (0.06513306000045808, 0.005452505393561532, [0.0005364378402249739, 0.0045320755855757025,
                                                      -0.00120183898697463]),
    ),
    S4DMixer: (
        [("contraction_w", (2, 6)), *_GENERIC, *_SHARED, ("o_proj.weight", (32, 32))],
        2438,
        (1.3597970620695596, 0.2596446180803211, [0.005247556156294857, 0.048342957126174806,
                                                  0.039575268499370576]),
    ),
    S4DBilinearMixer: (
        [*_GENERIC, *_SHARED, ("c_out.weight", (16, 16)), ("o_proj.weight", (32, 16))],
        2170,
        (0.03153763124380182, 0.0005547823515706774, [0.0023862766959398154, -0.001409876817743862,
                                                      -0.0004505310071014101]),
    ),
}


def _seeded(cls: type) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = cls(32, 2, 8, state_size=6, chunk_size=5, backend="naive").double()
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    return layer, layer(x)[0]


@pytest.mark.parametrize("cls", list(CASES), ids=lambda c: c.__name__)
def test_state_dict_layout_and_seeded_output(cls):
    keys, count, (total, square, tail) = CASES[cls]
    layer, y = _seeded(cls)
    assert [(k, tuple(v.shape)) for k, v in layer.state_dict().items()] == keys
    assert sum(p.numel() for p in layer.parameters()) == count
    assert y.sum().item() == pytest.approx(total, rel=1e-9, abs=1e-12)
    assert y.square().sum().item() == pytest.approx(square, rel=1e-9)
    assert y[1, -1, :3].tolist() == pytest.approx(tail, rel=1e-9, abs=1e-12)


def test_s4d_controls_are_not_interdomain_layers():
    # the S4D-only controls share the S4D core with Interdomain Attention; they are not query-readout layers
    assert not issubclass(S4DMixer, InterdomainAttention)
    assert not issubclass(S4DBilinearMixer, InterdomainAttention)
