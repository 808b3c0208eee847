// Autograd for cudnn_fusion::conv_bias_act, in C++ (a Python autograd.Function cost ~185 us of host time per
// training step of one layer, more than the layer's GPU time on small shapes). Saves only what backward can use: x
// where the weight requires grad (its gradient reads x), the weight where x does (x's reads the weight), and, with
// ReLU or ReLU6, the output y: the activation's backward takes its mask from y. (A stem's x, the image, needs no
// gradient: its rearranged weight is then neither kept nor rearranged again in backward, ops/stem.py.) Every op is
// called through the dispatcher, so torch.compile traces the backward graph through the fake kernels.
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/conv_ops.h"
#include "ops/saved_ints.h"

namespace tcf {

at::Tensor call_conv_dgrad(const at::Tensor& grad_z, const at::Tensor& weight, at::IntArrayRef x_size,
                           at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                           at::IntArrayRef dilation, int64_t groups, int64_t policy) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cudnn_fusion::conv_dgrad", "").typed<decltype(conv_dgrad)>();
  return op.call(grad_z, weight, x_size, stride, padding_pre, padding_post, dilation, groups, policy);
}

at::Tensor call_conv_wgrad(const at::Tensor& grad_z, const at::Tensor& x, at::IntArrayRef weight_size,
                           at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                           at::IntArrayRef dilation, int64_t groups, int64_t policy,
                           std::optional<at::ScalarType> out_dtype) {
  static auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cudnn_fusion::conv_wgrad", "").typed<decltype(conv_wgrad)>();
  return op.call(grad_z, x, weight_size, stride, padding_pre, padding_post, dilation, groups, policy, out_dtype);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                              at::IntArrayRef padding_pre, at::IntArrayRef padding_post, at::IntArrayRef dilation,
                              int64_t groups, int64_t activation, int64_t policy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::conv_bias_act", "")
                       .typed<decltype(conv_bias_act)>();
  return op.call(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, activation, policy);
}

std::tuple<at::Tensor, at::Tensor> call_relu_bias_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                                           int64_t activation, int64_t policy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::relu_bias_backward", "")
                       .typed<decltype(relu_bias_backward)>();
  return op.call(grad_out, out, activation, policy);
}

class ConvBiasActFunction : public torch::autograd::Function<ConvBiasActFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                               at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                               at::IntArrayRef dilation, int64_t groups, int64_t activation, int64_t policy) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto y = call_conv_bias_act(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups,
                                activation, policy);
    ctx->save_for_backward({weight.requires_grad() ? x : at::Tensor(), x.requires_grad() ? weight : at::Tensor(),
                            activation != 0 ? y : at::Tensor()});
    SavedInts()
        .add(x.sizes())
        .add(weight.sizes())
        .add(stride)
        .add(padding_pre)
        .add(padding_post)
        .add(dilation)
        .add(groups)
        .add(activation)
        .add(policy)
        .add(bias.has_value() && bias->defined())
        .add(residual.has_value() && residual->defined())
        .save(ctx);
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto& y = saved[2];
    const auto& grad_out = grad_outputs[0];
    at::Tensor none;
    if (!grad_out.defined()) return {none, none, none, none, none, none, none, none, none, none, none};
    SavedIntsReader ints(ctx);  // in the order forward saved them
    const auto x_size = ints.next_list();
    const auto weight_size = ints.next_list();
    const auto stride = ints.next_list();
    const auto padding_pre = ints.next_list();
    const auto padding_post = ints.next_list();
    const auto dilation = ints.next_list();
    const int64_t groups = ints.next();
    const int64_t activation = ints.next();
    const int64_t policy = ints.next();
    const bool has_bias = ints.next_bool();
    const bool has_residual = ints.next_bool();

    // needs_input_grad counts only the tensors that were passed: an absent bias shifts the residual's index.
    size_t edge = 0;
    bool need_x = ctx->needs_input_grad(edge++);
    bool need_w = ctx->needs_input_grad(edge++);
    bool need_bias = has_bias && ctx->needs_input_grad(edge++);
    bool need_residual = has_residual && ctx->needs_input_grad(edge++);

    at::Tensor grad_z, grad_bias;
    if (activation != 0) {
      // One pass: ReLU's (ReLU6's) backward with the mask from y, fused with the bias-gradient reduction.
      std::tie(grad_z, grad_bias) = call_relu_bias_backward(grad_out, y, activation, policy);
    } else {
      grad_z = grad_out;
      if (need_bias) grad_bias = grad_out.sum({0, 2, 3}, false, at::kFloat).to(grad_out.scalar_type());
    }
    at::Tensor grad_x, grad_w;
    if (need_x) {
      grad_x = call_conv_dgrad(grad_z, weight, x_size, stride, padding_pre, padding_post, dilation, groups, policy);
    }
    if (need_w) {
      grad_w = call_conv_wgrad(grad_z, x, weight_size, stride, padding_pre, padding_post, dilation, groups, policy);
    }
    return {grad_x, grad_w, need_bias ? grad_bias : none, need_residual ? grad_z : none,
            none, none, none, none, none, none, none};
  }
};

at::Tensor conv_bias_act_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                  const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                                  at::IntArrayRef padding_pre, at::IntArrayRef padding_post, at::IntArrayRef dilation,
                                  int64_t groups, int64_t activation, int64_t policy) {
  auto requires_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  if (!at::GradMode::is_enabled() ||
      !(x.requires_grad() || weight.requires_grad() || requires_grad(bias) || requires_grad(residual))) {
    // Nothing to record (inference): skip the autograd node and its saved state.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_conv_bias_act(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups,
                              activation, policy);
  }
  return ConvBiasActFunction::apply(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups,
                                    activation, policy)[0];
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, Autograd, m) { m.impl("conv_bias_act", &tcf::conv_bias_act_autograd); }
