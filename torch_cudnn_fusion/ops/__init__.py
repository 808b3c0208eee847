"""The fused ops as functions (conv2d_bias_act, batch_norm_act, conv2d_batch_norm_act), how each call is decided,
and the Python half of the cudnn_fusion op library (fake kernels)."""

from .functional import batch_norm_act, conv2d_batch_norm_act, conv2d_bias_act

__all__ = ["batch_norm_act", "conv2d_batch_norm_act", "conv2d_bias_act"]
