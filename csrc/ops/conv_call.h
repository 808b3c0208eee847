// A conv + bias (+ residual) + activation layer's repeated call (cudnn_fusion::conv_bias_act), run from C++ for its
// host time: the conv layers (Conv2dReLU, Conv2dAddReLU) and a Conv2dBN* layer in eval, whose BatchNorm is folded
// into the conv. Python decides how the layer runs (torch_cudnn_fusion/ops/conv.py, conv2d_bias_act); where it
// decided on the op, it records the call here: the metadata of x, the weight, the bias and the residual as they
// were passed (before autocast casts them), their alignment (the plans depend on it), the global state it read and
// the op's constant arguments. A later call's run() compares its tensors and that state with the record and, when
// everything matches, casts the operands as autocast would and calls the op through the dispatcher (autograd
// records its node as for a call from Python). Otherwise it returns nothing and Python decides again. As for
// ConvBatchNormCall (conv_bn_call.h): Python's signature and the op's arguments parsed from Python cost more host
// time per repeated call than a small layer's kernels. Where Python decided on eager's composition, it records the
// call too, and asks matches() alone: a layer that runs eager (regnet_y's squeeze-and-excitation convs, whose channels
// are not multiples of 8) then pays eager's host time and a comparison, not Python's signature: about 1.4 ms less a
// regnet_y_400mf training step on H100 (benchmarks/eager_records_ab.py, 2026-11-27).
#pragma once

#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "ops/recorded_call.h"

namespace tcf {

class ConvBiasActCall {
 public:
  // The tensors of the call being recorded (those run() takes) and the op's arguments.
  // With a stem's form (stem_index, stem_inverse and stem_form as cudnn_fusion::stem_conv_bias_act takes them), the
  // geometry is the form's, and run() calls that op on x as given.
  ConvBiasActCall(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& residual, std::vector<int64_t> stride,
                  std::vector<int64_t> padding_pre, std::vector<int64_t> padding_post, std::vector<int64_t> dilation,
                  int64_t groups, int64_t activation, int64_t policy,
                  const std::optional<at::Tensor>& stem_index = std::nullopt,
                  const std::optional<at::Tensor>& stem_inverse = std::nullopt,
                  std::vector<int64_t> stem_form = {});

  // y of the op, or nothing when this call differs from the record (then nothing ran).
  std::optional<at::Tensor> run(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                const std::optional<at::Tensor>& residual) const;
  // Whether this call's tensors and the global state match the record (run() runs the op only when they do).
  bool matches(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
               const std::optional<at::Tensor>& residual) const;

 private:
  CallRecord record_;  // x, weight, bias, residual
  std::vector<int64_t> stride_, padding_pre_, padding_post_, dilation_;
  int64_t groups_, activation_, policy_;
  at::Tensor stem_index_, stem_inverse_;  // undefined: no stem form
  std::vector<int64_t> stem_form_;
};

}  // namespace tcf
