#include "ops/conv_bn_backward.h"

#include <algorithm>
#include <optional>

#include "kernels/element_type.h"
#include "ops/conv_ops.h"
#include "ops/depthwise_ops.h"
#include "ops/tensor_checks.h"

namespace tcf {

namespace {

// The conv + BatchNorm op's conv as a ConvProblem, when our kernels take it (else nullopt). Its arguments are
// checked (check_conv_problem) before any arithmetic on them.
std::optional<ConvProblem> depthwise_problem(const at::Tensor& x, const at::Tensor& weight, at::IntArrayRef stride,
                                             at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  if (x.dim() != 4 || weight.dim() != 4 || stride.size() != 2 || padding.size() != 2 || dilation.size() != 2 ||
      x.scalar_type() != weight.scalar_type() || !x.is_cuda()) {
    return std::nullopt;  // at::convolution raises its own error, or runs what our kernels do not take
  }
  bool channels_last = use_channels_last(x, weight);
  if (depthwise_kernel_check(x.size(1), weight.sizes(), stride, dilation, groups, channels_last) !=
      DepthwiseUnmet::kNone) {
    return std::nullopt;
  }
  ConvProblem p;
  p.dtype = x.scalar_type();
  p.channels_last = true;
  p.x_size = size4(x.sizes());
  p.w_size = size4(weight.sizes());
  p.stride = {stride[0], stride[1]};
  p.pad_pre = p.pad_post = {padding[0], padding[1]};
  p.dilation = {dilation[0], dilation[1]};
  p.groups = groups;
  check_conv_problem(p);
  return p;
}

}  // namespace

at::Tensor batch_norm_conv_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                   at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                   int64_t groups) {
  auto p = depthwise_problem(x, weight, stride, padding, dilation, groups);
  if (!p.has_value() || !depthwise_kernel_steps(*p, bias.defined()).forward) {
    return at::convolution(x, weight, bias.defined() ? std::optional<at::Tensor>(bias) : std::nullopt, stride,
                           padding, dilation, false, {0, 0}, groups);
  }
  p->has_bias = bias.defined();
  auto y = at::empty(p->y_size(), x.options().memory_format(at::MemoryFormat::ChannelsLast));
  depthwise_conv_forward(x.contiguous(at::MemoryFormat::ChannelsLast), weight,
                         bias.defined() ? bias.contiguous() : bias, at::Tensor(), *p, kActivationNone, y);
  return y;
}

at::Tensor pointwise_weight_gradient(const at::Tensor& grad_z, const at::Tensor& x, at::IntArrayRef weight_size,
                                     at::IntArrayRef stride, at::IntArrayRef padding, int64_t groups,
                                     at::ScalarType weight_dtype) {
  const auto format = at::MemoryFormat::ChannelsLast;
  auto all = [](at::IntArrayRef values, int64_t v) {
    return std::all_of(values.begin(), values.end(), [v](int64_t e) { return e == v; });
  };
  const bool half = x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf;
  if (weight_dtype != at::kFloat || !half || grad_z.scalar_type() != x.scalar_type() || x.dim() != 4 ||
      grad_z.dim() != 4 || weight_size.size() != 4 || weight_size[2] != 1 || weight_size[3] != 1 || groups != 1 ||
      !all(stride, 1) || !all(padding, 0) || !x.is_cuda() || !x.is_contiguous(format) ||
      !grad_z.is_contiguous(format) || grad_z.size(0) != x.size(0) || grad_z.size(1) != weight_size[0] ||
      x.size(1) != weight_size[1] || grad_z.size(2) != x.size(2) || grad_z.size(3) != x.size(3) ||
      at::globalContext().deterministicAlgorithms()) {
    return at::Tensor();
  }
  // channels_last [N, C, H, W] is [N*H*W, C] row-major: one strided view of each (not permute, reshape and t, a
  // dispatcher call each)
  const int64_t rows = x.size(0) * x.size(2) * x.size(3);
  auto grad_t = grad_z.as_strided({grad_z.size(1), rows}, {1, grad_z.size(1)});
  return at::mm(grad_t, x.as_strided({rows, x.size(1)}, {x.size(1), 1}), at::kFloat).view(weight_size);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_conv_backward(
    const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight, bool has_bias, at::IntArrayRef stride,
    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups, std::array<bool, 3> mask,
    at::ScalarType weight_dtype) {
  auto pointwise_dw = mask[1] ? pointwise_weight_gradient(grad_z, x, weight.sizes(), stride, padding, groups,
                                                          weight_dtype)
                              : at::Tensor();
  if (pointwise_dw.defined()) {
    at::Tensor dx, db;
    if (mask[0] || mask[2]) {
      std::tie(dx, std::ignore, db) = batch_norm_conv_backward(grad_z, x, weight, has_bias, stride, padding, dilation,
                                                               groups, {mask[0], false, mask[2]}, weight_dtype);
    }
    return {dx, pointwise_dw, db};
  }
  std::vector<int64_t> bias_size{weight.size(0)};
  auto aten = [&](std::array<bool, 3> which) {
    return at::convolution_backward(grad_z, x, weight, has_bias ? at::OptionalIntArrayRef(bias_size) : std::nullopt,
                                    stride, padding, dilation, false, {0, 0}, groups, which);
  };
  auto p = depthwise_problem(x, weight, stride, padding, dilation, groups);
  if (!p.has_value()) return aten(mask);
  const auto steps = depthwise_kernel_steps(*p, false);
  const bool our_dx = mask[0] && steps.dgrad != DepthwiseDgrad::kPyTorch;
  const bool our_dw = mask[1] && steps.wgrad;
  if (!our_dx && !our_dw) return aten(mask);
  // cudnn_fusion::conv_dgrad and conv_wgrad run the steps depthwise_kernel_steps picked; PyTorch's the rest
  auto dz = grad_z.contiguous(at::MemoryFormat::ChannelsLast);
  at::Tensor dx, dw, db;
  if (our_dx) dx = call_conv_dgrad(dz, weight, x.sizes(), stride, padding, padding, dilation, groups, 0);
  // a float32 weight's gradient in float32 straight from the kernel's float sums (no bf16 rounding, no cast back)
  std::optional<at::ScalarType> dw_dtype;
  if (weight_dtype == at::kFloat) dw_dtype = at::kFloat;
  if (our_dw) dw = call_conv_wgrad(dz, x, weight.sizes(), stride, padding, padding, dilation, groups, 0, dw_dtype);
  const std::array<bool, 3> rest{mask[0] && !our_dx, mask[1] && !our_dw, mask[2]};
  if (rest[0] || rest[1] || rest[2]) {
    auto [aten_dx, aten_dw, aten_db] = aten(rest);
    if (rest[0]) dx = aten_dx;
    if (rest[1]) dw = aten_dw;
    db = aten_db;
  }
  return {dx, dw, db};
}

}  // namespace tcf
