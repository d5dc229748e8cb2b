"""``selected_first`` (ops/common/order.py) against the stable sort it replaces."""

import pytest
import torch

from hybrid_attention.ops.common.order import selected_first


@pytest.mark.parametrize("shape,dim", [((7,), -1), ((3, 1), -1), ((2, 5, 4), 1), ((2, 3, 513), -1), ((4, 0), -1)])
@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_selected_first_matches_stable_sort(shape, dim, density):
    g = torch.Generator().manual_seed(sum(shape) + int(10 * density))
    mask = torch.rand(shape, generator=g) < density
    want = torch.sort((~mask).to(torch.uint8), dim=dim, stable=True).indices
    got = selected_first(mask, dim=dim)
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_selected_first_of_a_transposed_view():
    mask = torch.rand(5, 9, generator=torch.Generator().manual_seed(1)) < 0.5
    view = mask.t()  # non-contiguous input
    want = torch.sort((~view).to(torch.uint8), dim=-1, stable=True).indices
    torch.testing.assert_close(selected_first(view), want, rtol=0, atol=0)
