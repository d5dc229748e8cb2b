"""AdamW over the model's parameter groups: SSM group with capped lr and no decay; no decay on norms and embeddings."""

from __future__ import annotations

import torch
from torch import nn

from hybrid_attention.config.run_config import OptimSection
from hybrid_attention.training.param_groups import ssm_param_groups


def build_optimizer(model: nn.Module, cfg: OptimSection) -> torch.optim.AdamW:
    """AdamW with ``ssm_param_groups``; fused/foreach left to PyTorch's defaults for the device."""
    groups = ssm_param_groups(model, cfg.lr, cfg.weight_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
