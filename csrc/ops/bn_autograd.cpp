// Autograd for cudnn_fusion::batch_norm_act, in C++ as the conv op's is: the Python register_autograd version cost
// ~180 us of host time per training step of one layer (profiled on H200), more than the layer's GPU time at 7x7 and
// 14x14. Saves x, y (only where the backward reads it: batch_norm_backward_reads_y), weight, bias, the saved
// statistics and the legacy API's reserve. Only y is differentiable; the statistics outputs are not. Below it, the autograd of
// cudnn_fusion::conv_batch_norm_act: a training Conv2d + BatchNorm layer as one node.
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/bn_ops.h"
#include "ops/depthwise_ops.h"

namespace tcf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

ForwardOutputs call_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
                            const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
                            int64_t implementation, int64_t policy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act", "")
                       .typed<decltype(batch_norm_act_forward)>();
  return op.call(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation, implementation,
                 policy);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, const at::Tensor& reserve,
    double eps, int64_t activation, bool has_residual, int64_t implementation, int64_t policy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act_backward", "")
                       .typed<decltype(batch_norm_act_backward)>();
  // y is saved only with an activation (its mask); without one it is undefined here
  return op.call(grad_y, x, y.defined() ? std::optional<at::Tensor>(y) : std::nullopt, weight, bias, save_mean,
                 save_invstd, reserve, eps, activation, has_residual, implementation, policy);
}

variable_list as_list(ForwardOutputs&& out) {
  return {std::get<0>(out), std::get<1>(out), std::get<2>(out), std::get<3>(out), std::get<4>(out), std::get<5>(out)};
}

class BatchNormActFunction : public torch::autograd::Function<BatchNormActFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& residual,
                               double momentum, double eps, int64_t activation, int64_t implementation,
                               int64_t policy) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto out = as_list(call_forward(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation,
                                    implementation, policy));
    // y only where the backward reads it for the activation's mask: saving it otherwise would make an in-place op
    // on the output (a following SiLU(inplace=True)) fail backward, where eager BatchNorm, which saves no output,
    // works; and it would keep y alive until this node's backward
    bool channels_last = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
    bool has_residual = residual.has_value() && residual->defined();
    const auto y = batch_norm_backward_reads_y(activation, has_residual, implementation, channels_last) ? out[0]
                                                                                                     : at::Tensor();
    ctx->save_for_backward({x, y, weight, bias, out[1], out[2], out[5]});
    ctx->mark_non_differentiable({out[1], out[2], out[3], out[4], out[5]});
    // The five statistics outputs never get a gradient: materializing zeros for them cost five allocations and
    // fill kernels per backward (seen in the H200 profile). backward() handles an undefined grad_y itself.
    ctx->set_materialize_grads(false);
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["implementation"] = implementation;
    ctx->saved_data["policy"] = policy;
    ctx->saved_data["has_running_stats"] = running_mean.has_value() && running_mean->defined();
    ctx->saved_data["has_residual"] = has_residual;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    bool has_residual = ctx->saved_data["has_residual"].toBool();
    bool has_running_stats = ctx->saved_data["has_running_stats"].toBool();
    at::Tensor none;
    // needs_input_grad counts only the tensors that were passed: absent running statistics shift the residual's.
    size_t edge = 0;
    bool need_x = ctx->needs_input_grad(edge++);
    bool need_weight = ctx->needs_input_grad(edge++);
    bool need_bias = ctx->needs_input_grad(edge++);
    if (has_running_stats) edge += 2;
    bool need_residual = has_residual && ctx->needs_input_grad(edge);
    const auto& grad_y = grad_outputs[0];
    if (!grad_y.defined() || !(need_x || need_weight || need_bias || need_residual)) {
      return {none, none, none, none, none, none, none, none, none, none, none};
    }
    auto saved = ctx->get_saved_variables();
    auto [grad_x, grad_residual, grad_weight, grad_bias] =
        call_backward(grad_y, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[6],
                      ctx->saved_data["eps"].toDouble(), ctx->saved_data["activation"].toInt(), has_residual,
                      ctx->saved_data["implementation"].toInt(), ctx->saved_data["policy"].toInt());
    return {need_x ? grad_x : none,
            need_weight ? grad_weight : none,
            need_bias ? grad_bias : none,
            none,
            none,
            need_residual ? grad_residual : none,
            none,
            none,
            none,
            none,
            none};
  }
};

