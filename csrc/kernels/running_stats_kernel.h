// Our CUDA kernel that commits a training step's BatchNorm running statistics (see running_stats_kernel.cu).
// Plain CUDA types only, so the .cu file compiles without torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tcf {

// running_mean[c] = next_mean[c] and running_var[c] = next_var[c] for c < channels (float32), and
// *num_batches_tracked += 1 when it is not null: what two copies and an add_ do, in one launch. Asynchronous on
// `stream`.
cudaError_t launch_commit_running_stats(float* running_mean, float* running_var, const float* next_mean,
                                        const float* next_var, int64_t* num_batches_tracked, int64_t channels,
                                        cudaStream_t stream);

}  // namespace tcf
