"""The eager (non-registered) autograd path of a diagonal-SSM Triton op, for a non-default config or launch hooks: the
registered custom ops always run the default configuration (what ``torch.compile`` sees); this
``torch.autograd.Function`` runs the same host implementations with the config and hooks as arguments and reuses the
op's own ``setup_context`` and gradient rule, so the two paths cannot drift apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["eager_function"]


def eager_function(
    fwd_impl: Callable[..., Any],
    bwd_impl: Callable[..., Any],
    setup_context: Callable[[Any, tuple, Any], None],
    grads: Callable[..., tuple],
) -> type[torch.autograd.Function]:
    """An autograd Function whose ``apply(cfg, hooks, *inputs)`` returns ``fwd_impl(*inputs, cfg=cfg, hooks=hooks)``.

    ``inputs`` are the registered forward op's arguments; ``setup_context(ctx, inputs, output)`` is the op's own, and
    ``grads(ctx, *grad_outputs, bwd=...)`` its gradient rule, called with ``bwd = bwd_impl(..., cfg=cfg, hooks=hooks)``
    in place of the registered backward op (it returns one gradient per input).
    """

    class EagerOp(torch.autograd.Function):
        @staticmethod
        def forward(cfg, hooks, *inputs):
            return fwd_impl(*inputs, cfg=cfg, hooks=hooks)

        @staticmethod
        def setup_context(ctx, inputs, output):
            cfg, hooks, *op_inputs = inputs
            setup_context(ctx, tuple(op_inputs), output)
            ctx.launch = (cfg, hooks)

        @staticmethod
        def backward(ctx, *grad_outputs):
            cfg, hooks = ctx.launch
            bwd = functools.partial(bwd_impl, cfg=cfg, hooks=hooks)
            return (None, None, *grads(ctx, *grad_outputs, bwd=bwd))

    EagerOp.__name__ = EagerOp.__qualname__ = f"Eager_{getattr(fwd_impl, '__name__', 'op')}"
    return EagerOp
