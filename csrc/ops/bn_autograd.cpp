// Autograd for cudnn_fusion::batch_norm_act, in C++ as the conv op's is: the Python register_autograd version cost
// ~180 us of host time per training step of one layer (profiled on H200), more than the layer's GPU time at 7x7 and
// 14x14. Saves x, y (only where the backward reads it: batch_norm_backward_reads_y), weight, bias, the saved
// statistics and the legacy API's reserve. Only y is differentiable; the statistics outputs are not. Below it, the
// autograd of cudnn_fusion::conv_batch_norm_act: a training Conv2d + BatchNorm layer as one op call with two nodes,
// the conv's (ConvFunction) and BatchNorm's (BatchNormActFunction, handed the op's results); and of
// cudnn_fusion::stem_conv_batch_norm_act, the same nodes with the conv in a stem's space-to-depth form (stem_form.h).
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/bn_ops.h"
#include "ops/channels_last_copy.h"
#include "ops/conv_bn_backward.h"
#include "ops/saved_ints.h"
#include "ops/stem_form.h"
#include "ops/stem_ops.h"
#include "ops/tensor_checks.h"

namespace tcf {

ConvBatchNormOutputs call_conv_batch_norm_act(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
    const at::Tensor& weight, const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::conv_batch_norm_act", "")
                       .typed<decltype(conv_batch_norm_act_forward)>();
  return op.call(x, conv_weight, conv_bias, stride, padding, dilation, groups, weight, bias, running_mean, running_var,
                 num_batches_tracked, residual, momentum, eps, activation, implementation, conv_dtype, policy,
                 negative_slope);
}

BatchNormUpdateOutputs call_batch_norm_act_update(const at::Tensor& x, const at::Tensor& weight,
                                                  const at::Tensor& bias, const at::Tensor& running_mean,
                                                  const at::Tensor& running_var,
                                                  const std::optional<at::Tensor>& num_batches_tracked,
                                                  const std::optional<at::Tensor>& residual, double momentum,
                                                  double eps, int64_t activation, int64_t implementation,
                                                  int64_t policy, double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act_update", "")
                       .typed<decltype(batch_norm_act_update_forward)>();
  return op.call(x, weight, bias, running_mean, running_var, num_batches_tracked, residual, momentum, eps, activation,
                 implementation, policy, negative_slope);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ForwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

ForwardOutputs call_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
                            const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
                            int64_t implementation, int64_t policy, double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act", "")
                       .typed<decltype(batch_norm_act_forward)>();
  return op.call(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation, implementation,
                 policy, negative_slope);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, const at::Tensor& reserve,
    double eps, int64_t activation, bool has_residual, int64_t implementation, int64_t policy,
    double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act_backward", "")
                       .typed<decltype(batch_norm_act_backward)>();
  // y is saved only with an activation (its mask); without one it is undefined here
  return op.call(grad_y, x, y.defined() ? std::optional<at::Tensor>(y) : std::nullopt, weight, bias, save_mean,
                 save_invstd, reserve, eps, activation, has_residual, implementation, policy, negative_slope);
}

// The two steps of BatchNorm's backward after a residual add (bn_ops.h: batch_norm_backward_in_two_steps)
std::tuple<at::Tensor, at::Tensor, at::Tensor> call_backward_reduce(
    const at::Tensor& grad_y, const at::Tensor& x, const at::Tensor& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, int64_t activation,
    double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act_backward_reduce", "")
                       .typed<decltype(batch_norm_act_backward_reduce)>();
  return op.call(grad_y, x, y.defined() ? std::optional<at::Tensor>(y) : std::nullopt, weight, bias, save_mean,
                 save_invstd, activation, negative_slope);
}

// The in-place variants, for a grad_y the node may overwrite (bn_ops.h: batch_norm_backward_may_overwrite)
std::tuple<at::Tensor, at::Tensor> call_backward_reduce_(const at::Tensor& grad_y, const at::Tensor& x,
                                                         const at::Tensor& y, const at::Tensor& weight,
                                                         const at::Tensor& bias, const at::Tensor& save_mean,
                                                         const at::Tensor& save_invstd, int64_t activation,
                                                         double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act_backward_reduce_", "")
                       .typed<decltype(batch_norm_act_backward_reduce_)>();
  return op.call(grad_y, x, y.defined() ? std::optional<at::Tensor>(y) : std::nullopt, weight, bias, save_mean,
                 save_invstd, activation, negative_slope);
}

std::tuple<at::Tensor, at::Tensor> call_backward_(const at::Tensor& grad_y, const at::Tensor& x,
                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                  const at::Tensor& save_mean, const at::Tensor& save_invstd,
                                                  int64_t activation, double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_act_backward_", "")
                       .typed<decltype(batch_norm_act_backward_)>();
  return op.call(grad_y, x, weight, bias, save_mean, save_invstd, activation, negative_slope);
}

at::Tensor call_backward_dx(const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd,
                            const at::Tensor& grad_weight, const at::Tensor& grad_bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::batch_norm_backward_dx", "")
                       .typed<decltype(batch_norm_backward_dx)>();
  return op.call(grad_z, x, weight, bias, save_mean, save_invstd, grad_weight, grad_bias);
}

variable_list as_list(ForwardOutputs&& out) {
  return {std::get<0>(out), std::get<1>(out), std::get<2>(out), std::get<3>(out), std::get<4>(out), std::get<5>(out)};
}

class BatchNormActFunction : public torch::autograd::Function<BatchNormActFunction> {
 public:
  // computed: the forward's outputs where the caller ran it already (the conv + BatchNorm op, whose one call
  // computes both layers and updates the running statistics in place): {y, save_mean, save_invstd, reserve}, the
  // node's outputs; nullptr: run cudnn_fusion::batch_norm_act here, whose six outputs are the node's.
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
                               const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& residual,
                               double momentum, double eps, int64_t activation, int64_t implementation,
                               int64_t policy, double negative_slope, const variable_list* computed) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto out = computed != nullptr ? *computed
                                   : as_list(call_forward(x, weight, bias, running_mean, running_var, residual,
                                                          momentum, eps, activation, implementation, policy,
                                                          negative_slope));
    // y only where the backward reads it for the activation's mask: saving it otherwise would make an in-place op
    // on the output (a following SiLU(inplace=True)) fail backward, where eager BatchNorm, which saves no output,
    // works; and it would keep y alive until this node's backward
    bool channels_last = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
    bool has_residual = residual.has_value() && residual->defined();
    const auto y = batch_norm_backward_reads_y(activation, has_residual, implementation, channels_last) ? out[0]
                                                                                                     : at::Tensor();
    ctx->save_for_backward({x, y, weight, bias, out[1], out[2], out.back()});
    ctx->mark_non_differentiable(variable_list(out.begin() + 1, out.end()));
    // The statistics outputs never get a gradient: materializing zeros for them cost five allocations and
    // fill kernels per backward (seen in the H200 profile). backward() handles an undefined grad_y itself.
    ctx->set_materialize_grads(false);
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["negative_slope"] = negative_slope;
    SavedInts()
        .add(activation)
        .add(implementation)
        .add(policy)
        .add(running_mean.has_value() && running_mean->defined())
        .add(has_residual)
        .save(ctx);
    return out;
  }

  // grad_outputs by reference: CppNode passes its own list (torch/csrc/autograd/custom_function.h), which holds the
  // engine's only reference to grad_y, so that the two-step backward can free grad_y between its steps.
  static variable_list backward(AutogradContext* ctx, variable_list& grad_outputs) {
    SavedIntsReader ints(ctx);  // in the order forward saved them
    const int64_t activation = ints.next();
    const int64_t implementation = ints.next();
    const int64_t policy = ints.next();
    const bool has_running_stats = ints.next_bool();
    const bool has_residual = ints.next_bool();
    at::Tensor none;
    // needs_input_grad counts only the tensors that were passed: absent running statistics shift the residual's.
    size_t edge = 0;
    bool need_x = ctx->needs_input_grad(edge++);
    bool need_weight = ctx->needs_input_grad(edge++);
    bool need_bias = ctx->needs_input_grad(edge++);
    if (has_running_stats) edge += 2;
    bool need_residual = has_residual && ctx->needs_input_grad(edge);
    auto grad_y = std::move(grad_outputs[0]);
    if (!grad_y.defined() || !(need_x || need_weight || need_bias || need_residual)) {
      return variable_list(13);  // one per forward argument, all undefined
    }
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &y = saved[1], &weight = saved[2], &bias = saved[3], &mean = saved[4],
               &invstd = saved[5];
    const double negative_slope = ctx->saved_data["negative_slope"].toDouble();
    at::Tensor grad_x, grad_residual, grad_weight, grad_bias;
    bool channels_last = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
    bool our_kernel = batch_norm_backward_in_our_kernel(activation, implementation, channels_last);
    // Our kernel reads a dense channels_last gradient: one in another layout or expanded (the mean's backward before
    // a classifier) is copied here, and the original freed where autograd held it alone, before the kernel's
    // scratch is allocated. Where nothing else holds grad_y then (or a copy), the result is written over it: eager's
    // ReLU backward allocates a new tensor there (and BatchNorm's another).
    if (our_kernel && !grad_y.is_contiguous(at::MemoryFormat::ChannelsLast)) grad_y = channels_last_contiguous(grad_y);
    bool overwrite = our_kernel && batch_norm_backward_may_overwrite(grad_y, x);
    if (batch_norm_backward_in_two_steps(activation, has_residual, implementation, channels_last)) {
      if (overwrite) {
        std::tie(grad_weight, grad_bias) =
            call_backward_reduce_(grad_y, x, y, weight, bias, mean, invstd, activation, negative_slope);
        grad_residual = std::move(grad_y);
      } else {
        std::tie(grad_residual, grad_weight, grad_bias) =
            call_backward_reduce(grad_y, x, y, weight, bias, mean, invstd, activation, negative_slope);
        grad_y.reset();  // freed here where autograd held it alone, before dx is allocated
      }
      if (need_x) grad_x = call_backward_dx(grad_residual, x, weight, bias, mean, invstd, grad_weight, grad_bias);
    } else if (overwrite && !has_residual) {
      std::tie(grad_weight, grad_bias) = call_backward_(grad_y, x, weight, bias, mean, invstd, activation,
                                                        negative_slope);
      grad_x = std::move(grad_y);
    } else {
      std::tie(grad_x, grad_residual, grad_weight, grad_bias) =
          call_backward(grad_y, x, y, weight, bias, mean, invstd, saved[6], ctx->saved_data["eps"].toDouble(),
                        activation, has_residual, implementation, policy, negative_slope);
    }
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
            none,
            none,
            none};
  }
};

