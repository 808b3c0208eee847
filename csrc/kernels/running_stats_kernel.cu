// Commits a training step's BatchNorm running statistics in one launch. The cuDNN batchnorm graph writes the next
// running mean and variance to buffers of their own (it reads the current ones); copying them into the module's
// buffers and counting the step in num_batches_tracked took three launches (two copies and an add_), about 15 us
// of host time per layer on H200, where a small layer's whole forward takes about 60 us of GPU time.
#include "kernels/running_stats_kernel.h"

namespace tcf {
namespace {

constexpr int kThreads = 256;

__global__ void commit_running_stats(float* __restrict__ running_mean, float* __restrict__ running_var,
                                     const float* __restrict__ next_mean, const float* __restrict__ next_var,
                                     int64_t* __restrict__ num_batches_tracked, int64_t channels) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < channels) {
    running_mean[c] = next_mean[c];
    running_var[c] = next_var[c];
  }
  if (num_batches_tracked != nullptr && c == 0) *num_batches_tracked += 1;
}

}  // namespace

cudaError_t launch_commit_running_stats(float* running_mean, float* running_var, const float* next_mean,
                                        const float* next_var, int64_t* num_batches_tracked, int64_t channels,
                                        cudaStream_t stream) {
  const int64_t blocks = channels > 0 ? (channels + kThreads - 1) / kThreads : 1;
  commit_running_stats<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      running_mean, running_var, next_mean, next_var, num_batches_tracked, channels);
  return cudaGetLastError();
}

}  // namespace tcf
