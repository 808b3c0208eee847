#include "ops/conv_bn_call.h"

#include "ops/bn_ops.h"
#include "ops/stem_ops.h"

namespace tcf {

ConvBatchNormCall::ConvBatchNormCall(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& num_batches_tracked, const std::optional<at::Tensor>& residual,
    std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation, int64_t groups,
    double eps, int64_t activation, int64_t implementation, int64_t policy, double negative_slope,
    const std::optional<at::Tensor>& stem_index, const std::optional<at::Tensor>& stem_inverse,
    std::vector<int64_t> stem_form)
    : record_({&x, &conv_weight, pointer(conv_bias), pointer(weight), pointer(bias), pointer(running_mean),
               pointer(running_var), pointer(num_batches_tracked), pointer(residual)},
              false),  // the op copies nothing it hands cuDNN: any alignment
      stride_(std::move(stride)),
      padding_(std::move(padding)),
      dilation_(std::move(dilation)),
      groups_(groups),
      eps_(eps),
      activation_(activation),
      implementation_(implementation),
      policy_(policy),
      negative_slope_(negative_slope),
      affine_(weight, bias, conv_weight.size(0), x.options(), "ConvBatchNormCall"),
      stem_index_(stem_index.value_or(at::Tensor())),
      stem_inverse_(stem_inverse.value_or(at::Tensor())),
      stem_form_(std::move(stem_form)) {
  TORCH_CHECK(x.is_cuda(), "cudnn_fusion: ConvBatchNormCall records CUDA calls, got x on ", x.device());
  TORCH_CHECK(stride_.size() == 2 && padding_.size() == 2 && dilation_.size() == 2,
              "cudnn_fusion: stride, padding and dilation must have 2 values each, got ", stride_, ", ", padding_,
              ", ", dilation_);
  TORCH_CHECK(pointer(num_batches_tracked) == nullptr || pointer(running_mean) != nullptr,
              "cudnn_fusion: ConvBatchNormCall counts num_batches_tracked only with running statistics");
  TORCH_CHECK(stem_index_.defined() == stem_inverse_.defined() && stem_index_.defined() == !stem_form_.empty(),
              "cudnn_fusion: ConvBatchNormCall takes a stem's index, inverse and form together, or none of them");
}

std::optional<at::Tensor> ConvBatchNormCall::run(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& num_batches_tracked, const std::optional<at::Tensor>& residual,
    double momentum) const {
  auto now = record_.check({&x, &conv_weight, pointer(conv_bias), pointer(weight), pointer(bias),
                            pointer(running_mean), pointer(running_var), pointer(num_batches_tracked),
                            pointer(residual)});
  if (!now.has_value()) return std::nullopt;
  const CallState& state = *now;
  std::optional<at::ScalarType> conv_dtype;
  if (state.autocast) conv_dtype = state.autocast_dtype;
  if (stem_index_.defined()) {
    return std::get<0>(call_stem_conv_batch_norm_act(
        x, conv_weight, conv_bias, stem_index_, stem_inverse_, stem_form_, affine_.scale(weight), affine_.shift(bias),
        running_mean, running_var, num_batches_tracked, residual, momentum, eps_, activation_, implementation_,
        conv_dtype, policy_, negative_slope_));
  }
  return std::get<0>(call_conv_batch_norm_act(x, conv_weight, conv_bias, stride_, padding_, dilation_, groups_,
                                              affine_.scale(weight), affine_.shift(bias), running_mean, running_var,
                                              num_batches_tracked, residual, momentum, eps_, activation_,
                                              implementation_, conv_dtype, policy_, negative_slope_));
}

}  // namespace tcf