ForwardOutputs batch_norm_act_autograd(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                       const std::optional<at::Tensor>& running_mean,
                                       const std::optional<at::Tensor>& running_var,
                                       const std::optional<at::Tensor>& residual, double momentum, double eps,
                                       int64_t activation, int64_t implementation, int64_t policy,
                                       double negative_slope) {
  auto requires_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  if (!at::GradMode::is_enabled() ||
      !(x.requires_grad() || weight.requires_grad() || bias.requires_grad() || requires_grad(residual))) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing to record
    return call_forward(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation,
                        implementation, policy, negative_slope);
  }
  auto out = BatchNormActFunction::apply(x, weight, bias, running_mean, running_var, residual, momentum, eps,
                                         activation, implementation, policy, negative_slope, nullptr);
  return {out[0], out[1], out[2], out[3], out[4], out[5]};
}

// batch_norm_act_update: the op runs below autograd (it writes the running statistics and the count in place), and
// BatchNormActFunction is handed its results, as in the conv + BatchNorm op below.
BatchNormUpdateOutputs batch_norm_act_update_autograd(const at::Tensor& x, const at::Tensor& weight,
                                                      const at::Tensor& bias, const at::Tensor& running_mean,
                                                      const at::Tensor& running_var,
                                                      const std::optional<at::Tensor>& num_batches_tracked,
                                                      const std::optional<at::Tensor>& residual, double momentum,
                                                      double eps, int64_t activation, int64_t implementation,
                                                      int64_t policy, double negative_slope) {
  auto requires_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  variable_list computed;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto out = call_batch_norm_act_update(x, weight, bias, running_mean, running_var, num_batches_tracked, residual,
                                          momentum, eps, activation, implementation, policy, negative_slope);
    if (!at::GradMode::is_enabled() ||
        !(x.requires_grad() || weight.requires_grad() || bias.requires_grad() || requires_grad(residual))) {
      return out;  // nothing to record
    }
    computed = {std::get<0>(out), std::get<1>(out), std::get<2>(out), std::get<3>(out)};
  }
  auto out = BatchNormActFunction::apply(x, weight, bias, running_mean, running_var, residual, momentum, eps,
                                         activation, implementation, policy, negative_slope, &computed);
  return {out[0], out[1], out[2], out[3]};
}

