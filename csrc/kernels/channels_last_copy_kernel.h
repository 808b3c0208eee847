// Our CUDA kernel that copies an NCHW-contiguous tensor into channels_last (NHWC) order (see
// channels_last_copy_kernel.cu). Plain CUDA types only, so the .cu file compiles without torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tcf {

// Whether launch_nchw_to_nhwc takes this shape (its grid's limits); the caller copies otherwise.
bool nchw_to_nhwc_fits(int64_t batch, int64_t channels, int64_t spatial);

// dst[n][s][c] = src[n][c][s] for n < batch, c < channels, s < spatial (H * W), elements of element_bytes (2 or 4)
// bytes, copied bit for bit. Asynchronous on `stream`.
cudaError_t launch_nchw_to_nhwc(const void* src, void* dst, int element_bytes, int64_t batch, int64_t channels,
                                int64_t spatial, cudaStream_t stream);

}  // namespace tcf
