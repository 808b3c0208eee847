// The space-to-depth form of a stem conv: its input (kernels/space_to_depth_kernel.h), as the op
// cudnn_fusion::space_to_depth, and its filter, as cudnn_fusion::stem_filter; and the conv ops in that form,
// cudnn_fusion::stem_conv_bias_act and stem_conv_batch_norm_act (their autograd: conv_autograd.cpp, bn_autograd.cpp,
// with stem_form.h). Which convs take that form, and where each filter element goes in it, are Python's
// (torch_cudnn_fusion/ops/stem.py, plan).
#pragma once

#include <optional>
#include <tuple>

#include <ATen/ATen.h>

namespace tcf {

// x [N, C, H, W] (C from 1 to 4; float16, bfloat16 or float32; any layout) as [N, 8 or 16, out_h, out_w] channels_last
// in `dtype` (float16 or bfloat16; x's when not given): channel (a * 2 + b) * C + c of pixel (R, X) is x's channel c at
// (2 * (R - padding_pre[0]) + a, 2 * (X - padding_pre[1]) + b), zero outside x and past 4 * C.
at::Tensor space_to_depth(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                          std::optional<at::ScalarType> dtype);

// weight [O, C, kh, kw] (any layout) rearranged for the form: [O, channels, kernel[0], kernel[1]] channels_last in
// `dtype` (weight's when not given), whose element i in channels_last order (y, x, k) is element index[i] of weight
// flattened in channels_last order (c fastest), or zero where index[i] is C * kh * kw. `index` and `inverse` (for each
// weight element, its place in the form; backward's gather) are int64 on weight's device, from stem.plan.
at::Tensor stem_filter(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                       at::IntArrayRef kernel, int64_t channels, std::optional<at::ScalarType> dtype);

// The filter's gradient [weight_size] (channels_last, in weight_dtype) from the rearranged filter's, `grad`: one
// gather by the plan's `inverse` (each filter element lands in the form exactly once; the form's zeros take none).
at::Tensor stem_filter_backward(const at::Tensor& grad, const at::Tensor& inverse, at::IntArrayRef weight_size,
                                at::ScalarType weight_dtype);

// conv_bias_act of a stem conv in its form: x and the weight rearranged by the plan's index, inverse and form (see
// stem_form.h) into the conv's dtype (conv_dtype, else the weight's: under autocast the caller passes the float32
// parameter and autocast's dtype, and the gather casts it), then the conv at stride 1 without padding, its bias (in
// the conv's dtype), residual and activation.
at::Tensor stem_conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, const at::Tensor& index,
                              const at::Tensor& inverse, at::IntArrayRef form, int64_t activation, int64_t policy,
                              std::optional<at::ScalarType> conv_dtype);
at::Tensor call_stem_conv_bias_act(const at::Tensor& x, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                                   const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form,
                                   int64_t activation, int64_t policy,
                                   std::optional<at::ScalarType> conv_dtype);  // through the dispatcher

// conv_batch_norm_act of a stem conv in its form (the form's dtype: conv_dtype, else x's); its results as that op's.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> stem_conv_batch_norm_act(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form, const at::Tensor& weight,
    const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_stem_conv_batch_norm_act(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form, const at::Tensor& weight,
    const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy,
    double negative_slope);  // through the dispatcher

}  // namespace tcf
