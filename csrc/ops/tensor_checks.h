// The checks every op makes of the tensors it is given, with the words its errors use (the argument's name, what
// was expected, what was given), and the small layout helpers they share.
#pragma once

#include <array>

#include <ATen/ATen.h>

#include "core/graph_key.h"

namespace tcf {

// The activation argument of the conv ops: 0 (none), 1 (ReLU) or 2 (ReLU6), else an error naming it.
Activation activation_from(int64_t value);
// The activation argument of the BatchNorm ops: those, 3 (SiLU), 4 (Hardswish) or 5 (LeakyReLU).
Activation batch_norm_activation_from(int64_t value);
// y = activation(y) in place, as eager computes it (F.relu, F.relu6, F.silu, F.hardswish, F.leaky_relu with
// negative_slope, which the others ignore).
void apply_activation_(at::Tensor& y, Activation activation, double negative_slope);
// The gradient through ReLU or ReLU6 from its output y (F.relu: threshold_backward; F.relu6: hardtanh_backward,
// whose mask on the output is the one on the input); grad_y itself without an activation.
at::Tensor activation_backward(const at::Tensor& grad_y, const at::Tensor& y, Activation activation);
// The gradient through SiLU, Hardswish or LeakyReLU from its input, as eager's backward computes it (silu_backward,
// hardswish_backward, leaky_relu_backward with negative_slope).
at::Tensor activation_backward_from_input(const at::Tensor& grad_y, const at::Tensor& input, Activation activation,
                                          double negative_slope);

// float16, bfloat16 or float32 (a tensor's dtype, or a dtype argument).
void check_supported_dtype(at::ScalarType dtype, const char* name);
void check_supported_dtype(const at::Tensor& t, const char* name);
// A CUDA tensor of 4 dimensions (`layout` names them in the message) in a supported dtype.
void check_4d_cuda(const at::Tensor& t, const char* name, const char* layout = "[N, C, H, W]");
// On x's device, in x's dtype.
void check_like(const at::Tensor& t, const char* name, const at::Tensor& x);
// On x's device, in x's dtype, of x's shape.
void check_same_as(const at::Tensor& t, const char* name, const at::Tensor& x);

// The four sizes of a 4-D tensor.
std::array<int64_t, 4> size4(at::IntArrayRef size);
// PyTorch's rule for cuDNN convolutions (cudnn_conv_suggest_memory_format): channels_last when either operand is.
bool use_channels_last(const at::Tensor& a, const at::Tensor& b);
at::MemoryFormat memory_format(bool channels_last);
// Whether t belongs to a tracer (FakeTensor or another Python subclass, functionalization, vmap, grad transforms):
// its data cannot be read or written by our kernels.
bool is_traced(const at::Tensor& t);
// The byte alignment (capped at 16) of t's data for a cache key; 0 for an absent or empty tensor.
int8_t alignment_of(const at::Tensor& t);
// t in `dtype`: t itself where it is in it already (.to() is a dispatcher call even where it returns its input).
inline at::Tensor in_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

}  // namespace tcf
