#include "ops/bn_ops.h"

#include "ops/tensor_checks.h"

#include <sstream>

#include <ATen/cudnn/Handle.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/variable.h>

#include "core/device.h"
#include "core/engine_policy.h"
#include "graphs/timing.h"
#include "kernels/batch_norm_backward_kernel.h"
#include "kernels/batch_norm_forward_kernel.h"
#include "kernels/running_stats_kernel.h"
#include "ops/channels_last_copy.h"
#include "ops/conv_bn_backward.h"
#include "ops/kernel_launch.h"
#include "ops/run_graph.h"

// The legacy BatchNorm API is deprecated in cuDNN 9 but still the one with fused ReLU forward and backward for
// NHWC half precision (PyTorch's own cudnn_batch_norm uses it too).
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace tcf {

namespace {

BatchNormImplementation implementation_from(int64_t value) {
  TORCH_CHECK(value >= 0 && value <= 2, "cudnn_fusion: implementation must be 0 (cuDNN graph), 1 (legacy cuDNN "
              "BatchNorm) or 2 (our kernel), got ", value);
  return static_cast<BatchNormImplementation>(value);
}

void check_per_channel(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK(t.device() == x.device(), "cudnn_fusion: ", name, " must be on x's device (", x.device(), "), got ",
              t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "cudnn_fusion: ", name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == 1 && t.size(0) == x.size(1) && t.is_contiguous(), "cudnn_fusion: ", name,
              " must be a contiguous tensor of shape [", x.size(1), "] (x's channels), got ", t.sizes());
}

// What the two-step and in-place backward ops (batch_norm_act_backward_reduce(_), batch_norm_backward_dx,
// batch_norm_act_backward_) check: a
// non-empty channels_last x, the incoming gradient like it, and float32 per-channel tensors.
void check_two_step_arguments(const char* op, const at::Tensor& grad, const char* grad_name, const at::Tensor& x,
                              const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& save_mean,
                              const at::Tensor& save_invstd) {
  check_4d_cuda(x, "x");
  check_same_as(grad, grad_name, x);
  TORCH_CHECK(x.suggest_memory_format() == at::MemoryFormat::ChannelsLast && x.numel() > 0, "cudnn_fusion: ", op,
              " takes a non-empty channels_last x, got shape ", x.sizes(), " with strides ", x.strides());
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, {&bias, "bias"}, {&save_mean, "save_mean"},
                                {&save_invstd, "save_invstd"}}) {
    check_per_channel(*t, name, x);
  }
}

BatchNormProblem problem_of(const at::Tensor& x, bool channels_last, bool running_stats, bool has_residual,
                            Activation activation, int64_t policy) {
  BatchNormProblem p;
  p.policy = policy;
  p.dtype = x.scalar_type();
  p.channels_last = channels_last;
  p.device = x.device().index();
  p.x_size = {x.size(0), x.size(1), x.size(2), x.size(3)};
  p.running_stats = running_stats;
  p.has_residual = has_residual;
  p.activation = activation;
  return p;
}

// Runs a batchnorm graph (see run_cached_graph); whether ATen is timed against it under cudnn.benchmark is the
// policy's (policy.aten_under_benchmark, from torch_cudnn_fusion/policy.py).
bool run_batch_norm_graph(GraphKind kind, const BatchNormProblem& p, const std::array<int8_t, 3>& alignment,
                          std::unordered_map<int64_t, void*> pointers, std::initializer_list<at::Tensor> outputs,
                          const at::Device& device, const std::function<void()>& aten) {
  return run_cached_graph(make_batch_norm_key(kind, p, alignment), std::move(pointers), outputs, device, aten);
}

// A tensor's data for our kernels' arguments, null where it is undefined.
void* data_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
float* floats_or_null(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

// BatchNorm's backward after ReLU/ReLU6 in our kernel: dx, dweight, dbias (float32), and dz (the masked gradient)
// when it is defined; or the part `passes` names (kernels/batch_norm_backward_kernel.h), with dweight and dbias its
// outputs (kBackwardReduce) or inputs (kBackwardDx); tensors a part does not touch may be undefined.
// 16-byte accesses where every tensor allows them, else one element at a time.
void batch_norm_act_backward_with_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& y,
                                         const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& save_mean,
                                         const at::Tensor& save_invstd, const at::Tensor& dz, const at::Tensor& dx,
                                         const at::Tensor& dweight, const at::Tensor& dbias, Activation activation,
                                         double negative_slope,
                                         BatchNormBackwardPasses passes = kBackwardAllPasses) {
  const int64_t channels = x.size(1);
  const int64_t rows = x.numel() / channels;
  const int element_bytes = static_cast<int>(x.element_size());
  bool vectors = channels % (16 / element_bytes) == 0;
  for (const auto* t : {&dy, &x, &y, &dz, &dx}) vectors = vectors && (!t->defined() || alignment_of(*t) == 16);
  const int multiprocessors = multiprocessor_count(x.device().index());
  const int64_t parts = passes == kBackwardDx ? 0
                        : batch_norm_act_backward_partial_rows(rows, channels, vectors, element_bytes, multiprocessors);
  auto partial = parts > 0 ? at::empty({parts, channels}, x.options().dtype(at::kFloat)) : at::Tensor();
  for (const auto* t : {&dx, &dweight, &dbias, &dz}) {  // not an input: dz, dweight, dbias in kBackwardDx; dy's copy
    const bool input = passes == kBackwardDx && t != &dx;
    if (t->defined() && !input && !(dy.defined() && t->is_same(dy))) poison_output(*t);
  }
  BatchNormActBackwardArgs args{data_or_null(dy),
                                x.data_ptr(),
                                data_or_null(y),
                                save_mean.data_ptr<float>(),
                                save_invstd.data_ptr<float>(),
                                weight.data_ptr<float>(),
                                bias.data_ptr<float>(),
                                data_or_null(dz),
                                data_or_null(dx),
                                floats_or_null(dweight),
                                floats_or_null(dbias),
                                floats_or_null(partial),
                                rows,
                                channels,
                                static_cast<int>(activation),
                                static_cast<float>(negative_slope),
                                passes};
  auto status = launch_batch_norm_act_backward_nhwc(element_type(x.scalar_type()), args, vectors, multiprocessors,
                                                    current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the batch_norm_act_backward kernel failed to launch: ",
              cudaGetErrorString(status));
}

