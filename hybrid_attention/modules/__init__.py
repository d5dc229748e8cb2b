"""Small building blocks shared by the token mixers."""

from hybrid_attention.modules.conv import ShortConvolution
from hybrid_attention.modules.mlp import SwiGLU, swiglu_hidden_size
from hybrid_attention.modules.norm import HeadRMSNorm, RMSNorm, l2_normalize, rms_norm
from hybrid_attention.modules.rotary import RotaryEmbedding
from hybrid_attention.modules.s4d import S4DCore

__all__ = [
    "HeadRMSNorm",
    "RMSNorm",
    "RotaryEmbedding",
    "S4DCore",
    "ShortConvolution",
    "SwiGLU",
    "l2_normalize",
    "rms_norm",
    "swiglu_hidden_size",
]
