// cuDNN frontend graphs for BatchNorm in training: batch statistics with the running statistics update, the
// optional residual add and ReLU / ReLU6 fused after it; and the BatchNorm backward.
#pragma once

#include "graphs/conv_graphs.h"

namespace tcf {

// One BatchNorm layer's configuration in training.
struct BatchNormProblem {
  at::ScalarType dtype = at::kFloat;  // of x, y, the residual and the gradients; statistics are float32
  bool channels_last = true;
  int device = 0;
  std::array<int64_t, 4> x_size{};  // N, C, H, W
  bool running_stats = true;
  bool has_residual = false;
  Activation activation = Activation::kRelu;
  int64_t policy = 0;  // a registered engine policy's id
};

// Plan cache keys of the batchnorm graphs. Alignments, forward: x, residual, y; backward: dy, x, dx.
GraphKey make_batch_norm_key(GraphKind kind, const BatchNormProblem& problem, const std::array<int8_t, 3>& alignment);

// Graph descriptions, called by the plan cache's build (conv_graphs.cpp) for the batchnorm kinds.
}  // namespace tcf