// The conv's autograd node in a training Conv2d + BatchNorm layer: its inputs are x, the conv weight and bias, its
// output the conv's output z (computed by the op below autograd, passed in as `computed` = {x cast, the filter as
// passed, z}). The casts to conv_dtype happen in the op's autograd kernel, so that their backward (the gradients cast
// back to x's and the weight's dtypes) is part of this node. Saves the cast x, as eager's conv does, and the filter
// as passed, not its cast as eager's autocast conv does: the parameter is held anyway, and a cast of every conv's
// filter held from forward to backward would add 2 bytes a parameter to the step's peak (resnet50: ~47 MB). The cast
// is made again in backward, one layer's at a time, where x's gradient reads it.
class ConvFunction : public torch::autograd::Function<ConvFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& conv_weight,
                               const std::optional<at::Tensor>& conv_bias, at::IntArrayRef stride,
                               at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                               const variable_list* computed, const StemForm* stem) {
    bool has_conv_bias = conv_bias.has_value() && conv_bias->defined();
    const auto& z = (*computed)[2];
    std::vector<at::Tensor> saved{(*computed)[0], (*computed)[1]};
    SavedInts ints;
    ints.add(stem != nullptr);
    if (stem != nullptr) {
      stem->save(ints, saved);
      ints.add(x.sizes()).add(conv_weight.sizes());
    }
    ctx->save_for_backward(saved);
    ctx->set_materialize_grads(false);
    ints.add(stride)
        .add(padding)
        .add(dilation)
        .add(groups)
        .add(static_cast<int64_t>(x.scalar_type()))
        .add(static_cast<int64_t>(conv_weight.scalar_type()))
        .add(static_cast<int64_t>(has_conv_bias ? conv_bias->scalar_type() : z.scalar_type()))
        .add(has_conv_bias)
        .save(ctx);
    return {z};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    SavedIntsReader ints(ctx);  // in the order forward saved them
    std::optional<StemForm> stem;
    std::vector<int64_t> x_size, weight_size;  // the form's: of x and the filter as passed
    if (ints.next_bool()) {
      stem = StemForm::load(ints, saved, 2);
      x_size = ints.next_list();
      weight_size = ints.next_list();
    }
    const auto stride = ints.next_list();
    const auto padding = ints.next_list();
    const auto dilation = ints.next_list();
    const int64_t groups = ints.next();
    const auto x_dtype = ints.next_dtype();
    const auto weight_dtype = ints.next_dtype();
    const auto bias_dtype = ints.next_dtype();
    const bool has_conv_bias = ints.next_bool();
    // needs_input_grad counts only the tensors that were passed (see BatchNormActFunction).
    bool need_x = ctx->needs_input_grad(0);
    bool need_conv_weight = ctx->needs_input_grad(1);
    bool need_conv_bias = has_conv_bias && ctx->needs_input_grad(2);
    variable_list grads(9);  // one per forward argument; undefined where there is none
    const auto& grad_z = grad_outputs[0];
    if (!grad_z.defined() || !(need_x || need_conv_weight || need_conv_bias)) return grads;
    // the filter (kept as passed) cast to the conv's dtype (x's) again; a stem's form rearranged again from x (kept
    // in the conv's dtype) and the filter. Where x needs no gradient (a stem's image, a first layer), the weight
    // gradient reads only the filter's sizes, dtype and layout: no cast and no gather for those.
    const auto x = stem.has_value() ? stem->input(saved[0]) : saved[0];
    at::Tensor weight;
    if (need_x) {
      weight = stem.has_value() ? stem->filter(saved[1]) : in_dtype(saved[1], x.scalar_type());
    } else {
      weight = stem.has_value() ? at::empty(stem->filter_size(weight_size[0]),
                                            x.options().memory_format(at::MemoryFormat::ChannelsLast))
                                : at::empty_like(saved[1], x.scalar_type());
    }
    auto [grad_x, grad_conv_weight, grad_conv_bias] =
        batch_norm_conv_backward(grad_z, x, weight, has_conv_bias, stride, padding, dilation, groups,
                                 {need_x, need_conv_weight, need_conv_bias}, weight_dtype);
    if (stem.has_value() && need_x) grad_x = stem->input_grad(grad_x, x_size, x_dtype);
    if (stem.has_value() && need_conv_weight) grad_conv_weight = stem->filter_grad(grad_conv_weight, weight_size,
                                                                                   weight_dtype);
    // back to the dtypes of the tensors passed in, as the casts' own backward would
    if (need_x) grads[0] = in_dtype(grad_x, x_dtype);
    if (need_conv_weight) grads[1] = in_dtype(grad_conv_weight, weight_dtype);
    if (need_conv_bias) grads[2] = in_dtype(grad_conv_bias, bias_dtype);
    return grads;
  }
};

