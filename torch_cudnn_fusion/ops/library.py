"""The Python half of the cudnn_fusion ops: fake kernels, so torch.compile traces through them.

Schemas and CUDA kernels live in csrc/ops/; the ops' autograd in csrc/ops/*_autograd.cpp.
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
    """PyTorch's rule for cuDNN convolutions: channels_last when either operand is (as csrc/ops/conv_ops.cpp)."""
    if torch.channels_last in (suggest_memory_format(a), suggest_memory_format(b)):
        return torch.channels_last
    return torch.contiguous_format


def _empty(size, like: torch.Tensor, memory_format: torch.memory_format, dtype=None) -> torch.Tensor:
    return torch.empty(size, dtype=dtype or like.dtype, device=like.device, memory_format=memory_format)


def _fake_conv_bias_act(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, activation,
                        policy=0):
    torch._check(x.dim() == 4, lambda: f"cudnn_fusion: x must be a 4-D tensor [N, C, H, W], got {x.dim()}-D")
    torch._check(
        x.shape[1] == weight.shape[1] * groups,
        lambda: f"cudnn_fusion: x has {x.shape[1]} channels but weight of shape {list(weight.shape)} "
        f"with groups={groups} expects {weight.shape[1] * groups}",
    )
    size = conv_output_size(x.shape, weight.shape, stride, padding_pre, padding_post, dilation)
    return _empty(size, x, conv_memory_format(x, weight))


def _fake_relu_bias_backward(grad_out, out, activation=1, policy=0):
    return _empty(out.shape, out, suggest_memory_format(out)), out.new_empty(out.shape[1])


def _fake_conv_dgrad(grad_z, weight, x_size, stride, padding_pre, padding_post, dilation, groups, policy=0):
    return _empty(x_size, grad_z, conv_memory_format(grad_z, weight))


def _fake_conv_wgrad(grad_z, x, weight_size, stride, padding_pre, padding_post, dilation, groups, policy=0,
                     out_dtype=None):
    return _empty(weight_size, grad_z, conv_memory_format(x, grad_z), out_dtype)


def _fake_batch_norm_act(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation,
                         implementation, policy=0, negative_slope=0.01):
    torch._check(x.dim() == 4, lambda: f"cudnn_fusion: x must be a 4-D tensor [N, C, H, W], got {x.dim()}-D")
    channels = x.shape[1]
    stats = channels if running_mean is not None else 0
    return (
        _empty(x.shape, x, suggest_memory_format(x)),
        x.new_empty(channels, dtype=torch.float32),
        x.new_empty(channels, dtype=torch.float32),
        x.new_empty(stats, dtype=torch.float32),
        x.new_empty(stats, dtype=torch.float32),
        x.new_empty(0, dtype=torch.uint8),  # the legacy API's reserve: its size is cuDNN's, only known at run time
    )


def _fake_batch_norm_act_update(x, weight, bias, running_mean, running_var, num_batches_tracked, residual, momentum,
                                eps, activation, implementation, policy=0, negative_slope=0.01):
    y, save_mean, save_invstd, _, _, reserve = _fake_batch_norm_act(x, weight, bias, running_mean, running_var,
                                                                    residual, momentum, eps, activation,
                                                                    implementation)
    return y, save_mean, save_invstd, reserve  # the running statistics and the count are updated in place


def _fake_batch_norm_act_backward(grad_y, x, y, weight, bias, save_mean, save_invstd, reserve, eps, activation,
                                  has_residual, implementation, policy=0, negative_slope=0.01):
    memory_format = suggest_memory_format(x)
    grad_residual = _empty(x.shape, x, memory_format) if has_residual else x.new_empty(0)
    return (_empty(x.shape, x, memory_format), grad_residual, weight.new_empty(weight.shape),
            bias.new_empty(bias.shape))


def _fake_batch_norm_act_backward_reduce(grad_y, x, y, weight, bias, save_mean, save_invstd, activation,
                                         negative_slope=0.01):
    return _empty(x.shape, x, torch.channels_last), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def _fake_batch_norm_act_backward_reduce_(grad_y, x, y, weight, bias, save_mean, save_invstd, activation,
                                          negative_slope=0.01):
    return weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def _fake_batch_norm_act_backward_(grad_y, x, weight, bias, save_mean, save_invstd, activation, negative_slope=0.01):
    return weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def _fake_batch_norm_backward_dx(grad_z, x, weight, bias, save_mean, save_invstd, grad_weight, grad_bias):
    return _empty(x.shape, x, torch.channels_last)


