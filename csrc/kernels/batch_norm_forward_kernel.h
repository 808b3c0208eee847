// Our CUDA kernel for BatchNorm's training forward with batch statistics, its residual add and activation folded in,
// on dense NHWC tensors (see batch_norm_forward_kernel.cu). Plain CUDA types only, so the .cu file compiles without
// torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/element_type.h"

namespace tcf {

// Tensors are [rows, channels] NHWC views in the element type; per-channel ones float32.
struct BatchNormActForwardArgs {
  const void* x;                  // BatchNorm's input
  const void* residual;           // null, or added to BatchNorm's output before the activation
  void* y;                        // activation(BatchNorm(x) (+ residual))
  const float* weight;
  const float* bias;
  float* save_mean;               // outputs: the batch mean and 1 / sqrt(biased variance + eps)
  float* save_invstd;
  const float* running_mean_in;   // null: no running statistics
  const float* running_var_in;
  float* running_mean_out;        // the next running statistics; may be the _in pointers (each channel is read, then
  float* running_var_out;         // written, by one thread)
  int64_t* num_batches_tracked;   // null, or counted +1 with the running statistics
  double* partial;                // batch_norm_act_forward_partial_rows(...) * channels doubles of scratch
  int64_t rows;                   // at least 2
  int64_t channels;
  float eps;
  float momentum;
  int activation;                 // kActivationNone .. kActivationLeakyRelu
  float negative_slope = 0.f;     // LeakyReLU's slope below 0
};

// Rows of float64 partial sums (each `channels` long) a launch needs as scratch. `vectors`: channels are a multiple
// of 16 / element_bytes and every tensor pointer is 16-byte aligned (16-byte accesses); else one element at a time.
int64_t batch_norm_act_forward_partial_rows(int64_t rows, int64_t channels, bool vectors, int element_bytes,
                                            int multiprocessors);

// y, save_mean, save_invstd (and the running statistics, and the step count) as nn.BatchNorm2d's training forward
// followed by the residual add and the activation; asynchronous on `stream`.
cudaError_t launch_batch_norm_act_forward_nhwc(ElementType type, const BatchNormActForwardArgs& args, bool vectors,
                                               int multiprocessors, cudaStream_t stream);

}  // namespace tcf
