"""The fused ops as functions (conv2d_bias_act, batch_norm_act, conv2d_batch_norm_act), how each call is decided
(decide.py), the state a layer keeps (layer_call.py), and the Python half of the op library (library.py)."""

from .batch_norm import batch_norm_act, conv2d_batch_norm_act
from .conv import conv2d_bias_act
from .layer_call import LayerCall

__all__ = ["LayerCall", "batch_norm_act", "conv2d_batch_norm_act", "conv2d_bias_act"]
