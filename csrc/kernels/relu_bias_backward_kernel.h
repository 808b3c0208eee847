// Our CUDA kernel for ReLU backward + bias gradient on dense NHWC tensors (see relu_bias_backward_kernel.cu).
// Plain CUDA types only, so the .cu file compiles without torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/element_type.h"

namespace tcf {

// Rows of float32 partial sums (each `channels` long) the launch needs as scratch.
int64_t relu_bias_backward_partial_rows(int64_t rows, int64_t channels, int element_bytes, int multiprocessors);

// dz = (y > 0) ? dy : 0 (relu6: (0 < y < 6) ? dy : 0) and dbias = column sums of dz, over a [rows, channels] NHWC
// view. Requires channels to be a multiple of 16 / element size and every pointer 16-byte aligned. `partial` holds
// relu_bias_backward_partial_rows(...) * channels floats. Asynchronous on `stream`.
cudaError_t launch_relu_bias_backward_nhwc(ElementType type, const void* dy, const void* y, void* dz, float* partial,
                                           void* dbias, int64_t rows, int64_t channels, bool relu6,
                                           int multiprocessors, cudaStream_t stream);

}  // namespace tcf