// Whether a conv + BatchNorm call has anything for autograd to record: grad mode on and a tensor requiring grad.
bool conv_batch_norm_records(const at::Tensor& x, const at::Tensor& conv_weight,
                             const std::optional<at::Tensor>& conv_bias, const at::Tensor& weight,
                             const at::Tensor& bias, const std::optional<at::Tensor>& residual) {
  auto requires_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  return at::GradMode::is_enabled() && (x.requires_grad() || conv_weight.requires_grad() || requires_grad(conv_bias) ||
                                        weight.requires_grad() || bias.requires_grad() || requires_grad(residual));
}

ConvBatchNormOutputs conv_batch_norm_act_autograd(const at::Tensor& x, const at::Tensor& conv_weight,
                                                const std::optional<at::Tensor>& conv_bias, at::IntArrayRef stride,
                                                at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                                const at::Tensor& weight, const at::Tensor& bias,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var,
                                                const std::optional<at::Tensor>& num_batches_tracked,
                                                const std::optional<at::Tensor>& residual, double momentum, double eps,
                                                int64_t activation, int64_t implementation,
                                                std::optional<at::ScalarType> conv_dtype, int64_t policy,
                                                double negative_slope) {
  if (!conv_batch_norm_records(x, conv_weight, conv_bias, weight, bias, residual)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing to record
    return call_conv_batch_norm_act(x, conv_weight, conv_bias, stride, padding, dilation, groups, weight, bias,
                                    running_mean, running_var, num_batches_tracked, residual, momentum, eps,
                                    activation, implementation, conv_dtype, policy, negative_slope);
  }
  // One op call computes both layers; its results get two autograd nodes, the conv's and BatchNorm's, as eager's
  // conv and BatchNorm nodes (eager has five under autocast: the two casts, conv, BatchNorm, ReLU). Two, not one:
  // BatchNorm's saved input z and output y, and the incoming gradient, are freed as BatchNorm's node finishes, before
  // the conv's backward allocates its gradients. With one node they stayed alive through the conv's backward, and
  // resnet50's training step peaked 104 MiB above eager's (benchmarks/memory_by_phase.py, H200).
  variable_list conv_computed, bn_computed;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [x_cast, weight_cast, bias_cast] =
        cast_conv_operands(x, conv_weight, conv_bias, conv_dtype.value_or(x.scalar_type()));
    auto [y, z, save_mean, save_invstd, reserve] =
        call_conv_batch_norm_act(x_cast, weight_cast, bias_cast, stride, padding, dilation, groups, weight, bias,
                          running_mean, running_var, num_batches_tracked, residual, momentum, eps, activation,
                          implementation, conv_dtype, policy, negative_slope);
    conv_computed = {x_cast, conv_weight, z};  // the filter as passed: ConvFunction casts it again in backward
    bn_computed = {y, save_mean, save_invstd, reserve};
  }
  auto z = ConvFunction::apply(x, conv_weight, conv_bias, stride, padding, dilation, groups, &conv_computed,
                               nullptr)[0];
  auto out = BatchNormActFunction::apply(z, weight, bias, running_mean, running_var, residual, momentum, eps,
                                         activation, implementation, policy, negative_slope, &bn_computed);
  return {out[0], z, out[1], out[2], out[3]};
}

