"""No op keeps a tensor in a module global: the kernel layers' forward and backward leave none behind.

Why: a tensor cached in a module global (e.g. a float64 ``arange``) that is made for the first time inside a
CUDA-graph warm-up (``torch.compile(mode="reduce-overhead")``) lives in the graph's memory pool untracked, and the
capture fails on the H200 ("tensor(s) in the cudagraph pool not tracked as outputs"). CUDA graphs do not
exist on this CPU, so the property the failure broke is what is tested: after a training step of every layer with a
Triton backend (the interpreter here), no ``hybrid_attention`` module holds a tensor in its globals, directly or in a
plain container (weak containers, such as RoPE's decode tables, free their tensors with their last user).
"""

from __future__ import annotations

import sys
import weakref

import pytest
import torch

from hybrid_attention.layers import GatedDeltaNet, InterdomainAttention, NatsLAttention, S4DBilinearMixer

pytest.importorskip("triton")

D, C = 32, 16  # the Triton kernels take chunk_size in {16, 32, 64, 128}

LAYERS = {
    "interdomain": lambda: InterdomainAttention(D, num_heads=2, head_dim=16, state_size=8, chunk_size=C,
                                                backend="triton"),
    "interdomain-real": lambda: InterdomainAttention(D, num_heads=2, head_dim=16, state_size=8, chunk_size=C,
                                                     readout="real", backend="triton"),
    "s4d_bilinear": lambda: S4DBilinearMixer(D, num_heads=2, head_dim=16, state_size=8, chunk_size=C,
                                             backend="triton"),
    "gdn": lambda: GatedDeltaNet(D, num_heads=2, head_dim=16, expand_v=2, chunk_size=C, backend="triton"),
    "natsl": lambda: NatsLAttention(D, 2, 16, expand_v=2, num_attn_heads=4, chunk_size=C, backend="triton"),
}


def _tensors_in(value, depth: int = 2) -> int:
    """Tensors held strongly by ``value``: itself, or inside plain dicts / lists / tuples / sets up to ``depth``."""
    if isinstance(value, torch.Tensor):
        return 1
    if depth == 0 or isinstance(value, (weakref.WeakValueDictionary, weakref.WeakKeyDictionary, weakref.WeakSet)):
        return 0
    if isinstance(value, dict):
        return sum(_tensors_in(v, depth - 1) + _tensors_in(k, depth - 1) for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return sum(_tensors_in(v, depth - 1) for v in value)
    return 0


def _tensor_globals() -> dict[str, int]:
    found = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("hybrid_attention") or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if (n := _tensors_in(value)):
                found[f"{name}.{attr}"] = n
    return found


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_training_step_leaves_no_tensor_in_module_globals(name, device):
    before = _tensor_globals()
    torch.manual_seed(0)
    layer = LAYERS[name]().to(device)
    x = torch.randn(2, 2 * C + 5, D, device=device, requires_grad=True)  # T not a multiple of the chunk
    y, _ = layer(x)
    y.pow(2).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    new = {k: n for k, n in _tensor_globals().items() if before.get(k) != n}
    assert not new, f"{name}: tensors kept in module globals (break CUDA-graph capture): {new}"


def test_the_scan_finds_a_cached_tensor(monkeypatch):
    """The check itself can fail: a module-level dict holding a tensor, as the old power-table cache, is reported."""
    import hybrid_attention.ops.common.triton.ssm_scan as ssm_scan

    monkeypatch.setattr(ssm_scan, "_PROBE_CACHE", {(4, "cpu"): torch.arange(4.0)}, raising=False)
    assert _tensor_globals().get("hybrid_attention.ops.common.triton.ssm_scan._PROBE_CACHE") == 1
