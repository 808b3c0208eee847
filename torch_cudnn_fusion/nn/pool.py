"""The global average pool a fused model runs in place of nn.AdaptiveAvgPool2d(1) / F.adaptive_avg_pool2d(x, 1).

ATen computes that pool as x.mean((2, 3)), and its backward spreads the gradient as grad.expand(x's sizes) / (H*W).
The expanded tensor's strides over H and W are 0, which leaves its layout ambiguous, and ATen's elementwise kernels
then keep the dimensions' order: the gradient comes back NCHW whatever x's layout. A fused conv + BatchNorm layer
before the pool, whose backward reads channels_last, then transposes it: MobileNet v1's last layer (256 x 1024 x
7 x 7 bf16) took 0.024 ms for the division and 0.047 ms for the transpose on H100.

For a channels_last CUDA x, fused models call cudnn_fusion::global_avg_pool (csrc/ops/pool_ops.cpp): eager's forward,
and a backward that divides by H*W into a channels_last tensor of its own, as one copy. Both properties matter:
- a mean taken in x's NHWC view (x.permute(0, 2, 3, 1).mean((1, 2))) also gives a channels_last gradient, but as a
  permuted view of the division's result, which shares its storage with its base: the fused BatchNorm backward
  could not write its result over it, and allocated another tensor of x's size (resnet50's step peaked 1 MiB above
  eager's, H200, 2026-11-26). Nor could it over a tensor made in a Python autograd.Function's backward: 26 of v1's
  27 layers wrote in place, against 27 with ATen's pool;
- F.avg_pool2d over the whole image gives a channels_last tensor of its own, but ATen's NHWC backward kernel took
  0.199 ms for v1's last layer on H200, against 0.071 there for the division and the transpose it replaces.
Elsewhere (CPU, NCHW, no extension) the pool is F.adaptive_avg_pool2d itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import _extension
from .._compile import constant_under_compile


def is_global(output_size) -> bool:
    """Whether an adaptive average pool of this output_size is the global one (1, or (1, 1))."""
    if isinstance(output_size, int):
        return output_size == 1
    return isinstance(output_size, (tuple, list)) and len(output_size) == 2 and tuple(output_size) == (1, 1)


@constant_under_compile
def _has_pool_op() -> bool:
    return _extension.load() is not None


def global_avg_pool2d(x: torch.Tensor) -> torch.Tensor:
    """F.adaptive_avg_pool2d(x, 1): the same output, its gradient channels_last for a channels_last CUDA x (see the
    module docstring)."""
    if (x.is_cuda and x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
            and _has_pool_op()):
        return torch.ops.cudnn_fusion.global_avg_pool.default(x)
    return F.adaptive_avg_pool2d(x, 1)


class GlobalAvgPool2d(nn.AdaptiveAvgPool2d):
    """nn.AdaptiveAvgPool2d(1) whose forward is global_avg_pool2d: a channels_last input gets its gradient back
    channels_last. fuse() puts it in place of every nn.AdaptiveAvgPool2d(1) of the fused model."""

    def __init__(self, output_size=1) -> None:
        if not is_global(output_size):
            raise ValueError(f"output_size must be 1 or (1, 1) (the global pool), got {output_size!r}")
        super().__init__(output_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return global_avg_pool2d(x)
