"""The Python half of the cudnn_fusion ops: fake kernels (for torch.compile) and autograd.

Schemas and CUDA kernels live in csrc/bindings.cpp. The forward op saves only x, weight and (with ReLU) its own
output y: backward takes the ReLU mask from y, so no mask or pre-activation is kept.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch._prims_common import suggest_memory_format

_registered = False


def conv_output_size(
    x_size: Sequence[int],
    w_size: Sequence[int],
    stride: Sequence[int],
    padding_pre: Sequence[int],
    padding_post: Sequence[int],
    dilation: Sequence[int],
) -> list[int]:
    out = [x_size[0], w_size[0]]
    for i in range(2):
        extent = x_size[2 + i] + padding_pre[i] + padding_post[i]
        window = dilation[i] * (w_size[2 + i] - 1) + 1
        out.append((extent - window) // stride[i] + 1)
    return out


def conv_memory_format(a: torch.Tensor, b: torch.Tensor) -> torch.memory_format:
    """PyTorch's rule for cuDNN convolutions: channels_last when either operand is (as csrc/conv_ops.cpp)."""
    if torch.channels_last in (suggest_memory_format(a), suggest_memory_format(b)):
        return torch.channels_last
    return torch.contiguous_format


def _empty(size, like: torch.Tensor, memory_format: torch.memory_format, dtype=None) -> torch.Tensor:
    return torch.empty(size, dtype=dtype or like.dtype, device=like.device, memory_format=memory_format)


def _fake_conv_bias_act(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, relu):
    torch._check(x.dim() == 4, lambda: f"cudnn_fusion: x must be a 4-D tensor [N, C, H, W], got {x.dim()}-D")
    torch._check(
        x.shape[1] == weight.shape[1] * groups,
        lambda: f"cudnn_fusion: x has {x.shape[1]} channels but weight of shape {list(weight.shape)} "
        f"with groups={groups} expects {weight.shape[1] * groups}",
    )
    size = conv_output_size(x.shape, weight.shape, stride, padding_pre, padding_post, dilation)
    return _empty(size, x, conv_memory_format(x, weight))


def _fake_relu_bias_backward(grad_out, out):
    return _empty(out.shape, out, suggest_memory_format(out)), out.new_empty(out.shape[1])


def _fake_conv_dgrad(grad_z, weight, x_size, stride, padding_pre, padding_post, dilation, groups):
    return _empty(x_size, grad_z, conv_memory_format(grad_z, weight))


def _fake_conv_wgrad(grad_z, x, weight_size, stride, padding_pre, padding_post, dilation, groups):
    return _empty(weight_size, grad_z, conv_memory_format(x, grad_z))


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, relu = inputs
    ctx.save_for_backward(x, weight, output if relu else None)
    ctx.conv_args = (list(stride), list(padding_pre), list(padding_post), list(dilation), groups)
    ctx.relu = relu


def _backward(ctx, grad_out):
    x, weight, out = ctx.saved_tensors
    need_x, need_w, need_bias, need_residual = ctx.needs_input_grad[:4]
    ops = torch.ops.cudnn_fusion
    grad_bias = None
    if ctx.relu:
        # One graph: ReLU backward with the mask from y, fused with the bias-gradient reduction.
        grad_z, grad_bias = ops.relu_bias_backward(grad_out, out)
    else:
        grad_z = grad_out
        if need_bias:
            grad_bias = grad_out.sum((0, 2, 3), dtype=torch.float32).to(grad_out.dtype)
    grad_x = ops.conv_dgrad(grad_z, weight, list(x.shape), *ctx.conv_args) if need_x else None
    grad_w = ops.conv_wgrad(grad_z, x, list(weight.shape), *ctx.conv_args) if need_w else None
    return (
        grad_x,
        grad_w,
        grad_bias if need_bias else None,
        grad_z if need_residual else None,
        None,
        None,
        None,
        None,
        None,
        None,
    )


def register_python_parts() -> None:
    """Registers fakes and autograd once the compiled module has defined the ops."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("cudnn_fusion::conv_bias_act")(_fake_conv_bias_act)
    torch.library.register_fake("cudnn_fusion::relu_bias_backward")(_fake_relu_bias_backward)
    torch.library.register_fake("cudnn_fusion::conv_dgrad")(_fake_conv_dgrad)
    torch.library.register_fake("cudnn_fusion::conv_wgrad")(_fake_conv_wgrad)
    torch.library.register_autograd("cudnn_fusion::conv_bias_act", _backward, setup_context=_setup_context)
    _registered = True
