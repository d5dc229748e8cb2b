"""Small building blocks shared by the token mixers."""

from hybrid_attention.modules.conv import ShortConvolution, short_conv, short_conv_step
from hybrid_attention.modules.fused_linear import (
    FusedInputs,
    concat_conv_weights,
    concat_linear_weights,
    fuse_inputs,
    linear_weights,
    project_inputs,
)
from hybrid_attention.modules.mlp import SwiGLU, swiglu_hidden_size
from hybrid_attention.modules.norm import HeadRMSNorm, RMSNorm, l2_normalize, rms_norm
from hybrid_attention.modules.rotary import RotaryEmbedding
from hybrid_attention.modules.s4d import S4DCore

__all__ = [
    "FusedInputs",
    "HeadRMSNorm",
    "RMSNorm",
    "RotaryEmbedding",
    "S4DCore",
    "ShortConvolution",
    "SwiGLU",
    "concat_conv_weights",
    "concat_linear_weights",
    "fuse_inputs",
    "l2_normalize",
    "linear_weights",
    "project_inputs",
    "rms_norm",
    "short_conv",
    "short_conv_step",
    "swiglu_hidden_size",
]
