#include "ops/conv_ops.h"

#include "core/requirements.h"
#include "ops/depthwise_ops.h"
#include "core/engine_policy.h"
#include "ops/kernel_launch.h"
#include "ops/run_graph.h"
#include "ops/tensor_checks.h"

#include <atomic>
#include <limits>

#include <c10/core/DeviceGuard.h>

#include "kernels/relu_bias_backward_kernel.h"

namespace tcf {

namespace {

std::array<int64_t, 2> pair_arg(at::IntArrayRef values, const char* name) {
  TORCH_CHECK(values.size() == 2, "cudnn_fusion: ", name, " must have 2 values (height, width), got ",
              values.size(), ": ", values);
  return {values[0], values[1]};
}

ConvProblem make_problem(const at::Tensor& grad_or_x, at::IntArrayRef x_size, at::IntArrayRef w_size,
                         at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                         at::IntArrayRef dilation, int64_t groups, bool channels_last) {
  ConvProblem p;
  p.dtype = grad_or_x.scalar_type();
  p.device = grad_or_x.device().index();
  p.channels_last = channels_last;
  p.x_size = size4(x_size);
  p.w_size = size4(w_size);
  p.stride = pair_arg(stride, "stride");
  p.pad_pre = pair_arg(padding_pre, "padding_pre");
  p.pad_post = pair_arg(padding_post, "padding_post");
  p.dilation = pair_arg(dilation, "dilation");
  p.groups = groups;
  check_conv_problem(p);
  return p;
}

// The ATen composition each graph stands for, for configurations cuDNN refused at run time. Asymmetric
// padding ('same' with an even kernel) is applied by padding x explicitly.
bool symmetric(const ConvProblem& p) { return p.pad_pre == p.pad_post; }

at::Tensor pad_input(const at::Tensor& x, const ConvProblem& p) {
  return at::constant_pad_nd(x, {p.pad_pre[1], p.pad_post[1], p.pad_pre[0], p.pad_post[0]}, 0);
}

at::IntArrayRef aten_padding(const ConvProblem& p) {
  static const std::array<int64_t, 2> zero{0, 0};
  return symmetric(p) ? at::IntArrayRef(p.pad_pre) : at::IntArrayRef(zero);
}

at::Tensor fallback_forward(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias,
                            const std::optional<at::Tensor>& residual, const ConvProblem& p) {
  auto input = symmetric(p) ? x : pad_input(x, p);
  auto y = at::convolution(input, w, bias, p.stride, aten_padding(p), p.dilation, false, {0, 0}, p.groups);
  if (residual.has_value()) y.add_(*residual);
  apply_activation_(y, p.activation, 0.0);  // the conv ops' activations: none, ReLU, ReLU6
  return y.contiguous(memory_format(p.channels_last));
}

at::Tensor fallback_dgrad(const at::Tensor& dz, const at::Tensor& w, const ConvProblem& p) {
  auto padded = p.x_size;
  if (!symmetric(p)) {
    padded[2] += p.pad_pre[0] + p.pad_post[0];
    padded[3] += p.pad_pre[1] + p.pad_post[1];
  }
  // convolution_backward reads only the shape and layout of the input when it computes grad_input alone.
  auto shape_only = at::empty(padded, dz.options().memory_format(memory_format(p.channels_last)));
  auto dx = std::get<0>(at::convolution_backward(dz, shape_only, w, std::nullopt, p.stride, aten_padding(p),
                                                 p.dilation, false, {0, 0}, p.groups, {true, false, false}));
  if (!symmetric(p)) {
    dx = dx.slice(2, p.pad_pre[0], p.pad_pre[0] + p.x_size[2]).slice(3, p.pad_pre[1], p.pad_pre[1] + p.x_size[3]);
  }
  return dx.contiguous(memory_format(p.channels_last));
}

at::Tensor fallback_wgrad(const at::Tensor& dz, const at::Tensor& x, const ConvProblem& p) {
  auto input = symmetric(p) ? x : pad_input(x, p);
  // convolution_backward reads only the shape and layout of the weight when it computes grad_weight alone.
  auto shape_only = at::empty(p.w_size, x.options().memory_format(memory_format(p.channels_last)));
  auto dw = std::get<1>(at::convolution_backward(dz, input, shape_only, std::nullopt, p.stride, aten_padding(p),
                                                 p.dilation, false, {0, 0}, p.groups, {false, true, false}));
  return dw.contiguous(memory_format(p.channels_last));
}

bool has_epilogue(const ConvShape& p) { return p.has_bias || p.has_residual || p.activation != Activation::kNone; }

// Our NHWC kernel takes ReLU backward + bias gradient when the channels fill 16-byte vectors.
bool use_relu_bias_kernel(bool channels_last, at::ScalarType dtype, int64_t channels) {
  return channels_last && channels % (16 / static_cast<int64_t>(c10::elementSize(dtype))) == 0;
}

// Our NHWC kernel: writes dz and returns the bias gradient (in out's dtype).
at::Tensor relu_bias_backward_with_kernel(const at::Tensor& dy, const at::Tensor& y, const at::Tensor& dz,
                                          Activation activation) {
  int64_t k = y.size(1);
  int device = y.device().index();
  int multiprocessors = multiprocessor_count(device);
  int64_t rows = y.numel() / k;
  int64_t parts = relu_bias_backward_partial_rows(rows, k, static_cast<int>(y.element_size()), multiprocessors);
  auto partial = at::empty({parts, k}, y.options().dtype(at::kFloat));
  auto dbias = at::empty({k}, y.options());
  poison_output(dz);
  poison_output(dbias);
  auto status = launch_relu_bias_backward_nhwc(element_type(y.scalar_type()), dy.data_ptr(), y.data_ptr(),
                                               dz.data_ptr(), partial.data_ptr<float>(), dbias.data_ptr(), rows, k,
                                               activation == Activation::kRelu6, multiprocessors, current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the relu_bias_backward kernel failed to launch: ",
              cudaGetErrorString(status));
  return dbias;
}

bool run_graph(GraphKind kind, const ConvProblem& p, const std::array<int8_t, 5>& alignment,
               std::unordered_map<int64_t, void*> pointers, std::initializer_list<at::Tensor> outputs,
               const at::Device& device, const std::function<void()>& aten) {
  return run_cached_graph(make_graph_key(kind, p, alignment), std::move(pointers), outputs, device, aten);
}

// The forward graph's plan for p, looked up once. ReLU6 runs in the graph (ReLU, then the minimum with 6); where cuDNN
// refuses that graph, the plan of the graph without the activation, and `clamp_after` is set: ReLU6 then runs after
// it, as a clamp.
std::shared_ptr<const CachedPlan> forward_plan(const ConvProblem& p, const std::array<int8_t, 5>& alignment,
                                               bool& clamp_after) {
  auto plan = get_plan(make_graph_key(GraphKind::kConvBiasAct, p, alignment));
  clamp_after = p.activation == Activation::kRelu6 && !plan->ok();
  if (!clamp_after) return plan;
  ConvProblem without = p;
  without.activation = Activation::kNone;
  return get_plan(make_graph_key(GraphKind::kConvBiasAct, without, alignment));
}

void check_grad_z(const at::Tensor& grad_z, const ConvProblem& p) {
  TORCH_CHECK(grad_z.sizes() == at::IntArrayRef(p.y_size()), "cudnn_fusion: grad_z must have the conv output's shape ",
              at::IntArrayRef(p.y_size()), ", got ", grad_z.sizes());
}

// dgrad (operand: the weight; out: dx of out_size) and wgrad (operand: x; out: dw), after their argument checks, in
// `dtype`: grad_z's, or float32 for a wgrad (our depthwise kernel writes its float sums as they are, unrounded; the
// other paths compute in grad_z's dtype and cast).
at::Tensor conv_gradient(GraphKind kind, const at::Tensor& grad_z, const at::Tensor& operand, at::IntArrayRef out_size,
                         const ConvProblem& p, at::ScalarType dtype) {
  bool dgrad = kind == GraphKind::kConvDgrad;
  check_grad_z(grad_z, p);
  c10::DeviceGuard guard(grad_z.device());
  auto format = memory_format(p.channels_last);
  auto dz = grad_z.contiguous(format);
  auto operand_dense = operand.contiguous(format);
  auto options = grad_z.options().memory_format(format);
  if (c10::multiply_integers(out_size) == 0) return at::empty(out_size, options.dtype(dtype));
  // an empty batch contributes nothing to the weight gradient
  if (dz.numel() == 0) return at::zeros(out_size, options.dtype(dtype));
  auto fallback = [&]() { return dgrad ? fallback_dgrad(dz, operand_dense, p) : fallback_wgrad(dz, operand_dense, p); };
  auto aten = [&]() { return in_dtype(fallback(), dtype); };
  // our kernel or PyTorch's, as depthwise_kernel_steps measured them; PyTorch's allocates its own output
  bool depthwise = depthwise_kernel_takes(p);
  if (depthwise && !dgrad) {
    const int plan = depthwise_kernel_steps(p, false).wgrad
                         ? depthwise_wgrad_choice(dz, operand_dense, p, dtype, [&]() { aten(); })
                         : -1;
    auto dw = plan >= 0 ? depthwise_conv_wgrad(dz, operand_dense, p, dtype, plan) : at::Tensor();
    return dw.defined() ? dw : aten();
  }
  auto depthwise_dgrad = depthwise ? depthwise_kernel_steps(p, false).dgrad : DepthwiseDgrad::kPyTorch;
  if (depthwise && depthwise_dgrad == DepthwiseDgrad::kOurKernel) {
    auto dx = at::empty(out_size, options);
    if (depthwise_conv_dgrad(dz, operand_dense, p, dx)) return dx;
    depthwise_dgrad = depthwise_dgrad_without_vectors(p.dtype);  // an operand off a 16-byte boundary
  }
  if (depthwise_dgrad == DepthwiseDgrad::kTurnedForward) return depthwise_dgrad_as_forward(dz, operand_dense, p);
  if (depthwise) return aten();
  auto out = at::empty(out_size, options);
  std::unordered_map<int64_t, void*> pointers{{kUidDz, dz.data_ptr()},
                                              {dgrad ? kUidW : kUidX, operand_dense.data_ptr()},
                                              {dgrad ? kUidDx : kUidDw, out.data_ptr()}};
  if (!run_graph(kind, p, {alignment_of(dz), alignment_of(operand_dense), alignment_of(out), 0, 0}, std::move(pointers),
                 {out}, grad_z.device(), [&]() { fallback(); })) {
    return aten();
  }
  return in_dtype(out, dtype);
}

}  // namespace

at::Tensor conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                         at::IntArrayRef padding_pre, at::IntArrayRef padding_post, at::IntArrayRef dilation,
                         int64_t groups, int64_t activation, int64_t policy) {
  check_4d_cuda(x, "x", "[N, C, H, W]");
  check_4d_cuda(weight, "weight", "[out_channels, in_channels / groups, kH, kW]");
  check_like(weight, "weight", x);
  bool channels_last = use_channels_last(x, weight);
  auto p = make_problem(x, x.sizes(), weight.sizes(), stride, padding_pre, padding_post, dilation, groups,
                        channels_last);
  p.has_bias = bias.has_value();
  p.has_residual = residual.has_value();
  p.activation = activation_from(activation);
  p.policy = policy;
  auto y_size = p.y_size();
  if (bias.has_value()) {
    check_like(*bias, "bias", x);
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == y_size[1], "cudnn_fusion: bias must have shape [",
                y_size[1], "] (out_channels), got ", bias->sizes());
  }
  if (residual.has_value()) {
    check_like(*residual, "residual", x);
    TORCH_CHECK(residual->sizes() == at::IntArrayRef(y_size), "cudnn_fusion: residual must have the output's shape ",
                at::IntArrayRef(y_size), ", got ", residual->sizes());
  }

  c10::DeviceGuard guard(x.device());
  auto format = memory_format(channels_last);
  auto x_dense = x.contiguous(format);
  auto w_dense = weight.contiguous(format);
  auto bias_dense = bias.has_value() ? bias->contiguous() : at::Tensor();
  auto residual_dense = residual.has_value() ? residual->contiguous(format) : at::Tensor();
  auto options = x.options().memory_format(format);
  if (c10::multiply_integers(y_size) == 0) return at::empty(y_size, options);
  // our kernel or PyTorch's, as depthwise_kernel_steps measured them; PyTorch's allocates its own output
  bool depthwise = depthwise_kernel_takes(p);
  if (depthwise && !depthwise_kernel_steps(p, has_epilogue(p)).forward) {
    return fallback_forward(x_dense, w_dense, bias, residual, p);
  }
  auto y = at::empty(y_size, options);
  if (depthwise) {
    depthwise_conv_forward(x_dense, w_dense, bias_dense, residual_dense, p, static_cast<int>(p.activation), y);
    return y;
  }

  std::unordered_map<int64_t, void*> pointers{{kUidX, x_dense.data_ptr()}, {kUidW, w_dense.data_ptr()}, {kUidY, y.data_ptr()}};
  if (p.has_bias) pointers[kUidBias] = bias_dense.data_ptr();
  if (p.has_residual) pointers[kUidResidual] = residual_dense.data_ptr();
  std::array<int8_t, 5> alignment{alignment_of(x_dense), alignment_of(w_dense), alignment_of(bias_dense),
                                  alignment_of(residual_dense), alignment_of(y)};
  auto aten = [&]() { fallback_forward(x_dense, w_dense, bias, residual, p); };
  bool clamp_after = false;
  auto plan = forward_plan(p, alignment, clamp_after);
  if (!run_cached_graph(plan, GraphKind::kConvBiasAct, std::move(pointers), {y}, x.device(), aten)) {
    return fallback_forward(x_dense, w_dense, bias, residual, p);
  }
  if (clamp_after) apply_activation_(y, p.activation, 0.0);
  return y;
}

