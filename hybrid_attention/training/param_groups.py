"""AdamW parameter groups following the Interdomain paper's recipe (spec §4.2): a capped, undecayed SSM group."""

from __future__ import annotations

from torch import nn

from hybrid_attention.modules import HeadRMSNorm, RMSNorm, S4DCore

SSM_LR_CAP = 1e-3


def _ssm_param_ids(model: nn.Module) -> set[int]:
    ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, S4DCore):
            ids.update(id(p) for p in module.parameters())
        # The SSM-input norms of Interdomain / S4D layers live next to an S4DCore.
        if isinstance(getattr(module, "ssm", None), S4DCore):
            for name in ("key_norm", "value_norm"):
                norm = getattr(module, name, None)
                if norm is not None:
                    ids.update(id(p) for p in norm.parameters())
    return ids


def ssm_param_groups(model: nn.Module, lr: float, weight_decay: float) -> list[dict]:
    """AdamW param groups: [ssm, no_decay, decay] (empty groups dropped). Every trainable parameter appears once.

    - "ssm": the S4D core (Δ, A, B, C) and the gains/biases of the SSM-input norms (Eq. 12); lr = min(lr, 1e-3), no
      weight decay.
    - "no_decay": every other norm gain, bias, embedding and 1-D parameter; weight decay 0.
    - "decay": all remaining matrices; weight decay ``weight_decay``.

    Each group carries its ``name`` and an ``lr_scale`` relative to the base lr so that a scheduler that scales the
    base lr keeps the cap: the ssm group's lr_scale is min(1, 1e-3 / lr).

    DECISION: the paper names norms, Δ, A and C; B is not named and goes into the ssm group too (it is an SSM
    parameter of the same scale and would otherwise be decayed towards 0, which switches the mode off).

    Args:
        model: the model whose trainable parameters are grouped.
        lr: the base learning rate.
        weight_decay: the weight decay of the "decay" group.
    """
    ssm_ids = _ssm_param_ids(model)
    no_decay_ids: set[int] = set()
    for module in model.modules():
        if isinstance(module, (RMSNorm, HeadRMSNorm, nn.Embedding)):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    groups = {"ssm": [], "no_decay": [], "decay": []}
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in ssm_ids:
            groups["ssm"].append(p)
        elif id(p) in no_decay_ids or p.dim() < 2 or getattr(p, "_no_weight_decay", False):
            groups["no_decay"].append(p)
        else:
            groups["decay"].append(p)
    scale = min(1.0, SSM_LR_CAP / lr) if lr > 0 else 1.0
    spec = {
        "ssm": dict(lr=lr * scale, weight_decay=0.0, lr_scale=scale),
        "no_decay": dict(lr=lr, weight_decay=0.0, lr_scale=1.0),
        "decay": dict(lr=lr, weight_decay=weight_decay, lr_scale=1.0),
    }
    return [dict(name=k, params=v, **spec[k]) for k, v in groups.items() if v]