// cudnn_fusion::stem_conv_batch_norm_act: conv_batch_norm_act's two nodes, the conv's with the form (its conv at
// stride 1, no padding). The conv's node keeps x in the conv's dtype (as eager's autocast conv) and the filter as
// passed (eager keeps its cast), and rearranges both again in backward.
ConvBatchNormOutputs stem_conv_batch_norm_act_autograd(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form, const at::Tensor& weight,
    const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope) {
  if (!conv_batch_norm_records(x, conv_weight, conv_bias, weight, bias, residual)) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing to record
    return call_stem_conv_batch_norm_act(x, conv_weight, conv_bias, index, inverse, form, weight, bias, running_mean,
                                         running_var, num_batches_tracked, residual, momentum, eps, activation,
                                         implementation, conv_dtype, policy, negative_slope);
  }
  const auto dtype = conv_dtype.value_or(x.scalar_type());
  const StemForm stem(index, inverse, form, dtype);
  variable_list conv_computed, bn_computed;
  {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [x_form, weight_form, bias_cast] = cast_conv_operands(stem.input(x), stem.filter(conv_weight), conv_bias,
                                                               dtype);
    auto [y, z, save_mean, save_invstd, reserve] =
        call_conv_batch_norm_act(x_form, weight_form, bias_cast, kFormStride, kFormPadding, kFormStride, 1, weight,
                                 bias, running_mean, running_var, num_batches_tracked, residual, momentum, eps,
                                 activation, implementation, conv_dtype, policy, negative_slope);
    conv_computed = {in_dtype(x, dtype), conv_weight, z};
    bn_computed = {y, save_mean, save_invstd, reserve};
  }
  auto z = ConvFunction::apply(x, conv_weight, conv_bias, kFormStride, kFormPadding, kFormStride, 1, &conv_computed,
                               &stem)[0];
  auto out = BatchNormActFunction::apply(z, weight, bias, running_mean, running_var, residual, momentum, eps,
                                         activation, implementation, policy, negative_slope, &bn_computed);
  return {out[0], z, out[1], out[2], out[3]};
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, Autograd, m) {
  m.impl("batch_norm_act", &tcf::batch_norm_act_autograd);
  m.impl("batch_norm_act_update", &tcf::batch_norm_act_update_autograd);
  m.impl("conv_batch_norm_act", &tcf::conv_batch_norm_act_autograd);
  m.impl("stem_conv_batch_norm_act", &tcf::stem_conv_batch_norm_act_autograd);
}