std::string relu_bias_backward_without_graph(const ConvProblem& p) {
  const auto vector = std::to_string(16 / c10::elementSize(p.dtype));
  if (use_relu_bias_kernel(p.channels_last, p.dtype, p.w_size[0])) {
    return "our NHWC kernel runs it (channels_last, channels a multiple of " + vector + "), not a cuDNN graph";
  }
  if (p.activation == Activation::kRelu6) {
    return "ReLU6's backward runs in our kernel for channels_last with channels a multiple of " + vector +
           " (no cuDNN graph for it): eager's composition";
  }
  return "";
}

std::tuple<at::Tensor, at::Tensor> relu_bias_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                                      int64_t activation, int64_t policy) {
  auto act = activation_from(activation);
  TORCH_CHECK(act != Activation::kNone, "cudnn_fusion: relu_bias_backward's activation must be 1 (ReLU) or 2 (ReLU6), "
              "got 0");
  check_4d_cuda(out, "out", "[N, K, H, W]");
  check_like(grad_out, "grad_out", out);
  TORCH_CHECK(grad_out.sizes() == out.sizes(), "cudnn_fusion: grad_out must have out's shape ", out.sizes(),
              ", got ", grad_out.sizes());
  c10::DeviceGuard guard(out.device());
  bool channels_last = out.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  auto format = memory_format(channels_last);
  auto dy = grad_out.contiguous(format);
  auto y = out.contiguous(format);
  int64_t k = out.size(1);
  auto dz = at::empty(out.sizes(), out.options().memory_format(format));
  if (out.numel() == 0) return {dz, at::zeros({k}, out.options())};

  if (use_relu_bias_kernel(channels_last, out.scalar_type(), k) && alignment_of(dy) == 16 && alignment_of(y) == 16 &&
      alignment_of(dz) == 16) {
    return {dz, relu_bias_backward_with_kernel(dy, y, dz, act)};
  }
  if (act == Activation::kRelu6) {  // no cuDNN graph for ReLU6's backward: eager's composition
    auto grad_z = activation_backward(dy, y, act);
    return {grad_z, grad_z.sum({0, 2, 3}, false, at::kFloat).to(out.scalar_type())};
  }

  auto dbias = at::empty({k}, out.options().dtype(at::kFloat));
  auto key = make_relu_bias_key(out.scalar_type(), channels_last, out.device().index(), size4(out.sizes()), policy,
                                {alignment_of(dy), alignment_of(y), alignment_of(dz), alignment_of(dbias), 0});
  std::unordered_map<int64_t, void*> pointers{
      {kUidDy, dy.data_ptr()}, {kUidY, y.data_ptr()}, {kUidDz, dz.data_ptr()}, {kUidDbias, dbias.data_ptr()}};
  auto aten = [&]() { at::threshold_backward(dy, y, 0).sum({0, 2, 3}, false, at::kFloat); };
  if (!run_cached_graph(key, std::move(pointers), {dz, dbias}, out.device(), aten)) {
    auto grad_z = at::threshold_backward(dy, y, 0);
    return {grad_z, grad_z.sum({0, 2, 3}, false, at::kFloat).to(out.scalar_type())};
  }
  return {dz, dbias.to(out.scalar_type())};
}

