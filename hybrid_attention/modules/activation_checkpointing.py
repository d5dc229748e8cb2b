"""Activation checkpointing of the decoder blocks (``train.checkpointing: true``), behind the model's HF hooks
(``gradient_checkpointing_enable`` and the like)."""

from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["enable_block_checkpointing", "disable_block_checkpointing", "checkpointed_blocks"]


def _checkpointed_forward(self, h: torch.Tensor, state=None, output_state: bool = False,
                          cu_seqlens: torch.Tensor | None = None):
    plain = type(self).forward
    if self.training and torch.is_grad_enabled():
        return checkpoint(plain, self, h, state, output_state, cu_seqlens, use_reentrant=False)
    return plain(self, h, state, output_state, cu_seqlens)


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    inner = getattr(model, "model", model)  # HybridForCausalLM -> HybridModel
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no decoder blocks (.model.layers or .layers)")
    return list(layers)


def enable_block_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Run every decoder block of ``model`` (a HybridForCausalLM or HybridModel) under activation checkpointing
    while training. Idempotent; returns ``model``. Call before wrapping (DDP / FSDP2) or compiling.

    The model's HF hooks (``gradient_checkpointing_enable`` / ``activation_checkpointing_enable`` and their ``disable``)
    call the functions here. This rebinds each ``HybridBlock.forward`` on the instance: in training mode with autograd
    recording, the block runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (its activations are
    recomputed in the backward, the RNG state is restored for the recomputation); in eval mode or under ``no_grad`` it
    is the plain forward. The weights, the state dict and the module tree are unchanged (checkpoints and HF exports are
    the same with or without it).
    """
    for blk in _blocks(model):
        blk.forward = types.MethodType(_checkpointed_forward, blk)  # deepcopy rebinds it to the copy
    return model


def disable_block_checkpointing(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`enable_block_checkpointing`."""
    for blk in _blocks(model):
        blk.__dict__.pop("forward", None)
    return model


def checkpointed_blocks(model: torch.nn.Module) -> int:
    """How many decoder blocks run under checkpointing."""
    return sum(getattr(blk.__dict__.get("forward"), "__func__", None) is _checkpointed_forward
               for blk in _blocks(model))
