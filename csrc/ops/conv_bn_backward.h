// The conv inside the training conv + BatchNorm op (csrc/ops/bn_autograd.cpp, ConvFunction): its forward in our
// depthwise kernel where that runs faster than PyTorch's, and its backward, with dx and dweight in our kernels or GEMMs
// where they run faster than PyTorch's convolution_backward.
#pragma once

#include <array>
#include <tuple>

#include <ATen/ATen.h>

namespace tcf {

// The weight gradient of a dense 1x1 conv at stride 1 without padding, as one GEMM over the N*H*W rows
// (dz^T x) written in float32 from float16 or bfloat16 operands: under autocast the float32 weight's gradient then
// needs no cast back from half precision, and keeps the GEMM's float32 sums instead of their half-precision rounding.
// Undefined where it does not apply: another conv, operands not channels_last-contiguous, a weight_dtype other than
// float32, or deterministic algorithms requested (cuBLAS then needs CUBLAS_WORKSPACE_CONFIG; cuDNN's wgrad does not).
at::Tensor pointwise_weight_gradient(const at::Tensor& grad_z, const at::Tensor& x, at::IntArrayRef weight_size,
                                     at::IntArrayRef stride, at::IntArrayRef padding, int64_t groups,
                                     at::ScalarType weight_dtype);

// The conv inside the conv + BatchNorm op (symmetric padding, arguments as at::convolution's): our depthwise forward
// where depthwise_kernel_steps picks it for a conv without an epilogue, else PyTorch's convolution.
at::Tensor batch_norm_conv_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                   int64_t groups);

// The conv inside the conv + BatchNorm op (symmetric padding, arguments as at::convolution's): its backward with dx
// and dweight as depthwise_kernel_steps picks them (cudnn_fusion::conv_dgrad and conv_wgrad where those are not
// PyTorch's), or dweight as pointwise_weight_gradient where it applies. Returns (dx, dweight,
// dbias) for `mask`; dweight in `weight_dtype` where it is float32 and pointwise_weight_gradient or our depthwise
// wgrad made it (both write their float sums as they are, so the node casts nothing back), else in grad_z's dtype.
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_conv_backward(
    const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight, bool has_bias, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, std::array<bool, 3> mask,
    at::ScalarType weight_dtype);

}  // namespace tcf