def _fake_conv_batch_norm_act(x, conv_weight, conv_bias, stride, padding, dilation, groups, weight, bias, running_mean,
                              running_var, num_batches_tracked, residual, momentum, eps, activation, implementation,
                              conv_dtype=None, policy=0, negative_slope=0.01):
    z = _fake_conv_bias_act(x, conv_weight, conv_bias, None, stride, padding, padding, dilation, groups, 0)
    z = z.to(conv_dtype) if conv_dtype is not None else z
    y, save_mean, save_invstd, _, _, reserve = _fake_batch_norm_act(z, weight, bias, running_mean, running_var,
                                                                    residual, momentum, eps, activation,
                                                                    implementation)
    return y, z, save_mean, save_invstd, reserve  # the running statistics and the count are updated in place


def _fake_space_to_depth(x, padding_pre, out_size, dtype=None):
    channels = 8 if x.shape[1] <= 2 else 16
    return _empty([x.shape[0], channels, *out_size], x, torch.channels_last, dtype or x.dtype)


def _fake_stem_filter(weight, index, inverse, kernel, channels, dtype=None):
    return _empty([weight.shape[0], channels, *kernel], weight, torch.channels_last, dtype)


def _fake_stem_filter_backward(grad, inverse, weight_size, weight_dtype):
    return _empty(weight_size, grad, torch.channels_last, weight_dtype)


def _fake_stem_conv_bias_act(x, weight, bias, residual, index, inverse, form, activation, policy=0, conv_dtype=None):
    # form: as stem.StemPlan.form gives it (padding before, the rearranged input's size, the filter's, its channels)
    dtype = conv_dtype or weight.dtype
    x_form = _fake_space_to_depth(x, form[0:2], form[2:4], dtype)
    weight_form = _fake_stem_filter(weight, index, inverse, form[4:6], form[6], dtype)
    return _fake_conv_bias_act(x_form, weight_form, bias, residual, (1, 1), (0, 0), (0, 0), (1, 1), 1, activation)


def _fake_stem_conv_batch_norm_act(x, conv_weight, conv_bias, index, inverse, form, weight, bias, running_mean,
                                   running_var, num_batches_tracked, residual, momentum, eps, activation,
                                   implementation, conv_dtype=None, policy=0, negative_slope=0.01):
    dtype = conv_dtype or x.dtype
    x_form = _fake_space_to_depth(x, form[0:2], form[2:4], dtype)
    weight_form = _fake_stem_filter(conv_weight, index, inverse, form[4:6], form[6], dtype)
    return _fake_conv_batch_norm_act(x_form, weight_form, conv_bias, (1, 1), (0, 0), (1, 1), 1, weight, bias,
                                     running_mean, running_var, num_batches_tracked, residual, momentum, eps,
                                     activation, implementation, conv_dtype)


def register_python_parts() -> None:
    """Registers the fake kernels once the compiled module has defined the ops."""
    global _registered
    if _registered:
        return
    torch.library.register_fake("cudnn_fusion::conv_bias_act")(_fake_conv_bias_act)
    torch.library.register_fake("cudnn_fusion::relu_bias_backward")(_fake_relu_bias_backward)
    torch.library.register_fake("cudnn_fusion::conv_dgrad")(_fake_conv_dgrad)
    torch.library.register_fake("cudnn_fusion::conv_wgrad")(_fake_conv_wgrad)
    torch.library.register_fake("cudnn_fusion::batch_norm_act")(_fake_batch_norm_act)
    torch.library.register_fake("cudnn_fusion::batch_norm_act_update")(_fake_batch_norm_act_update)
    torch.library.register_fake("cudnn_fusion::batch_norm_act_backward")(_fake_batch_norm_act_backward)
    torch.library.register_fake("cudnn_fusion::batch_norm_act_backward_reduce")(_fake_batch_norm_act_backward_reduce)
    torch.library.register_fake("cudnn_fusion::batch_norm_act_backward_reduce_")(
        _fake_batch_norm_act_backward_reduce_)
    torch.library.register_fake("cudnn_fusion::batch_norm_act_backward_")(_fake_batch_norm_act_backward_)
    torch.library.register_fake("cudnn_fusion::batch_norm_backward_dx")(_fake_batch_norm_backward_dx)
    torch.library.register_fake("cudnn_fusion::conv_batch_norm_act")(_fake_conv_batch_norm_act)
    torch.library.register_fake("cudnn_fusion::space_to_depth")(_fake_space_to_depth)
    torch.library.register_fake("cudnn_fusion::stem_filter")(_fake_stem_filter)
    torch.library.register_fake("cudnn_fusion::stem_filter_backward")(_fake_stem_filter_backward)
    torch.library.register_fake("cudnn_fusion::stem_conv_bias_act")(_fake_stem_conv_bias_act)
    torch.library.register_fake("cudnn_fusion::stem_conv_batch_norm_act")(_fake_stem_conv_batch_norm_act)
    _registered = True
