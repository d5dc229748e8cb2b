"""The suites with GPU results train their GDN and NAtS-L layers with the Triton buffer precision their results were
trained with (``GatedDeltaConfig.buffer_dtype``, passed as ``mixer_options.<gdn|natsl>.buffer_dtype``): the default
"auto" (bf16 buffers for bf16 activations) must not change what a later seed of a cell trains. A stored run config
(``cells/<cell>/seed<k>/config.yaml``) without the key trained with fp32 buffers; so did the suites whose results keep
no run configs."""

import warnings

import pytest
import torch
import yaml
from suite_runs import ROOT, WITH_GPU_RESULTS, lm_runs

from hybrid_attention.config.run_config import model_config
from hybrid_attention.experiments import load_suite
from hybrid_attention.layers import GatedDeltaNet, NatsLAttention
from hybrid_attention.models import HybridConfig, HybridForCausalLM
from hybrid_attention.ops.gated_delta.triton import config_with_buffers

GDN_MIXERS = ("gdn", "natsl")


def recorded_buffers(name: str) -> str:
    """The GDN buffer precision of the stored runs of ``results/<name>_gpu`` (one value for all of them)."""
    values = set()
    for p in (ROOT / "results" / f"{name}_gpu").glob("cells/*/seed*/config.yaml"):
        opts = ((yaml.safe_load(p.read_text())["model"].get("options") or {}).get("mixer_options") or {})
        values |= {(opts.get(m) or {}).get("buffer_dtype", "fp32") for m in GDN_MIXERS}
    assert len(values) <= 1, f"{name}: stored runs disagree on buffer_dtype: {values}"
    return values.pop() if values else "fp32"


def test_recorded_buffers_reads_the_stored_configs():
    assert recorded_buffers("credible_natsl") == "fp32"  # its five stored runs have no key: fp32
    assert recorded_buffers("credible_prose") == "fp32"  # no GDN layer: the default answer


def test_layers_take_the_pin_and_reject_a_typo():
    cfg = HybridConfig.from_preset("tiny", layers=["gdn", "natsl"],
                                   mixer_options={"gdn": {"buffer_dtype": "fp32"}, "natsl": {"buffer_dtype": "bf16"}})
    gdn, natsl = (layer.mixer for layer in HybridForCausalLM(cfg).model.layers)
    assert isinstance(gdn, GatedDeltaNet) and gdn.buffer_dtype == "fp32"
    assert isinstance(natsl, NatsLAttention) and natsl.buffer_dtype == "bf16"
    with pytest.raises(ValueError, match="buffer_dtype must be one of auto, fp32, bf16, got 'fp16'"):
        GatedDeltaNet(64, num_heads=2, head_dim=16, buffer_dtype="fp16")


@pytest.mark.parametrize("name", WITH_GPU_RESULTS)
def test_suites_with_gpu_results_pin_their_gdn_buffers(name):
    suite = load_suite(ROOT / "configs" / "experiments" / f"{name}.yaml")
    want = recorded_buffers(name)
    checked = 0
    for cell_name, seed, run in lm_runs(suite):  # recall cells train in fp32, where "auto" is fp32 buffers
        cfg = model_config(run.model, vocab_size=256)
        for mixer in set(cfg.mixer_types) & set(GDN_MIXERS):
            got = cfg.mixer_options.get(mixer, {}).get("buffer_dtype")
            assert got == want, f"{name}: cell {cell_name} seed {seed}: mixer_options.{mixer}.buffer_dtype " \
                                f"is {got!r}, its stored runs trained with {want!r}"
            checked += 1
    if name in ("credible_natsl", "natsl_vs_baselines"):
        assert checked, f"{name}: no GDN / NAtS-L layer checked"


def test_the_pin_traces_under_torch_compile():
    """The layers resolve the pin inside ``forward`` (``gated_delta(..., buffer_dtype=)``): Dynamo folds the lookup
    into a constant, with no graph break and no warning (a ``functools.cache`` there made it warn on the H200)."""
    def f(x):
        return x * (2.0 if config_with_buffers("fp32").buffer_dtype == "fp32" else 3.0)

    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = torch.compile(f, fullgraph=True, backend="eager")(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 2.0))
