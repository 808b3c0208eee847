// Our CUDA kernel for BatchNorm's training backward with its activation's backward folded in, on dense NHWC tensors
// (see batch_norm_backward_kernel.cu). Plain CUDA types only, so the .cu file compiles without torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/element_type.h"

namespace tcf {

// Which passes a launch runs: all three; or the first two (dz, dweight and dbias) and, in a later launch, the last
// (dx from dz, dweight and dbias), so that a caller can free dy in between.
enum BatchNormBackwardPasses : int { kBackwardAllPasses = 0, kBackwardReduce = 1, kBackwardDx = 2 };

// Tensors are [rows, channels] NHWC views in the element type; per-channel ones float32.
struct BatchNormActBackwardArgs {
  const void* dy;            // the gradient of the activation's output
  const void* x;             // BatchNorm's input
  const void* y;             // the forward output, for the mask; null: the mask is recomputed from x
  const float* save_mean;    // the batch statistics the forward saved
  const float* save_invstd;
  const float* weight;
  const float* bias;
  void* dz;                  // null, or where the masked gradient goes (the residual's gradient)
  void* dx;                  // dz or dx may be dy itself: each element is read, then written, by one thread
  float* dweight;            // outputs, and kBackwardDx's inputs
  float* dbias;
  float* partial;            // batch_norm_act_backward_partial_rows(...) * channels floats of scratch (not kBackwardDx)
  int64_t rows;
  int64_t channels;
  int activation;            // kActivationRelu, kActivationRelu6, kActivationSilu, kActivationHardswish or
                             // kActivationLeakyRelu
  float negative_slope = 0.f;  // LeakyReLU's slope below 0
  int passes = kBackwardAllPasses;  // kBackwardReduce needs dz; kBackwardDx reads g from dz (dy, y unused)
};

// Rows of float32 partial sums (each `channels` long) a launch needs as scratch. `vectors`: channels are a multiple
// of 16 / element_bytes and every tensor pointer is 16-byte aligned (16-byte accesses); else one element at a time.
int64_t batch_norm_act_backward_partial_rows(int64_t rows, int64_t channels, bool vectors, int element_bytes,
                                             int multiprocessors);

// dx, dweight, dbias (and dz) as BatchNorm's backward after the activation's, or the part args.passes names;
// asynchronous on `stream`.
cudaError_t launch_batch_norm_act_backward_nhwc(ElementType type, const BatchNormActBackwardArgs& args, bool vectors,
                                                int multiprocessors, cudaStream_t stream);

}  // namespace tcf
