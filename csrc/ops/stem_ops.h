// The space-to-depth form of a stem conv's input (kernels/space_to_depth_kernel.h), as the op
// cudnn_fusion::space_to_depth. Which convs take that form, and the filter that goes with it, are Python's
// (torch_cudnn_fusion/ops/stem.py).
#pragma once

#include <optional>

#include <ATen/ATen.h>

namespace tcf {

// x [N, C, H, W] (C from 1 to 4; float16, bfloat16 or float32; any layout) as [N, 8 or 16, out_h, out_w] channels_last
// in `dtype` (float16 or bfloat16; x's when not given): channel (a * 2 + b) * C + c of pixel (R, X) is x's channel c at
// (2 * (R - padding_pre[0]) + a, 2 * (X - padding_pre[1]) + b), zero outside x and past 4 * C.
at::Tensor space_to_depth(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                          std::optional<at::ScalarType> dtype);

}  // namespace tcf
