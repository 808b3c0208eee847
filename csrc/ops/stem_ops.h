// The space-to-depth form of a stem conv: its input (kernels/space_to_depth_kernel.h), as the op
// cudnn_fusion::space_to_depth, and its filter, as cudnn_fusion::stem_filter. Which convs take that form, and where
// each filter element goes in it, are Python's (torch_cudnn_fusion/ops/stem.py, plan).
#pragma once

#include <optional>

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

}  // namespace tcf