ForwardOutputs batch_norm_act_autograd(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                       const std::optional<at::Tensor>& running_mean,
                                       const std::optional<at::Tensor>& running_var,
                                       const std::optional<at::Tensor>& residual, double momentum, double eps,
                                       int64_t activation, int64_t implementation, int64_t policy) {
  auto requires_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  if (!at::GradMode::is_enabled() ||
      !(x.requires_grad() || weight.requires_grad() || bias.requires_grad() || requires_grad(residual))) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing to record
    return call_forward(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation,
                        implementation, policy);
  }
  auto out = BatchNormActFunction::apply(x, weight, bias, running_mean, running_var, residual, momentum, eps,
                                         activation, implementation, policy);
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

using ConvForwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

ConvForwardOutputs call_conv_forward(const at::Tensor& x, const at::Tensor& conv_weight,
                                     const std::optional<at::Tensor>& conv_bias, at::IntArrayRef stride,
                                     at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                     const at::Tensor& weight, const at::Tensor& bias,
                                     const std::optional<at::Tensor>& running_mean,
                                     const std::optional<at::Tensor>& running_var,
                                     const std::optional<at::Tensor>& num_batches_tracked,
                                     const std::optional<at::Tensor>& residual, double momentum, double eps,
                                     int64_t activation, int64_t implementation,
                                     std::optional<at::ScalarType> conv_dtype, int64_t policy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::conv_batch_norm_act", "")
                       .typed<decltype(conv_batch_norm_act_forward)>();
  return op.call(x, conv_weight, conv_bias, stride, padding, dilation, groups, weight, bias, running_mean, running_var,
                 num_batches_tracked, residual, momentum, eps, activation, implementation, conv_dtype, policy);
}

// One autograd node for the whole training layer, where eager records five under autocast (the casts of the input
// and weight, convolution, batch_norm, relu): fewer nodes, less host time per backward. The casts to conv_dtype are
// done here so that their backward (the gradients cast back to x's and the weight's dtypes) is part of this node.
// Saves what eager saves, or less: the cast x and weight (the conv's backward), z (BatchNorm's input), y (the
// activation's mask, only where the backward reads it: batch_norm_backward_reads_y; eager's ReLU saves it always),
// BatchNorm's scale, shift and saved statistics, and the legacy API's reserve.
class ConvBatchNormActFunction : public torch::autograd::Function<ConvBatchNormActFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& conv_weight,
                               const std::optional<at::Tensor>& conv_bias, at::IntArrayRef stride,
                               at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                               const at::Tensor& weight, const at::Tensor& bias,
                               const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var,
                               const std::optional<at::Tensor>& num_batches_tracked,
                               const std::optional<at::Tensor>& residual, double momentum, double eps,
                               int64_t activation, int64_t implementation, std::optional<at::ScalarType> conv_dtype,
                               int64_t policy) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    bool has_conv_bias = conv_bias.has_value() && conv_bias->defined();
    auto dtype = conv_dtype.value_or(x.scalar_type());
    auto [x_cast, weight_cast, bias_cast] = cast_conv_operands(x, conv_weight, conv_bias, dtype);
    auto [y, z, save_mean, save_invstd, reserve] =
        call_conv_forward(x_cast, weight_cast, bias_cast, stride, padding, dilation, groups, weight, bias,
                          running_mean, running_var, num_batches_tracked, residual, momentum, eps, activation,
                          implementation, dtype, policy);
    bool has_residual = residual.has_value() && residual->defined();
    bool reads_y = batch_norm_backward_reads_y(activation, has_residual, implementation,
                                               z.suggest_memory_format() == at::MemoryFormat::ChannelsLast);
    ctx->save_for_backward({x_cast, weight_cast, z, reads_y ? y : at::Tensor(), weight, bias, save_mean, save_invstd,
                            reserve});  // y: see BatchNormActFunction
    ctx->mark_non_differentiable({z, save_mean, save_invstd, reserve});
    ctx->set_materialize_grads(false);  // only y has a gradient
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["dilation"] = dilation.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["implementation"] = implementation;
    ctx->saved_data["policy"] = policy;
    ctx->saved_data["x_dtype"] = x.scalar_type();
    ctx->saved_data["weight_dtype"] = conv_weight.scalar_type();
    ctx->saved_data["bias_dtype"] = has_conv_bias ? conv_bias->scalar_type() : dtype;
    ctx->saved_data["has_conv_bias"] = has_conv_bias;
    auto passed = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); };
    ctx->saved_data["statistics_passed"] =  // tensors between BatchNorm's bias and the residual
        static_cast<int64_t>(passed(running_mean) + passed(running_var) + passed(num_batches_tracked));
    ctx->saved_data["has_residual"] = has_residual;
    return {y, z, save_mean, save_invstd, reserve};
  }

  // grad_outputs by reference: CppNode::apply passes its own list (torch/csrc/autograd/custom_function.h), which
  // holds the engine's only reference to grad_y. Dropping it once BatchNorm's backward has read it frees grad_y before
  // the conv's backward allocates its gradients, as eager frees the ReLU's incoming gradient after its node.
  static variable_list backward(AutogradContext* ctx, variable_list& grad_outputs) {
    bool has_conv_bias = ctx->saved_data["has_conv_bias"].toBool();
    bool has_residual = ctx->saved_data["has_residual"].toBool();
    // needs_input_grad counts only the tensors that were passed (see BatchNormActFunction).
    size_t edge = 0;
    bool need_x = ctx->needs_input_grad(edge++);
    bool need_conv_weight = ctx->needs_input_grad(edge++);
    bool need_conv_bias = has_conv_bias && ctx->needs_input_grad(edge++);
    bool need_weight = ctx->needs_input_grad(edge++);
    bool need_bias = ctx->needs_input_grad(edge++);
    edge += ctx->saved_data["statistics_passed"].toInt();
    bool need_residual = has_residual && ctx->needs_input_grad(edge);
    variable_list grads(19);  // one per forward argument; undefined where there is none
    auto grad_y = std::move(grad_outputs[0]);  // the only reference: reset below
    bool need_conv = need_x || need_conv_weight || need_conv_bias;
    if (!grad_y.defined() || !(need_conv || need_weight || need_bias || need_residual)) return grads;
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &conv_weight = saved[1], &z = saved[2], &y = saved[3];
    auto [grad_z, grad_residual, grad_weight, grad_bias] =
        call_backward(grad_y, z, y, saved[4], saved[5], saved[6], saved[7], saved[8],
                      ctx->saved_data["eps"].toDouble(), ctx->saved_data["activation"].toInt(), has_residual,
                      ctx->saved_data["implementation"].toInt(), ctx->saved_data["policy"].toInt());
    grad_y.reset();
    if (need_conv) {
      auto [grad_x, grad_conv_weight, grad_conv_bias] = batch_norm_conv_backward(
          grad_z, x, conv_weight, has_conv_bias, ctx->saved_data["stride"].toIntVector(),
          ctx->saved_data["padding"].toIntVector(), ctx->saved_data["dilation"].toIntVector(),
          ctx->saved_data["groups"].toInt(), {need_x, need_conv_weight, need_conv_bias});
      // back to the dtypes of the tensors passed in, as the casts' own backward would
      if (need_x) grads[0] = grad_x.to(ctx->saved_data["x_dtype"].toScalarType());
      if (need_conv_weight) grads[1] = grad_conv_weight.to(ctx->saved_data["weight_dtype"].toScalarType());
      if (need_conv_bias) grads[2] = grad_conv_bias.to(ctx->saved_data["bias_dtype"].toScalarType());
    }
    if (need_weight) grads[7] = grad_weight;
    if (need_bias) grads[8] = grad_bias;
    if (need_residual) grads[12] = grad_residual;
    return grads;
  }
};

