#include "ops/bn_call.h"

#include "ops/bn_ops.h"

namespace tcf {

BatchNormCall::BatchNormCall(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                             const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
                             const at::Tensor& running_var, const std::optional<at::Tensor>& num_batches_tracked,
                             const std::optional<at::Tensor>& residual, double eps, int64_t activation,
                             int64_t implementation, int64_t policy, double negative_slope)
    : record_({&x, pointer(weight), pointer(bias), &running_mean, &running_var, pointer(num_batches_tracked),
               pointer(residual)},
              false),  // the op copies nothing it hands cuDNN: any alignment
      eps_(eps),
      activation_(activation),
      implementation_(implementation),
      policy_(policy),
      negative_slope_(negative_slope),
      affine_(weight, bias, x.dim() >= 2 ? x.size(1) : 0, x.options(), "BatchNormCall") {
  TORCH_CHECK(x.is_cuda(), "cudnn_fusion: BatchNormCall records CUDA calls, got x on ", x.device());
  TORCH_CHECK(x.dim() >= 2, "cudnn_fusion: BatchNormCall records x with a channel dimension, got ", x.dim(), "D");
  TORCH_CHECK(running_mean.scalar_type() == at::kFloat && running_var.scalar_type() == at::kFloat,
              "cudnn_fusion: BatchNormCall takes float32 running statistics, got ", running_mean.scalar_type(),
              " and ", running_var.scalar_type());
}

std::optional<at::Tensor> BatchNormCall::run(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                             const std::optional<at::Tensor>& bias,
                                             const std::optional<at::Tensor>& running_mean,
                                             const std::optional<at::Tensor>& running_var,
                                             const std::optional<at::Tensor>& num_batches_tracked,
                                             const std::optional<at::Tensor>& residual, double momentum) const {
  // a call without running statistics differs from the record, which has them
  auto now = record_.check({&x, pointer(weight), pointer(bias), pointer(running_mean), pointer(running_var),
                            pointer(num_batches_tracked), pointer(residual)});
  if (!now.has_value()) return std::nullopt;
  return std::get<0>(call_batch_norm_act_update(x, affine_.scale(weight), affine_.shift(bias), *running_mean,
                                                *running_var, num_batches_tracked, residual, momentum, eps_,
                                                activation_, implementation_, policy_, negative_slope_));
}

}  // namespace tcf