at::Tensor conv_dgrad(const at::Tensor& grad_z, const at::Tensor& weight, at::IntArrayRef x_size,
                      at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                      at::IntArrayRef dilation, int64_t groups, int64_t policy) {
  check_4d_cuda(grad_z, "grad_z", "[N, K, H_out, W_out]");
  check_4d_cuda(weight, "weight", "[out_channels, in_channels / groups, kH, kW]");
  check_like(weight, "weight", grad_z);
  TORCH_CHECK(x_size.size() == 4, "cudnn_fusion: x_size must have 4 values [N, C, H, W], got ", x_size);
  auto p = make_problem(grad_z, x_size, weight.sizes(), stride, padding_pre, padding_post, dilation, groups,
                        use_channels_last(grad_z, weight));
  p.policy = policy;
  return conv_gradient(GraphKind::kConvDgrad, grad_z, weight, x_size, p, grad_z.scalar_type());
}

at::Tensor conv_wgrad(const at::Tensor& grad_z, const at::Tensor& x, at::IntArrayRef weight_size,
                      at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                      at::IntArrayRef dilation, int64_t groups, int64_t policy,
                      std::optional<at::ScalarType> out_dtype) {
  check_4d_cuda(grad_z, "grad_z", "[N, K, H_out, W_out]");
  check_4d_cuda(x, "x", "[N, C, H, W]");
  check_like(x, "x", grad_z);
  TORCH_CHECK(weight_size.size() == 4, "cudnn_fusion: weight_size must have 4 values [K, C / groups, kH, kW], got ",
              weight_size);
  const auto dtype = out_dtype.value_or(grad_z.scalar_type());
  TORCH_CHECK(dtype == grad_z.scalar_type() || dtype == at::kFloat,
              "cudnn_fusion: out_dtype must be grad_z's dtype (", grad_z.scalar_type(), ") or float32, got ", dtype);
  auto p = make_problem(grad_z, x.sizes(), weight_size, stride, padding_pre, padding_post, dilation, groups,
                        use_channels_last(x, grad_z));
  p.policy = policy;
  return conv_gradient(GraphKind::kConvWgrad, grad_z, x, weight_size, p, dtype);
}

