// A training Conv2d + BatchNorm layer's repeated call, run from C++ for its host time. Python decides how a layer
// runs (torch_cudnn_fusion/ops/batch_norm.py, conv2d_batch_norm_act); where it decided on the one op
// cudnn_fusion::conv_batch_norm_act, it records the call here: the metadata of every tensor the decision depends on,
// the global state it read (grad mode, autocast, deterministic algorithms) and the op's constant arguments. A later
// call's run() compares its tensors and that state with the record and, when everything matches, calls the op
// through the dispatcher (autograd records its node as for a call from Python). Otherwise it returns nothing and
// Python takes its general path, which decides again. On H200 the Python work per repeated call (the signature
// tuple, the op's 19 arguments parsed from Python) cost more host time than a 7x7 layer's forward kernels.
#pragma once

#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "ops/recorded_call.h"

namespace tcf {

class ConvBatchNormCall {
 public:
  // The tensors of the call being recorded (those run() takes, in the same order) and the op's arguments.
  // weight and bias: float32 and contiguous, or both absent (affine=False: 1 and 0). num_batches_tracked only with
  // running statistics.
  ConvBatchNormCall(const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
                    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
                    const std::optional<at::Tensor>& num_batches_tracked, const std::optional<at::Tensor>& residual,
                    std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                    int64_t groups, double eps, int64_t activation, int64_t implementation, int64_t policy,
                    double negative_slope, const std::optional<at::Tensor>& stem_index = std::nullopt,
                    const std::optional<at::Tensor>& stem_inverse = std::nullopt, std::vector<int64_t> stem_form = {});

  // y of the op, or nothing when this call differs from the record (then nothing ran).
  std::optional<at::Tensor> run(const at::Tensor& x, const at::Tensor& conv_weight,
                                const std::optional<at::Tensor>& conv_bias, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                                const std::optional<at::Tensor>& running_var,
                                const std::optional<at::Tensor>& num_batches_tracked,
                                const std::optional<at::Tensor>& residual, double momentum) const;

 private:
  CallRecord record_;  // x, conv_weight, conv_bias, weight, bias, running_mean, running_var,
                       // num_batches_tracked, residual
  std::vector<int64_t> stride_, padding_, dilation_;
  int64_t groups_;
  double eps_;
  int64_t activation_, implementation_, policy_;
  double negative_slope_;
  RecordedAffine affine_;
  at::Tensor stem_index_, stem_inverse_;  // undefined: no stem form
  std::vector<int64_t> stem_form_;
};

}  // namespace tcf
