// A training BatchNorm2d (+ residual) (+ activation) layer's repeated call, run from C++ for its host time, as
// conv_bn_call.h does for a conv + BatchNorm layer. Python decides how the layer runs
// (torch_cudnn_fusion/ops/batch_norm.py, batch_norm_act); where it decided on the op
// cudnn_fusion::batch_norm_act_update (float32 running statistics updated in the op's launch), it records the call
// here: the metadata of every tensor the decision depends on, the global state it read and the op's constant
// arguments. A later call's run() compares its tensors and that state with the record and, when everything matches,
// calls the op through the dispatcher (autograd records its node as for a call from Python). Otherwise it returns
// nothing and Python takes its general path, which decides again.
#pragma once

#include <optional>

#include <ATen/ATen.h>

#include "ops/recorded_call.h"

namespace tcf {

class BatchNormCall {
 public:
  // The tensors of the call being recorded (those run() takes, in the same order) and the op's arguments.
  // weight and bias: float32 and contiguous, or both absent (affine=False: 1 and 0). running_mean and running_var:
  // float32 (the op writes them).
  BatchNormCall(const at::Tensor& x, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                const at::Tensor& running_mean, const at::Tensor& running_var,
                const std::optional<at::Tensor>& num_batches_tracked, const std::optional<at::Tensor>& residual,
                double eps, int64_t activation, int64_t implementation, int64_t policy, double negative_slope);

  // y of the op, or nothing when this call differs from the record (then nothing ran; also where the running
  // statistics are absent).
  std::optional<at::Tensor> run(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
                                const std::optional<at::Tensor>& running_var,
                                const std::optional<at::Tensor>& num_batches_tracked,
                                const std::optional<at::Tensor>& residual, double momentum) const;

 private:
  CallRecord record_;  // x, weight, bias, running_mean, running_var, num_batches_tracked, residual
  double eps_;
  int64_t activation_, implementation_, policy_;
  double negative_slope_;
  RecordedAffine affine_;
};

}  // namespace tcf