std::unordered_map<std::string, std::string> check_conv_layer(const ConvProblem& problem, bool backward,
                                                              const std::array<int8_t, 4>& alignment) {
  std::unordered_map<std::string, std::string> refusals;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(problem.device)));
  const int8_t fresh = 16;  // outputs and gradients are fresh allocations from the caching allocator
  auto refusal = [&](GraphKind kind, const std::array<int8_t, 5>& operands) {
    return get_plan(make_graph_key(kind, problem, operands))->refusal;
  };
  // ReLU's / ReLU6's backward with the bias gradient: our kernel where the channels fill its vectors, else for ReLU
  // the cuDNN graph (its refusal), for ReLU6 eager's composition
  auto activation_backward_refusal = [&](const ConvProblem& p) -> std::string {
    if (use_relu_bias_kernel(p.channels_last, p.dtype, p.w_size[0])) return "";
    if (p.activation == Activation::kRelu6) return relu_bias_backward_without_graph(p);
    return refusal(GraphKind::kReluBiasBackward, {fresh, fresh, fresh, fresh, 0});
  };
  auto depthwise = depthwise_kernel_unmet(problem);
  if (depthwise.empty()) {  // our kernels or PyTorch's (depthwise_kernel_steps); no graph but ReLU backward's
    refusals["forward"] = "";
    refusals["depthwise_kernel"] = describe_depthwise_steps(depthwise_kernel_steps(problem, has_epilogue(problem)));
    if (backward) {
      if (problem.activation != Activation::kNone) refusals["relu_bias_backward"] = activation_backward_refusal(problem);
      refusals["dgrad"] = "";
      refusals["wgrad"] = "";
    }
    return refusals;
  }
  bool autotune = policy_for(problem.policy, GraphKind::kConvBiasAct).mode == PolicyMode::kAutotune;
  auto unmet = conv_layer_verdict(problem.dtype, problem.x_size[1], problem.w_size[0], problem.groups, autotune);
  if (!unmet.empty()) {  // no plan is built for a layer that will not run fused
    std::string joined;
    for (const auto& requirement : unmet) joined += (joined.empty() ? "" : "; ") + requirement;
    if (problem.groups > 1) joined += "; not our depthwise kernels: " + depthwise;
    refusals["forward"] = joined;
    return refusals;
  }
  const std::array<int8_t, 5> forward{alignment[0], alignment[1], alignment[2], alignment[3], fresh};
  bool clamp_after = false;
  refusals["forward"] = forward_plan(problem, forward, clamp_after)->refusal;
  if (refusals["forward"].empty() && clamp_after) {
    refusals["note"] = "ReLU6 runs as a clamp after the graph (cuDNN refused it in the graph: " +
                       get_plan(make_graph_key(GraphKind::kConvBiasAct, problem, forward))->refusal + ")";
  }
  if (backward) {
    if (problem.activation != Activation::kNone) refusals["relu_bias_backward"] = activation_backward_refusal(problem);
    refusals["dgrad"] = refusal(GraphKind::kConvDgrad, {fresh, alignment[1], fresh, 0, 0});
    refusals["wgrad"] = refusal(GraphKind::kConvWgrad, {fresh, alignment[0], fresh, 0, 0});
  }
  return refusals;
}

}  // namespace tcf