// BatchNorm's forward with its residual add and activation in our kernel (kernels/batch_norm_forward_kernel.cu): y,
// save_mean and save_invstd written; where running_mean is defined, the running statistics read from running_* and
// written to next_* (the same tensors, for an update in place), and the step counted in num_batches_tracked where
// it is defined. 16-byte accesses where every tensor allows them, else one element at a time.
void batch_norm_act_forward_with_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& y,
                                        const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& save_mean,
                                        const at::Tensor& save_invstd, const at::Tensor& running_mean,
                                        const at::Tensor& running_var, const at::Tensor& next_mean,
                                        const at::Tensor& next_var, const at::Tensor& num_batches_tracked,
                                        double momentum, double eps, Activation activation, double negative_slope) {
  const int64_t channels = x.size(1);
  const int64_t rows = x.numel() / channels;
  const int element_bytes = static_cast<int>(x.element_size());
  bool vectors = channels % (16 / element_bytes) == 0;
  for (const auto* t : {&x, &residual, &y}) vectors = vectors && (!t->defined() || alignment_of(*t) == 16);
  const int multiprocessors = multiprocessor_count(x.device().index());
  auto partial = at::empty(
      {batch_norm_act_forward_partial_rows(rows, channels, vectors, element_bytes, multiprocessors), channels},
      x.options().dtype(at::kDouble));
  for (const auto* t : {&y, &save_mean, &save_invstd}) poison_output(*t);
  const bool stats = running_mean.defined();
  if (stats && !next_mean.is_same(running_mean)) {
    poison_output(next_mean);
    poison_output(next_var);
  }
  BatchNormActForwardArgs args{x.data_ptr(),
                               data_or_null(residual),
                               y.data_ptr(),
                               weight.data_ptr<float>(),
                               bias.data_ptr<float>(),
                               save_mean.data_ptr<float>(),
                               save_invstd.data_ptr<float>(),
                               floats_or_null(running_mean),
                               floats_or_null(running_var),
                               stats ? next_mean.data_ptr<float>() : nullptr,
                               stats ? next_var.data_ptr<float>() : nullptr,
                               stats && num_batches_tracked.defined() ? num_batches_tracked.data_ptr<int64_t>()
                                                                      : nullptr,
                               partial.data_ptr<double>(),
                               rows,
                               channels,
                               static_cast<float>(eps),
                               static_cast<float>(momentum),
                               static_cast<int>(activation),
                               static_cast<float>(negative_slope)};
  auto status = launch_batch_norm_act_forward_nhwc(element_type(x.scalar_type()), args, vectors, multiprocessors,
                                                   current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the batch_norm_act_forward kernel failed to launch: ",
              cudaGetErrorString(status));
}

// grad_y as our backward kernel reads it: itself where it is dense NHWC, else copied into `output`, an output of x's
// shape and layout that the kernel then writes in place (each element is read, then written, by one thread). A
// gradient that arrives expanded (the mean's backward before a classifier) or in another layout costs no tensor
// beside the outputs, as it costs eager's ReLU backward none.
at::Tensor dy_into(const at::Tensor& grad_y, const at::Tensor& output) {
  if (grad_y.is_contiguous(at::MemoryFormat::ChannelsLast)) return grad_y;
  copy_into_channels_last(grad_y, output);
  return output;
}

// BatchNorm's output before its activation, recomputed from x and the saved statistics and rounded to x's dtype, as
// the forward wrote it: what eager's SiLU, Hardswish or LeakyReLU backward reads. ((x - mean) * invstd) * weight +
// bias, each step rounded to float32, in the order our backward kernel (masked_grad) and ATen's forward compute it.
at::Tensor batch_norm_output(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             const at::Tensor& save_mean, const at::Tensor& save_invstd) {
  auto per_channel = [](const at::Tensor& t) { return t.to(at::kFloat).view({1, -1, 1, 1}); };
  // In place after the first op, so at most two float32 copies of x live at once.
  auto v = x.to(at::kFloat) - per_channel(save_mean);
  v.mul_(per_channel(save_invstd)).mul_(per_channel(weight)).add_(per_channel(bias));
  return v.to(x.scalar_type());
}

// ---- the legacy cuDNN BatchNorm API ----

