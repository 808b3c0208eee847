#include "ops/conv_call.h"

#include "ops/conv_ops.h"
#include "ops/stem_ops.h"
#include "ops/tensor_checks.h"

namespace tcf {

namespace {

// As torch.autocast casts a conv's operand (and ops/conv.py's _autocast): floating point but not float64.
bool autocast_casts(const at::Tensor& t, const CallState& state) {
  return state.autocast && t.is_floating_point() && t.scalar_type() != at::kDouble;
}

at::Tensor autocast_operand(const at::Tensor& t, const CallState& state) {
  return autocast_casts(t, state) ? in_dtype(t, state.autocast_dtype) : t;
}

}  // namespace

ConvBiasActCall::ConvBiasActCall(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 const std::optional<at::Tensor>& residual, std::vector<int64_t> stride,
                                 std::vector<int64_t> padding_pre, std::vector<int64_t> padding_post,
                                 std::vector<int64_t> dilation, int64_t groups, int64_t activation, int64_t policy,
                                 const std::optional<at::Tensor>& stem_index,
                                 const std::optional<at::Tensor>& stem_inverse, std::vector<int64_t> stem_form)
    : record_({&x, &weight, pointer(bias), pointer(residual)}, true),  // the plan's key holds their alignment
      stride_(std::move(stride)),
      padding_pre_(std::move(padding_pre)),
      padding_post_(std::move(padding_post)),
      dilation_(std::move(dilation)),
      groups_(groups),
      activation_(activation),
      policy_(policy),
      stem_index_(stem_index.value_or(at::Tensor())),
      stem_inverse_(stem_inverse.value_or(at::Tensor())),
      stem_form_(std::move(stem_form)) {
  TORCH_CHECK(x.is_cuda(), "cudnn_fusion: ConvBiasActCall records CUDA calls, got x on ", x.device());
  TORCH_CHECK(stride_.size() == 2 && padding_pre_.size() == 2 && padding_post_.size() == 2 && dilation_.size() == 2,
              "cudnn_fusion: stride, padding_pre, padding_post and dilation must have 2 values each, got ", stride_,
              ", ", padding_pre_, ", ", padding_post_, ", ", dilation_);
  TORCH_CHECK(stem_index_.defined() == stem_inverse_.defined() && stem_index_.defined() == !stem_form_.empty(),
              "cudnn_fusion: ConvBiasActCall takes a stem's index, inverse and form together, or none of them");
}

std::optional<at::Tensor> ConvBiasActCall::run(const at::Tensor& x, const at::Tensor& weight,
                                               const std::optional<at::Tensor>& bias,
                                               const std::optional<at::Tensor>& residual) const {
  auto now = record_.check({&x, &weight, pointer(bias), pointer(residual)});
  if (!now.has_value()) return std::nullopt;
  const CallState& state = *now;
  std::optional<at::Tensor> cast_bias;
  if (pointer(bias) != nullptr) cast_bias = autocast_operand(*bias, state);
  if (stem_index_.defined()) {  // the form casts x and the weight as it rearranges them
    return call_stem_conv_bias_act(
        x, weight, cast_bias, residual, stem_index_, stem_inverse_, stem_form_, activation_, policy_,
        autocast_casts(weight, state) ? std::optional<at::ScalarType>(state.autocast_dtype) : std::nullopt);
  }
  return call_conv_bias_act(autocast_operand(x, state), autocast_operand(weight, state), cast_bias, residual, stride_,
                            padding_pre_, padding_post_, dilation_, groups_, activation_, policy_);
}

bool ConvBiasActCall::matches(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual) const {
  return record_.check({&x, &weight, pointer(bias), pointer(residual)}).has_value();
}

}  // namespace tcf