ConvForwardOutputs conv_batch_norm_act_autograd(const at::Tensor& x, const at::Tensor& conv_weight,
                                                const std::optional<at::Tensor>& conv_bias, at::IntArrayRef stride,
                                                at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                                const at::Tensor& weight, const at::Tensor& bias,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var,
                                                const std::optional<at::Tensor>& num_batches_tracked,
                                                const std::optional<at::Tensor>& residual, double momentum, double eps,
                                                int64_t activation, int64_t implementation,
                                                std::optional<at::ScalarType> conv_dtype, int64_t policy) {
  auto requires_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || conv_weight.requires_grad() || requires_grad(conv_bias) ||
                                       weight.requires_grad() || bias.requires_grad() || requires_grad(residual))) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing to record
    return call_conv_forward(x, conv_weight, conv_bias, stride, padding, dilation, groups, weight, bias, running_mean,
                             running_var, num_batches_tracked, residual, momentum, eps, activation, implementation,
                             conv_dtype, policy);
  }
  auto out = ConvBatchNormActFunction::apply(x, conv_weight, conv_bias, stride, padding, dilation, groups, weight,
                                             bias, running_mean, running_var, num_batches_tracked, residual, momentum,
                                             eps, activation, implementation, conv_dtype, policy);
  return {out[0], out[1], out[2], out[3], out[4]};
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, Autograd, m) {
  m.impl("batch_norm_act", &tcf::batch_norm_act_autograd);
  m.impl("conv_batch_norm_act", &tcf::conv_batch_norm_act_autograd);
}