cudnnDataType_t cudnn_dtype(at::ScalarType dtype) {
  return dtype == at::kHalf ? CUDNN_DATA_HALF : dtype == at::kBFloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

// The legacy API's descriptors for one layer, destroyed with it.
struct LegacyDescriptors {
  cudnnTensorDescriptor_t x = nullptr;
  cudnnTensorDescriptor_t stats = nullptr;
  cudnnActivationDescriptor_t activation = nullptr;
  cudnnBatchNormMode_t mode = CUDNN_BATCHNORM_SPATIAL;
  cudnnBatchNormOps_t ops = CUDNN_BATCHNORM_OPS_BN;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;  // of creating them

  explicit LegacyDescriptors(const BatchNormProblem& p) {
    // Persistent mode is the NHWC kernel family with the fused activation.
    mode = p.channels_last ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT : CUDNN_BATCHNORM_SPATIAL;
    ops = p.activation == Activation::kNone ? CUDNN_BATCHNORM_OPS_BN
          : p.has_residual                  ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                                            : CUDNN_BATCHNORM_OPS_BN_ACTIVATION;
    auto format = p.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    if (!ok(cudnnCreateTensorDescriptor(&x)) || !ok(cudnnCreateTensorDescriptor(&stats)) ||
        !ok(cudnnSetTensor4dDescriptor(x, format, cudnn_dtype(p.dtype), static_cast<int>(p.x_size[0]),
                                       static_cast<int>(p.x_size[1]), static_cast<int>(p.x_size[2]),
                                       static_cast<int>(p.x_size[3]))) ||
        !ok(cudnnDeriveBNTensorDescriptor(stats, x, mode))) {
      return;
    }
    if (p.activation != Activation::kNone) {
      ok(cudnnCreateActivationDescriptor(&activation)) &&
          ok(cudnnSetActivationDescriptor(activation, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0));
    }
  }
  ~LegacyDescriptors() {
    if (activation != nullptr) cudnnDestroyActivationDescriptor(activation);
    if (stats != nullptr) cudnnDestroyTensorDescriptor(stats);
    if (x != nullptr) cudnnDestroyTensorDescriptor(x);
  }
  LegacyDescriptors(const LegacyDescriptors&) = delete;
  LegacyDescriptors& operator=(const LegacyDescriptors&) = delete;

  bool ok(cudnnStatus_t s) {
    if (status == CUDNN_STATUS_SUCCESS) status = s;
    return s == CUDNN_STATUS_SUCCESS;
  }
  cudnnTensorDescriptor_t residual(const BatchNormProblem& p) const { return p.has_residual ? x : nullptr; }
};

struct LegacySizes {
  size_t forward_workspace = 0;
  size_t backward_workspace = 0;
  size_t reserve = 0;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
};

LegacySizes legacy_sizes(cudnnHandle_t handle, const BatchNormProblem& p, const LegacyDescriptors& d) {
  LegacySizes s;
  s.status = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(handle, d.mode, d.ops, d.x, d.residual(p), d.x,
                                                                      d.stats, d.activation, &s.forward_workspace);
  if (s.status != CUDNN_STATUS_SUCCESS) return s;
  s.status = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(handle, d.mode, d.ops, d.activation, d.x, &s.reserve);
  if (s.status != CUDNN_STATUS_SUCCESS) return s;
  s.status = cudnnGetBatchNormalizationBackwardExWorkspaceSize(handle, d.mode, d.ops, d.x, d.x, d.x, d.residual(p),
                                                               d.x, d.stats, d.activation, &s.backward_workspace);
  return s;
}

// What the legacy API needs that this configuration lacks ("" when nothing we know of).
std::string legacy_unmet(const BatchNormProblem& p, double eps) {
  std::vector<std::string> unmet;
  if (p.activation == Activation::kRelu6) unmet.push_back("activation: the legacy API fuses ReLU only, not ReLU6");
  if (p.has_residual && p.activation == Activation::kNone) {
    unmet.push_back("ops: the legacy API adds a residual only before an activation");
  }
  if (eps < CUDNN_BN_MIN_EPSILON) {
    std::ostringstream msg;
    msg << "eps: " << eps << " is below CUDNN_BN_MIN_EPSILON (" << CUDNN_BN_MIN_EPSILON << ")";
    unmet.push_back(msg.str());
  }
  if (p.activation != Activation::kNone && !p.channels_last) {
    unmet.push_back("layout: the fused activation needs NHWC (channels_last)");
  }
  std::string out;
  for (const auto& u : unmet) out += "[" + u + "] ";
  return out;
}

std::string legacy_refusal(cudnnHandle_t handle, const BatchNormProblem& p, double eps) {
  auto unmet = legacy_unmet(p, eps);
  if (!unmet.empty()) return "the legacy cuDNN BatchNorm API cannot run it: " + unmet;
  LegacyDescriptors d(p);
  cudnnStatus_t status = d.status;
  if (status == CUDNN_STATUS_SUCCESS) status = legacy_sizes(handle, p, d).status;
  if (status == CUDNN_STATUS_SUCCESS) return "";
  return std::string("the legacy cuDNN BatchNorm API refused it: ") + cudnnGetErrorString(status);
}

// Returns false (and counts a runtime fallback) when cuDNN refuses; `reserve` is allocated here.
bool legacy_forward(const BatchNormProblem& p, const at::Tensor& x, const at::Tensor& residual, const at::Tensor& y,
                    const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
                    const at::Tensor& running_var, double momentum, double eps, const at::Tensor& save_mean,
                    const at::Tensor& save_invstd, at::Tensor& reserve) {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  LegacyDescriptors d(p);
  auto sizes = d.status == CUDNN_STATUS_SUCCESS ? legacy_sizes(handle, p, d) : LegacySizes{0, 0, 0, d.status};
  cudnnStatus_t status = sizes.status;
  if (status == CUDNN_STATUS_SUCCESS) {
    auto bytes = x.options().dtype(at::kByte);
    auto workspace = at::empty({static_cast<int64_t>(sizes.forward_workspace)}, bytes);
    reserve = at::empty({static_cast<int64_t>(sizes.reserve)}, bytes);
    const float one = 1.0f, zero = 0.0f;
    poison_output(y);
    status = cudnnBatchNormalizationForwardTrainingEx(
        handle, d.mode, d.ops, &one, &zero, d.x, x.data_ptr(), d.residual(p),
        p.has_residual ? residual.data_ptr() : nullptr, d.x, y.data_ptr(), d.stats, weight.data_ptr(),
        bias.data_ptr(), momentum, p.running_stats ? running_mean.data_ptr() : nullptr,
        p.running_stats ? running_var.data_ptr() : nullptr, eps, save_mean.data_ptr(), save_invstd.data_ptr(),
        d.activation, workspace.data_ptr(), sizes.forward_workspace, reserve.data_ptr(), sizes.reserve);
  }
  if (status == CUDNN_STATUS_SUCCESS) return true;
  PlanCache::instance().count_runtime_fallback(std::string("the legacy cuDNN BatchNorm forward failed: ") +
                                               cudnnGetErrorString(status));
  return false;
}

bool legacy_backward(const BatchNormProblem& p, const at::Tensor& x, const at::Tensor& y, const at::Tensor& dy,
                     const at::Tensor& dresidual, const at::Tensor& dx, const at::Tensor& weight,
                     const at::Tensor& bias, const at::Tensor& dweight, const at::Tensor& dbias, double eps,
                     const at::Tensor& save_mean, const at::Tensor& save_invstd, const at::Tensor& reserve) {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  LegacyDescriptors d(p);
  auto sizes = d.status == CUDNN_STATUS_SUCCESS ? legacy_sizes(handle, p, d) : LegacySizes{0, 0, 0, d.status};
  cudnnStatus_t status = sizes.status;
  if (status == CUDNN_STATUS_SUCCESS && static_cast<size_t>(reserve.numel()) < sizes.reserve) {
    status = CUDNN_STATUS_BAD_PARAM;  // the forward did not run the legacy API: no reserve to read
  }
  if (status == CUDNN_STATUS_SUCCESS) {
    auto workspace = at::empty({static_cast<int64_t>(sizes.backward_workspace)}, x.options().dtype(at::kByte));
    const float one = 1.0f, zero = 0.0f;
    poison_output(dx);
    status = cudnnBatchNormalizationBackwardEx(
        handle, d.mode, d.ops, &one, &zero, &one, &zero, d.x, x.data_ptr(), y.defined() ? d.x : nullptr,
        y.defined() ? y.data_ptr() : nullptr, d.x, dy.data_ptr(),
        d.residual(p), p.has_residual ? dresidual.data_ptr() : nullptr, d.x, dx.data_ptr(), d.stats,
        weight.data_ptr(), bias.data_ptr(), dweight.data_ptr(), dbias.data_ptr(), eps, save_mean.data_ptr(),
        save_invstd.data_ptr(), d.activation, workspace.data_ptr(), sizes.backward_workspace, reserve.data_ptr(),
        sizes.reserve);
  }
  if (status == CUDNN_STATUS_SUCCESS) return true;
  PlanCache::instance().count_runtime_fallback(std::string("the legacy cuDNN BatchNorm backward failed: ") +
                                               cudnnGetErrorString(status));
  return false;
}


// num_batches_tracked, where given: a one-element int64 tensor on x's device, counted only with running statistics.
void check_step_counter(const std::optional<at::Tensor>& num_batches_tracked, bool has_stats, const at::Tensor& x) {
  if (!num_batches_tracked.has_value() || !num_batches_tracked->defined()) return;
  TORCH_CHECK(has_stats, "cudnn_fusion: num_batches_tracked is counted only with running statistics, got "
              "num_batches_tracked without running_mean and running_var");
  TORCH_CHECK(num_batches_tracked->scalar_type() == at::kLong && num_batches_tracked->numel() == 1 &&
                  num_batches_tracked->device() == x.device(),
              "cudnn_fusion: num_batches_tracked must be a one-element int64 tensor on x's device (", x.device(),
              "), got ", num_batches_tracked->scalar_type(), " of shape ", num_batches_tracked->sizes(), " on ",
              num_batches_tracked->device());
}

// Our kernels write the running statistics (and the step count) below autograd's in-place bookkeeping: their
// version counters are moved here, as the in-place ops would move them (the folded eval weights are cached on them).
void bump_versions(const at::Tensor& running_mean, const at::Tensor& running_var,
                   const std::optional<at::Tensor>& num_batches_tracked) {
  bool counts = num_batches_tracked.has_value() && num_batches_tracked->defined();
  for (const auto* t : {&running_mean, &running_var, counts ? &*num_batches_tracked : nullptr}) {
    if (t != nullptr && !t->is_inference()) torch::autograd::impl::bump_version(*t);
  }
}

// In place, as nn.BatchNorm2d: one launch writes both statistics and counts the step (batch_norm_act_forward checked
// that they are float32, contiguous and on x's device).
void commit_running_stats(const at::Tensor& x, const at::Tensor& running_mean, const at::Tensor& running_var,
                          const std::optional<at::Tensor>& num_batches_tracked, const at::Tensor& next_mean,
                          const at::Tensor& next_var) {
  bool counts = num_batches_tracked.has_value() && num_batches_tracked->defined();
  c10::DeviceGuard guard(x.device());
  auto status = launch_commit_running_stats(
      running_mean.data_ptr<float>(), running_var.data_ptr<float>(), next_mean.data_ptr<float>(),
      next_var.data_ptr<float>(), counts ? num_batches_tracked->data_ptr<int64_t>() : nullptr, next_mean.numel(),
      current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the running statistics kernel failed to launch: ",
              cudaGetErrorString(status));
  bump_versions(running_mean, running_var, num_batches_tracked);
}

// The forward choices made under torch.backends.cudnn.benchmark (BatchNormForwardChoice, bn_ops.h): per device,
// x's sizes and dtype, activation, residual, running statistics, in place or not, policy and the graph's alignments.
using ForwardChoiceKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int, int64_t, bool, bool, bool, int64_t,
                                    int8_t, int8_t, int8_t>;
TimedChoices<ForwardChoiceKey, BatchNormForwardChoice> forward_choices;

// Whether the graph implementation runs a training forward that asked for our kernel (BatchNormForwardChoice):
// timed once per key, `ours` against `graph` where the graph's plan was built. `p` is the graph's problem;
// `activation` the op's. A template, not std::function arguments: those were built on every training forward,
// with cudnn.benchmark off too, where nothing is timed.
template <typename Ours, typename Graph>
bool graph_timed_faster(const BatchNormProblem& p, int64_t activation, bool in_place,
                        const std::array<int8_t, 3>& alignment, const Ours& ours, const Graph& graph) {
  auto& context = at::globalContext();
  if (!context.benchmarkCuDNN() || context.deterministicAlgorithms()) return false;
  const ForwardChoiceKey key{p.device, p.x_size[0], p.x_size[1], p.x_size[2], p.x_size[3],
                             static_cast<int>(p.dtype), activation, p.has_residual, p.running_stats, in_place,
                             p.policy, alignment[0], alignment[1], alignment[2]};
  if (const auto found = forward_choices.find(key)) return found->graph;
  const cudaStream_t stream = if_not_capturing(current_stream());
  if (stream == nullptr) return false;  // nothing is timed inside a capture: a later call outside one chooses
  BatchNormForwardChoice made;
  made.x_size = p.x_size;
  made.dtype = p.dtype;
  made.activation = activation;
  made.residual = p.has_residual;
  made.running_stats = p.running_stats;
  made.in_place = in_place;
  made.ours_ms = median_event_ms([&]() { ours(); return true; }, stream, 5, kTimingSleepCycles);
  if (get_plan(make_batch_norm_key(GraphKind::kBatchNormForward, p, alignment))->ok()) {
    made.graph_ms = median_event_ms([&]() { graph(); return true; }, stream, 5, kTimingSleepCycles);
  }
  made.graph = made.graph_ms >= 0 && (made.ours_ms < 0 || made.graph_ms < made.ours_ms);
  return forward_choices.keep(key, made).graph;
}

// batch_norm_act_forward; with `commit`, the running statistics updated in place and the step counted in *commit
// where it is defined (what conv_batch_norm_act and batch_norm_act_update do): the next running statistics it
// returns are then empty. With `choose`, implementation 2 may run the graph's where it was timed faster
// (graph_timed_faster); the timed runs themselves pass false.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> forward(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& residual, double momentum,
    double eps, int64_t activation_value, int64_t implementation_value, int64_t policy, double negative_slope,
    const std::optional<at::Tensor>* commit, bool choose = true) {
  check_4d_cuda(x, "x");
  auto activation = batch_norm_activation_from(activation_value);
  auto implementation = implementation_from(implementation_value);
  check_per_channel(weight, "weight", x);
  check_per_channel(bias, "bias", x);
  TORCH_CHECK(running_mean.has_value() == running_var.has_value(),
              "cudnn_fusion: running_mean and running_var must be given together");
  bool running_stats = running_mean.has_value();
  if (running_stats) {
    check_per_channel(*running_mean, "running_mean", x);
    check_per_channel(*running_var, "running_var", x);
  }
  if (residual.has_value()) check_same_as(*residual, "residual", x);
  TORCH_CHECK(!(residual.has_value() && applied_after_cudnn(activation)), "cudnn_fusion: SiLU, Hardswish and "
              "LeakyReLU take no residual here (their backward reads the sum before the activation, which is not "
              "kept), got a residual with activation ", activation_value);
  // As eager's check (N * H * W), and no division by a channel count of 0 (an integer division by zero stops the
  // process with SIGFPE)
  TORCH_CHECK(x.size(1) > 0, "cudnn_fusion: x must have at least one channel, got x of shape ", x.sizes());
  TORCH_CHECK(x.size(0) * x.size(2) * x.size(3) > 1, "cudnn_fusion: expected more than 1 value per channel when "
              "training, got x of shape ", x.sizes());

  c10::DeviceGuard guard(x.device());
  bool channels_last = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  auto format = memory_format(channels_last);
  // cuDNN runs BatchNorm (+ add) (+ ReLU / ReLU6); SiLU, Hardswish and LeakyReLU are applied to its output here, in
  // place
  auto p = problem_of(x, channels_last, running_stats, residual.has_value(), graph_activation(activation), policy);
  auto after_cudnn = [&](at::Tensor& out) {
    if (applied_after_cudnn(activation)) apply_activation_(out, activation, negative_slope);
  };
  auto x_dense = x.contiguous(format);
  auto residual_dense = residual.has_value() ? residual->contiguous(format) : at::Tensor();
  auto y = at::empty(x.sizes(), x.options().memory_format(format));
  auto stats_options = x.options().dtype(at::kFloat);
  int64_t c = x.size(1);
  auto save_mean = at::empty({c}, stats_options);
  auto save_invstd = at::empty({c}, stats_options);
  const bool in_place = commit != nullptr;
  const std::array<int8_t, 3> alignment{alignment_of(x_dense), alignment_of(residual_dense), alignment_of(y)};
  if (implementation == BatchNormImplementation::kKernel && channels_last && choose) {
    auto run = [&](BatchNormImplementation which) {
      return forward(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation_value,
                     static_cast<int64_t>(which), policy, negative_slope, nullptr, false);
    };
    at::Tensor mean_copy, var_copy;  // where the graph's statistics are committed while it is timed
    std::optional<at::Tensor> counter_copy;
    auto graph = [&]() {
      auto out = run(BatchNormImplementation::kGraph);
      if (!in_place || !running_stats) return;
      if (!mean_copy.defined()) {
        mean_copy = running_mean->clone();
        var_copy = running_var->clone();
        if (commit->has_value() && (*commit)->defined()) counter_copy = (*commit)->clone();
      }
      commit_running_stats(x, mean_copy, var_copy, counter_copy, std::get<3>(out), std::get<4>(out));
    };
    if (graph_timed_faster(p, activation_value, in_place, alignment, [&]() { run(BatchNormImplementation::kKernel); },
                           graph)) {
      implementation = BatchNormImplementation::kGraph;
    }
  }
  if (implementation == BatchNormImplementation::kKernel && channels_last) {
    const at::Tensor no_tensor;
    const at::Tensor& mean_in = running_stats ? *running_mean : no_tensor;
    const at::Tensor& var_in = running_stats ? *running_var : no_tensor;
    auto next_mean = in_place ? mean_in : at::empty({running_stats ? c : 0}, stats_options);
    auto next_var = in_place ? var_in : at::empty({running_stats ? c : 0}, stats_options);
    const at::Tensor& counter = in_place && commit->has_value() ? **commit : no_tensor;
    batch_norm_act_forward_with_kernel(x_dense, residual_dense, y, weight, bias, save_mean, save_invstd, mean_in,
                                       var_in, next_mean, next_var, counter, momentum, eps, activation,
                                       negative_slope);
    auto reserve = at::empty({0}, x.options().dtype(at::kByte));
    if (!in_place) return {y, save_mean, save_invstd, next_mean, next_var, reserve};
    if (running_stats) bump_versions(mean_in, var_in, *commit);
    auto none = at::empty({0}, stats_options);
    return {y, save_mean, save_invstd, none, none, reserve};
  }
  auto next_mean = at::empty({running_stats ? c : 0}, stats_options);
  auto next_var = at::empty({running_stats ? c : 0}, stats_options);
  auto reserve = at::empty({0}, x.options().dtype(at::kByte));

  bool done = false;
  if (implementation != BatchNormImplementation::kLegacy) {
    float eps_value = static_cast<float>(eps), momentum_value = static_cast<float>(momentum);
    std::unordered_map<int64_t, void*> pointers{
        {kUidX, x_dense.data_ptr()},           {kUidScale, weight.data_ptr()},
        {kUidShift, bias.data_ptr()},          {kUidEpsilon, &eps_value},
        {kUidSavedMean, save_mean.data_ptr()}, {kUidSavedInvStd, save_invstd.data_ptr()},
        {kUidY, y.data_ptr()}};
    if (running_stats) {
      pointers[kUidRunningMeanIn] = running_mean->data_ptr();
      pointers[kUidRunningVarIn] = running_var->data_ptr();
      pointers[kUidMomentum] = &momentum_value;
      pointers[kUidRunningMeanOut] = next_mean.data_ptr();
      pointers[kUidRunningVarOut] = next_var.data_ptr();
    }
    if (p.has_residual) pointers[kUidResidual] = residual_dense.data_ptr();
    auto aten = [&]() {
      auto mean = running_stats ? running_mean->clone() : at::Tensor();
      auto var = running_stats ? running_var->clone() : at::Tensor();
      auto out = std::get<0>(at::native_batch_norm(x_dense, weight, bias, mean, var, true, momentum, eps));
      if (p.has_residual) out.add_(residual_dense);
      apply_activation_(out, p.activation, negative_slope);
    };
    done = run_batch_norm_graph(GraphKind::kBatchNormForward, p, alignment, std::move(pointers),
                                {y, save_mean, save_invstd, next_mean, next_var}, x.device(), aten);
  } else {
    if (running_stats) {  // the legacy API updates running statistics in place: on copies, to stay functional
      next_mean.copy_(*running_mean);
      next_var.copy_(*running_var);
    }
    done = legacy_forward(p, x_dense, residual_dense, y, weight, bias, next_mean, next_var, momentum, eps, save_mean,
                          save_invstd, reserve);
  }
  auto committed = [&](const at::Tensor& mean, const at::Tensor& var) {
    if (commit == nullptr || !running_stats) return false;
    commit_running_stats(x, *running_mean, *running_var, *commit, mean, var);
    return true;
  };
  if (done) {
    after_cudnn(y);
    if (committed(next_mean, next_var)) next_mean = next_var = at::empty({0}, stats_options);
    return {y, save_mean, save_invstd, next_mean, next_var, reserve};
  }

  // ATen: what nn.BatchNorm2d computes, on copies of the running statistics.
  at::Tensor mean_copy, var_copy;
  if (running_stats) {
    mean_copy = running_mean->clone();
    var_copy = running_var->clone();
  }
  auto [out, mean, invstd] = at::native_batch_norm(x_dense, weight, bias, mean_copy, var_copy, true, momentum, eps);
  if (p.has_residual) out.add_(residual_dense);
  apply_activation_(out, activation, negative_slope);
  if (committed(mean_copy, var_copy)) mean_copy = var_copy = at::empty({0}, stats_options);
  return {out.contiguous(format), mean, invstd, running_stats ? mean_copy : next_mean,
          running_stats ? var_copy : next_var, at::empty({0}, x.options().dtype(at::kByte))};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_act_forward(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& residual, double momentum,
    double eps, int64_t activation, int64_t implementation, int64_t policy, double negative_slope) {
  return forward(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation, implementation,
                 policy, negative_slope, nullptr);
}

std::vector<BatchNormForwardChoice> batch_norm_forward_choices() { return forward_choices.all(); }

void clear_batch_norm_forward_choices() { forward_choices.clear(); }

bool batch_norm_backward_reads_y(int64_t activation, bool has_residual, int64_t implementation, bool channels_last) {
  auto act = batch_norm_activation_from(activation);
  // SiLU's, Hardswish's and LeakyReLU's derivative comes from their input, recomputed from x: never from y
  if (act == Activation::kNone || applied_after_cudnn(act)) return false;
  return implementation_from(implementation) == BatchNormImplementation::kLegacy || has_residual || !channels_last;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, const at::Tensor& reserve,
    double eps, int64_t activation_value, bool has_residual, int64_t implementation_value, int64_t policy,
    double negative_slope) {
  check_4d_cuda(x, "x");
  check_same_as(grad_y, "grad_y", x);
  auto activation = batch_norm_activation_from(activation_value);
  auto implementation = implementation_from(implementation_value);
  TORCH_CHECK(!(has_residual && applied_after_cudnn(activation)), "cudnn_fusion: SiLU, Hardswish and LeakyReLU take "
              "no residual here, got has_residual with activation ", activation_value);
  bool channels_last = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  bool has_y = y.has_value() && y->defined();
  TORCH_CHECK(has_y || !batch_norm_backward_reads_y(activation_value, has_residual, implementation_value,
                                                    channels_last),
              "cudnn_fusion: y (the forward output) is needed for the activation's backward here (legacy API, a "
              "residual or a layout other than NHWC), got none");
  if (has_y) check_same_as(*y, "y", x);
  check_per_channel(weight, "weight", x);
  check_per_channel(bias, "bias", x);
  check_per_channel(save_mean, "save_mean", x);
  check_per_channel(save_invstd, "save_invstd", x);

  c10::DeviceGuard guard(x.device());
  auto format = memory_format(channels_last);
  auto x_dense = x.contiguous(format);
  auto y_dense = has_y ? y->contiguous(format) : at::Tensor();
  at::Tensor grad = grad_y;
  if (applied_after_cudnn(activation) &&
      !(implementation != BatchNormImplementation::kLegacy && channels_last && x.numel() > 0)) {
    // Where our NHWC kernel does not run (the legacy API, NCHW): SiLU's, Hardswish's or LeakyReLU's backward in ATen
    // from its input recomputed, then BatchNorm's alone
    grad = activation_backward_from_input(grad_y.contiguous(format),
                                          batch_norm_output(x_dense, weight, bias, save_mean, save_invstd), activation,
                                          negative_slope);
    activation = Activation::kNone;
  }
  auto p = problem_of(x, channels_last, false, has_residual, activation, policy);
  int64_t c = x.size(1);
  auto stats_options = x.options().dtype(at::kFloat);
  auto dx = at::empty(x.sizes(), x.options().memory_format(format));
  auto dweight = at::empty({c}, stats_options);
  auto dbias = at::empty({c}, stats_options);

  if (implementation == BatchNormImplementation::kLegacy) {
    auto dresidual = has_residual ? at::empty(x.sizes(), x.options().memory_format(format)) : at::Tensor();
    if (legacy_backward(p, x_dense, y_dense, grad.contiguous(format), dresidual, dx, weight, bias, dweight, dbias,
                        eps, save_mean, save_invstd, reserve)) {
      return {dx, has_residual ? dresidual : at::empty({0}, x.options()), dweight, dbias};
    }
  }
  if (activation != Activation::kNone && channels_last && x.numel() > 0) {
    // Our kernel: the activation's mask applied as dy is read, no separate ReLU-backward pass (see
    // kernels/batch_norm_backward_kernel.cu). The mask comes from y only where a residual was added before it.
    auto dresidual = has_residual ? at::empty(x.sizes(), x.options().memory_format(format)) : at::Tensor();
    batch_norm_act_backward_with_kernel(dy_into(grad, has_residual ? dresidual : dx), x_dense,
                                        has_residual ? y_dense : at::Tensor(), weight, bias, save_mean, save_invstd,
                                        dresidual, dx, dweight, dbias, activation, negative_slope);
    return {dx, has_residual ? dresidual : at::empty({0}, x.options()), dweight, dbias};
  }
  // NCHW: the activation's backward, then BatchNorm's. (cuDNN refused a graph with ReLU backward reading a saved,
  // non-virtual tensor, and BN-inference -> ReLU backward -> BN backward with half-precision gradients.)
  TORCH_CHECK(has_y || activation == Activation::kNone, "cudnn_fusion: y (the forward output) is needed for the "
              "activation's backward of an empty x, got none");
  auto dz = activation_backward(grad.contiguous(format), y_dense, activation).contiguous(format);
  auto dresidual = has_residual ? dz : at::empty({0}, x.options());
  auto aten_backward = [&]() {
    return at::native_batch_norm_backward(dz, x_dense, weight, std::nullopt, std::nullopt, save_mean, save_invstd,
                                          true, eps, {true, true, true});
  };
  if (implementation != BatchNormImplementation::kLegacy) {
    std::array<int8_t, 3> alignment{alignment_of(dz), alignment_of(x_dense), alignment_of(dx)};
    std::unordered_map<int64_t, void*> pointers{
        {kUidDy, dz.data_ptr()},          {kUidX, x_dense.data_ptr()},
        {kUidScale, weight.data_ptr()},   {kUidSavedMean, save_mean.data_ptr()},
        {kUidSavedInvStd, save_invstd.data_ptr()}, {kUidDx, dx.data_ptr()},
        {kUidDscale, dweight.data_ptr()}, {kUidDshift, dbias.data_ptr()}};
    if (run_batch_norm_graph(GraphKind::kBatchNormBackward, p, alignment, std::move(pointers), {dx, dweight, dbias},
                             x.device(), [&]() { aten_backward(); })) {
      return {dx, dresidual, dweight, dbias};
    }
  }
  auto [gx, gw, gb] = aten_backward();
  return {gx.contiguous(format), dresidual, gw, gb};
}

bool batch_norm_backward_in_our_kernel(int64_t activation, int64_t implementation, bool channels_last) {
  return batch_norm_activation_from(activation) != Activation::kNone && channels_last &&
         implementation_from(implementation) != BatchNormImplementation::kLegacy;
}

bool batch_norm_backward_in_two_steps(int64_t activation, bool has_residual, int64_t implementation,
                                      bool channels_last) {
  return has_residual && batch_norm_backward_in_our_kernel(activation, implementation, channels_last);
}

bool batch_norm_backward_may_overwrite(const at::Tensor& grad, const at::Tensor& x) {
  return grad.defined() && !is_traced(grad) && grad.use_count() == 1 &&
         grad.storage().use_count() == 1 && !grad.requires_grad() && grad.is_cuda() && grad.device() == x.device() &&
         grad.scalar_type() == x.scalar_type() && grad.sizes() == x.sizes() &&
         grad.is_contiguous(at::MemoryFormat::ChannelsLast);
}

namespace {

// The reduce step, its masked gradient written into grad_z (a new tensor, or grad_y itself in place): returns
// grad_weight, grad_bias.
std::tuple<at::Tensor, at::Tensor> backward_reduce_into(const at::Tensor& grad_y, const at::Tensor& grad_z,
                                                        const at::Tensor& x, const std::optional<at::Tensor>& y,
                                                        const at::Tensor& weight, const at::Tensor& bias,
                                                        const at::Tensor& save_mean, const at::Tensor& save_invstd,
                                                        int64_t activation_value, double negative_slope,
                                                        const char* op) {
  check_two_step_arguments(op, grad_y, "grad_y", x, weight, bias, save_mean, save_invstd);
  auto activation = batch_norm_activation_from(activation_value);
  TORCH_CHECK(activation != Activation::kNone, "cudnn_fusion: ", op, " needs an activation (1 ReLU, 2 ReLU6, 3 SiLU, "
              "4 Hardswish or 5 LeakyReLU), got 0");
  bool has_y = y.has_value() && y->defined();
  if (has_y) check_same_as(*y, "y", x);
  TORCH_CHECK(!(has_y && applied_after_cudnn(activation)), "cudnn_fusion: ", op, " takes SiLU's, Hardswish's and "
              "LeakyReLU's derivative from x, not from y (their backward reads their input): got y with activation ",
              activation_value);
  c10::DeviceGuard guard(x.device());
  const auto format = at::MemoryFormat::ChannelsLast;
  auto stats_options = x.options().dtype(at::kFloat);
  auto dweight = at::empty({x.size(1)}, stats_options);
  auto dbias = at::empty({x.size(1)}, stats_options);
  batch_norm_act_backward_with_kernel(dy_into(grad_y, grad_z), x.contiguous(format),
                                      has_y ? y->contiguous(format) : at::Tensor(), weight, bias, save_mean,
                                      save_invstd, grad_z, at::Tensor(), dweight, dbias, activation, negative_slope,
                                      kBackwardReduce);
  return {dweight, dbias};
}

void check_overwritable(const at::Tensor& grad_y, const at::Tensor& x, const char* op) {
  TORCH_CHECK(grad_y.is_contiguous(at::MemoryFormat::ChannelsLast) && !grad_y.is_neg() && !grad_y.is_conj(),
              "cudnn_fusion: ", op, " writes its result over grad_y: grad_y must be channels_last-contiguous, got "
              "strides ", grad_y.strides());
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward_reduce(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, int64_t activation,
    double negative_slope) {
  auto grad_z = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::ChannelsLast));
  auto [dweight, dbias] = backward_reduce_into(grad_y, grad_z, x, y, weight, bias, save_mean, save_invstd, activation,
                                               negative_slope, "batch_norm_act_backward_reduce");
  return {grad_z, dweight, dbias};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_act_backward_reduce_(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, int64_t activation,
    double negative_slope) {
  check_overwritable(grad_y, x, "batch_norm_act_backward_reduce_");
  return backward_reduce_into(grad_y, grad_y, x, y, weight, bias, save_mean, save_invstd, activation, negative_slope,
                              "batch_norm_act_backward_reduce_");
}

std::tuple<at::Tensor, at::Tensor> batch_norm_act_backward_(const at::Tensor& grad_y, const at::Tensor& x,
                                                            const at::Tensor& weight, const at::Tensor& bias,
                                                            const at::Tensor& save_mean,
                                                            const at::Tensor& save_invstd, int64_t activation_value,
                                                            double negative_slope) {
  check_two_step_arguments("batch_norm_act_backward_", grad_y, "grad_y", x, weight, bias, save_mean, save_invstd);
  check_overwritable(grad_y, x, "batch_norm_act_backward_");
  auto activation = batch_norm_activation_from(activation_value);
  TORCH_CHECK(activation != Activation::kNone, "cudnn_fusion: batch_norm_act_backward_ needs an activation (1 ReLU, "
              "2 ReLU6, 3 SiLU, 4 Hardswish or 5 LeakyReLU), got 0");
  c10::DeviceGuard guard(x.device());
  auto stats_options = x.options().dtype(at::kFloat);
  auto dweight = at::empty({x.size(1)}, stats_options);
  auto dbias = at::empty({x.size(1)}, stats_options);
  // the mask recomputed from x, as batch_norm_act_backward's kernel path without a residual
  batch_norm_act_backward_with_kernel(grad_y, x.contiguous(at::MemoryFormat::ChannelsLast), at::Tensor(), weight,
                                      bias, save_mean, save_invstd, at::Tensor(), grad_y, dweight, dbias, activation,
                                      negative_slope);
  return {dweight, dbias};
}

at::Tensor batch_norm_backward_dx(const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight,
                                  const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd,
                                  const at::Tensor& grad_weight, const at::Tensor& grad_bias) {
  check_two_step_arguments("batch_norm_backward_dx", grad_z, "grad_z", x, weight, bias, save_mean, save_invstd);
  check_per_channel(grad_weight, "grad_weight", x);
  check_per_channel(grad_bias, "grad_bias", x);
  c10::DeviceGuard guard(x.device());
  const auto format = at::MemoryFormat::ChannelsLast;
  auto dx = at::empty(x.sizes(), x.options().memory_format(format));
  // the activation is unused here: g is read from grad_z, masked already
  batch_norm_act_backward_with_kernel(at::Tensor(), x.contiguous(format), at::Tensor(), weight, bias, save_mean,
                                      save_invstd, grad_z.contiguous(format), dx, grad_weight, grad_bias,
                                      Activation::kRelu, 0.0, kBackwardDx);
  return dx;
}


std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> cast_conv_operands(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    at::ScalarType dtype) {
  std::optional<at::Tensor> bias;
  if (conv_bias.has_value() && conv_bias->defined()) bias = in_dtype(*conv_bias, dtype);
  return {in_dtype(x, dtype), in_dtype(conv_weight, dtype), bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> conv_batch_norm_act_forward(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
    const at::Tensor& weight, const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope) {
  TORCH_CHECK(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2,
              "cudnn_fusion: stride, padding and dilation must have 2 values each, got ", stride, ", ", padding, ", ",
              dilation);
  auto [x_cast, weight_cast, bias_cast] =
      cast_conv_operands(x, conv_weight, conv_bias, conv_dtype.value_or(x.scalar_type()));
  bool has_stats = running_mean.has_value() && running_mean->defined();
  check_step_counter(num_batches_tracked, has_stats, x);
  auto z = batch_norm_conv_forward(x_cast, weight_cast, bias_cast.has_value() ? *bias_cast : at::Tensor(), stride,
                                   padding, dilation, groups);
  auto [y, save_mean, save_invstd, next_mean, next_var, reserve] =
      forward(z, weight, bias, running_mean, running_var, residual, momentum, eps, activation, implementation, policy,
              negative_slope, &num_batches_tracked);
  return {y, z, save_mean, save_invstd, reserve};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_act_update_forward(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
    const at::Tensor& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation, int64_t implementation,
    int64_t policy, double negative_slope) {
  TORCH_CHECK(running_mean.defined() && running_var.defined(), "cudnn_fusion: batch_norm_act_update updates "
              "running_mean and running_var: both must be tensors");
  check_step_counter(num_batches_tracked, true, x);
  auto [y, save_mean, save_invstd, next_mean, next_var, reserve] =
      forward(x, weight, bias, running_mean, running_var, residual, momentum, eps, activation, implementation, policy,
              negative_slope, &num_batches_tracked);
  return {y, save_mean, save_invstd, reserve};
}

std::unordered_map<std::string, std::string> check_batch_norm_layer(const BatchNormProblem& problem, double eps,
                                                                    bool kernel_first) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(problem.device)));
  const int8_t fresh = 16;  // BatchNorm's input and output are fresh allocations from the caching allocator
  std::unordered_map<std::string, std::string> refusals;
  if (problem.has_residual && applied_after_cudnn(problem.activation)) {
    const std::string why = "SiLU, Hardswish and LeakyReLU after a residual add are not fused (their backward reads "
                            "the sum before the activation, which the op does not keep)";
    return {{"kernel", why}, {"graph_forward", why}, {"legacy", why}};
  }
  // Our forward kernel takes any NHWC layer of the op's dtypes and activations; its backward is the graph
  // implementation's, whose graph (no activation) is checked below.
  refusals["kernel"] = problem.channels_last ? "" : "our BatchNorm kernel takes channels_last (NHWC) x only";
  if (kernel_first && refusals["kernel"].empty()) return refusals;
  // what cuDNN runs: BatchNorm (+ add) (+ ReLU / ReLU6); the op applies SiLU, Hardswish and LeakyReLU to its output
  BatchNormProblem cudnn_problem = problem;
  cudnn_problem.activation = graph_activation(problem.activation);
  refusals["graph_forward"] =
      get_plan(make_batch_norm_key(GraphKind::kBatchNormForward, cudnn_problem, {fresh, fresh, fresh}))->refusal;
  // With an activation, NHWC, the backward runs in our kernel (batch_norm_act_backward_with_kernel): no graph.
  // Where the backward runs ATen's kernels (aten_untimed: no benchmark, heuristic policy) there is no plan to ask; a
  // plan asked later (benchmark turned on) that cuDNN refuses is a run-time fallback to the same kernels.
  if (problem.activation == Activation::kNone || !problem.channels_last) {
    auto key = make_batch_norm_key(GraphKind::kBatchNormBackward, cudnn_problem, {fresh, fresh, fresh});
    refusals["graph_backward"] = aten_untimed(key.kind, key.policy) ? "" : get_plan(key)->refusal;
  }
  refusals["legacy"] = legacy_refusal(at::native::getCudnnHandle(), cudnn_problem, eps);
  return refusals;
}

}  // namespace tcf
