// Our CUDA kernels for depthwise convolution (groups == in_channels == out_channels) on dense NHWC tensors: the
// forward with bias, residual and activation in its epilogue, dgrad and wgrad (see depthwise_conv_kernel.cu). cuDNN's fused
// graphs run grouped convolutions many times slower than its plain depthwise kernel, which fuses nothing.
// Plain CUDA types only, so the .cu file compiles without torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/element_type.h"

namespace tcf {

// The square kernel size and the strides the kernels are built for (dilation 1). 5x5 ones, built the same way, ran
// slower than PyTorch's (cuDNN's) on a 5x5 stride-2 layer of 672 channels (forward 0.207 vs 0.108 ms, dgrad 0.326 vs
// 0.256 ms, H100, benchmarks/results/depthwise_h100_2026-11-23.txt): 5x5 layers run PyTorch's.
constexpr bool depthwise_kernel_size_supported(int64_t size) { return size == 3; }
constexpr bool depthwise_stride_supported(int64_t stride) { return stride == 1 || stride == 2; }

// x [n, h, w, channels], y [n, out_h, out_w, channels], weight [channels, 1, kernel, kernel]; pad_h and pad_w are the
// top and left padding (the bottom and right padding only set out_h and out_w).
struct DepthwiseShape {
  int64_t n, h, w, channels, out_h, out_w;
  int kernel, stride, pad_h, pad_w;
};

// `vectors`: channels are a multiple of 16 / element_bytes and every NHWC tensor pointer and the weight are 16-byte
// aligned (16-byte accesses; the walks read the weight as vectors); else one element at a time. The bias is
// read one element at a time.
bool depthwise_vectors_fit(int64_t channels, int element_bytes);

// y = activation(conv(x, weight) + bias + residual); bias and residual may be null. Asynchronous on `stream`.
cudaError_t launch_depthwise_conv_forward(ElementType type, const DepthwiseShape& shape, const void* x,
                                          const void* weight, const void* bias, const void* residual, void* y,
                                          int activation, bool vectors, cudaStream_t stream);

// dx [n, h, w, channels] from dy [n, out_h, out_w, channels]; at stride 1 only with `vectors` and padding below 3
// (else cudaErrorInvalidValue).
cudaError_t launch_depthwise_conv_dgrad(ElementType type, const DepthwiseShape& shape, const void* dy,
                                        const void* weight, void* dx, bool vectors, cudaStream_t stream);

// dw [channels, 1, kernel, kernel] = the sums over n, out_h, out_w of dy times the x each output read, in float in a
// fixed order, rounded once to the element type (dw_float: written as float, unrounded); x and dy as above, 16-byte vectors only (the caller checks:
// depthwise_vectors_fit and the pointers' alignment), stride 1 or 2. Two launches: the first writes `parts` x 9 x
// channels float partial sums into `partial` (the caller's scratch), the second adds them up.
// depthwise_wgrad_parts: the parts a launch on `multiprocessors` multiprocessors writes (0: the kernels do not take
// the shape, or the grid cannot hold its channel groups).
// dependent_sum: launch the second as the first's programmatic dependent (compute capability 9.0 and above).
// plan: 0, the kernels' own choice by shape; 1, the second plan (a walk shaped as before ace379a); 2, the small-image
// kernel plan 0 passes over (the plane kernel on 14 x 14 images at stride 1, the tile or walk where plan 0 runs the
// plane kernel; none on other shapes). Each is faster on some layers of some GPUs (see wgrad_walk_plan_for); all give
// deterministic sums, in different orders.
constexpr int kDepthwiseWgradPlans = 3;
int64_t depthwise_wgrad_parts(ElementType type, const DepthwiseShape& shape, int multiprocessors, int plan);
cudaError_t launch_depthwise_conv_wgrad(ElementType type, const DepthwiseShape& shape, const void* x, const void* dy,
                                        void* dw, bool dw_float, float* partial, int64_t parts, int multiprocessors,
                                        int plan, bool dependent_sum, cudaStream_t stream);

}  // namespace tcf
