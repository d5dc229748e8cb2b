"""torch.compile of a whole model (reference ops, CPU inductor) runs and matches eager."""

import shutil

import pytest
import torch

from hybrid_attention.models import HybridConfig, HybridForCausalLM


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="inductor needs a C compiler")
def test_compiled_model_matches_eager():
    torch.manual_seed(0)
    model = HybridForCausalLM(HybridConfig.from_preset("tiny", layers=["interdomain", "softmax"])).eval()
    ids = torch.randint(0, 259, (1, 40))
    ref = model(ids, use_cache=False).logits
    out = torch.compile(model)(ids, use_cache=False).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
