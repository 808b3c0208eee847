// Our CUDA kernel that rearranges a stem conv's input for its space-to-depth form (see space_to_depth_kernel.cu).
// Plain CUDA types only, so the .cu file compiles without torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/element_type.h"

namespace tcf {

// x: [N, C, H, W] of `in_type` with the given element strides (any layout), C from 1 to 4; out: dense NHWC [N, out_h,
// out_w, out_channels] of `out_type` (float16 or bfloat16), out_channels 8 where C <= 2 else 16, on a 16-byte
// boundary. Writes
//   out[n, R, X, (a * 2 + b) * C + c] = x[n, c, 2 * (R - pad_top) + a, 2 * (X - pad_left) + b]
// where that pixel is inside x, and 0 everywhere else (the padding, the channels past 4 * C). Asynchronous on
// `stream`.
struct SpaceToDepthShape {
  int64_t n, c, h, w;
  int64_t stride_n, stride_c, stride_h, stride_w;
  int64_t pad_top, pad_left, out_h, out_w, out_channels;
};
cudaError_t launch_space_to_depth(ElementType in_type, ElementType out_type, const void* x, void* out,
                                  const SpaceToDepthShape& shape, cudaStream_t stream);

}  // namespace tcf
