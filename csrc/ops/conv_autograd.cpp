// Autograd for cudnn_fusion::conv_bias_act, in C++ (a Python autograd.Function cost ~185 us of host time per
// training step of one layer, more than the layer's GPU time on small shapes). Saves only what backward can use: x
// where the weight requires grad (its gradient reads x), the weight where x does (x's reads the weight), and, with
// ReLU or ReLU6, the output y: the activation's backward takes its mask from y. The same node serves
// cudnn_fusion::stem_conv_bias_act, a stem conv in its space-to-depth form (stem_form.h): it keeps x in the conv's
// dtype and the filter as passed, and rearranges them again in backward. (A stem's x, the image, needs no gradient:
// its filter is then neither kept nor rearranged again.) Every op is called through the dispatcher, so torch.compile
// traces the backward graph through the fake kernels.
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/conv_ops.h"
#include "ops/saved_ints.h"
#include "ops/stem_form.h"
#include "ops/stem_ops.h"
#include "ops/tensor_checks.h"

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

at::Tensor call_conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                              at::IntArrayRef padding_pre, at::IntArrayRef padding_post, at::IntArrayRef dilation,
                              int64_t groups, int64_t activation, int64_t policy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::conv_bias_act", "")
                       .typed<decltype(conv_bias_act)>();
  return op.call(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, activation, policy);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
                               at::IntArrayRef dilation, int64_t groups, int64_t activation, int64_t policy,
                               const StemForm* stem) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto y = stem != nullptr ? call_conv_bias_act(stem->input(x), stem->filter(weight), bias, residual, stride,
                                                  padding_pre, padding_post, dilation, groups, activation, policy)
                             : call_conv_bias_act(x, weight, bias, residual, stride, padding_pre, padding_post,
                                                  dilation, groups, activation, policy);
    // the form's x in the conv's dtype, as eager's autocast conv keeps it (backward rearranges it again)
    auto kept_x = !weight.requires_grad() ? at::Tensor() : stem != nullptr ? in_dtype(x, stem->dtype()) : x;
    std::vector<at::Tensor> saved{kept_x, x.requires_grad() ? weight : at::Tensor(),
                                  activation != 0 ? y : at::Tensor()};
    SavedInts ints;
    ints.add(stem != nullptr);
    if (stem != nullptr) stem->save(ints, saved);
    ctx->save_for_backward(saved);
    ints.add(x.sizes())
        .add(static_cast<int64_t>(x.scalar_type()))
        .add(weight.sizes())
        .add(static_cast<int64_t>(weight.scalar_type()))
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
    if (!grad_out.defined()) return {none, none, none, none, none, none, none, none, none, none, none, none};
    SavedIntsReader ints(ctx);  // in the order forward saved them
    const auto stem = ints.next_bool() ? std::optional<StemForm>(StemForm::load(ints, saved, 3)) : std::nullopt;
    const auto x_size = ints.next_list();
    const auto x_dtype = ints.next_dtype();
    const auto weight_size = ints.next_list();
    const auto weight_dtype = ints.next_dtype();
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
    if (need_x && stem.has_value()) {  // through the rearranged filter, made again, and back from the form
      auto grad_form = call_conv_dgrad(grad_z, stem->filter(weight), stem->input_size(x_size[0]), stride,
                                       padding_pre, padding_post, dilation, groups, policy);
      grad_x = stem->input_grad(grad_form, x_size, x_dtype);
    } else if (need_x) {
      grad_x = call_conv_dgrad(grad_z, weight, x_size, stride, padding_pre, padding_post, dilation, groups, policy);
    }
    if (need_w && stem.has_value()) {  // from x rearranged again, and back from the form
      auto grad_form = call_conv_wgrad(grad_z, stem->input(x), stem->filter_size(weight_size[0]), stride,
                                       padding_pre, padding_post, dilation, groups, policy);
      grad_w = stem->filter_grad(grad_form, weight_size, weight_dtype);  // the gather casts to the weight's dtype
    } else if (need_w) {
      grad_w = call_conv_wgrad(grad_z, x, weight_size, stride, padding_pre, padding_post, dilation, groups, policy);
    }
    return {grad_x, grad_w, need_bias ? grad_bias : none, need_residual ? grad_z : none,
            none, none, none, none, none, none, none, none};
  }
};

// Whether a conv call has anything for autograd to record: grad mode on and a tensor requiring grad.
bool conv_records(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& residual) {
  auto requires_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  return at::GradMode::is_enabled() &&
         (x.requires_grad() || weight.requires_grad() || requires_grad(bias) || requires_grad(residual));
}

at::Tensor conv_bias_act_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                  const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                                  at::IntArrayRef padding_pre, at::IntArrayRef padding_post, at::IntArrayRef dilation,
                                  int64_t groups, int64_t activation, int64_t policy) {
  if (!conv_records(x, weight, bias, residual)) {
    // Nothing to record (inference): skip the autograd node and its saved state.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_conv_bias_act(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups,
                              activation, policy);
  }
  return ConvBiasActFunction::apply(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups,
                                    activation, policy, nullptr)[0];
}

// cudnn_fusion::stem_conv_bias_act: conv_bias_act's node, with the form (its conv at stride 1, no padding).
at::Tensor stem_conv_bias_act_autograd(const at::Tensor& x, const at::Tensor& weight,
                                       const std::optional<at::Tensor>& bias,
                                       const std::optional<at::Tensor>& residual, const at::Tensor& index,
                                       const at::Tensor& inverse, at::IntArrayRef form, int64_t activation,
                                       int64_t policy, std::optional<at::ScalarType> conv_dtype) {
  if (!conv_records(x, weight, bias, residual)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing to record
    return call_stem_conv_bias_act(x, weight, bias, residual, index, inverse, form, activation, policy, conv_dtype);
  }
  const StemForm stem(index, inverse, form, conv_dtype.value_or(weight.scalar_type()));
  return ConvBiasActFunction::apply(x, weight, bias, residual, kFormStride, kFormPadding, kFormPadding, kFormStride, 1,
                                    activation, policy, &stem)[0];
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, Autograd, m) {
  m.impl("conv_bias_act", &tcf::conv_bias_act_autograd);
  m.impl("stem_conv_bias_act", &tcf::stem_conv_bias_act_autograd);
}
