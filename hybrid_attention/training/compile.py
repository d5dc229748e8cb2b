"""``train.compile``: how the trainer (and ``bench train``) hands the model to ``torch.compile``, in one of two
scopes (``train.compile_scope``: the whole model or each decoder block)."""

from __future__ import annotations

from typing import get_args

import torch
from torch import nn

from hybrid_attention.config.run_config import CompileScope

from .distributed import unwrap

__all__ = ["COMPILE_SCOPES", "compile_model"]

COMPILE_SCOPES: tuple[str, ...] = get_args(CompileScope)


def compile_model(model: nn.Module, scope: str = "blocks", mode: str | None = None,
                  backend: str = "inductor") -> nn.Module:
    """Compile ``model`` (a HybridForCausalLM, possibly DDP-wrapped) in place for ``scope`` with torch.compile ``mode``
    (None: the default mode) and ``backend``. Returns ``model``. Call after activation checkpointing and wrapping.

    Scopes (``train.compile_scope``):

    * ``"model"``: the whole ``HybridForCausalLM`` as one compiled region (``model.compile``): every layer is inlined
      into one graph, so the compile time grows with the depth. H200: the first 50 steps of a credible (8-layer
      `small`) run take 70 s for Interdomain and 57 s for S4D where 50 steady-state steps take 6 s and 3 s, so about
      55–65 s of each 175–275 s run is compilation.
    * ``"blocks"`` (regional compilation): each decoder block is compiled on its own (``HybridBlock.compile``) and so
      is the loss (``HybridForCausalLM.compute_loss``: the float32 cast and cross-entropy, the largest tensors of a
      step). Blocks of the same mixer have the same code and guards, so Dynamo compiles one graph per distinct block
      and reuses it for every layer. The embedding, the final norm and the LM head matmul run eagerly, and nothing
      fuses across a block boundary. CPU (tiny preset, 8 layers, inductor, first forward + backward): softmax 40.0 s
      -> 6.0 s, Interdomain 17.0 s -> 3.2 s, same loss; the H200 step time is measured by ``bench train``'s
      ``compiled+blocks`` rows.

    Both scopes compile with static shapes (``dynamic=False``): training uses one (batch, length); evaluation at
    other lengths runs eager (``evaluate_lm`` sets the "force_eager" stance).

    Args:
        model: a ``HybridForCausalLM``, possibly DDP-wrapped.
        scope: "model" or "blocks".
        mode: the torch.compile mode, or None for the default.
        backend: the torch.compile backend.
    """
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"compile scope must be one of {', '.join(COMPILE_SCOPES)}, got {scope!r}")
    if scope == "model":
        model.compile(dynamic=False, mode=mode, backend=backend)
        return model
    lm = unwrap(model)
    for blk in lm.model.layers:
        blk.compile(dynamic=False, mode=mode, backend=backend)
    # an instance attribute shadows the method: forward's self.compute_loss(...) calls the compiled region
    lm.compute_loss = torch.compile(lm.compute_loss, dynamic=False, mode=mode, backend=backend)
    return model
