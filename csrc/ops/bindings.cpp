// Op schemas (TORCH_LIBRARY), their CUDA implementations, and the Python module for the plan cache and the
// support check. Fake (meta) kernels and autograd are registered from Python (torch_cudnn_fusion/ops/library.py).
#include <torch/extension.h>

#include <c10/core/DeviceGuard.h>
#include <cudnn.h>
#include <cudnn_frontend_version.h>

#include "ops/bn_call.h"
#include "ops/bn_ops.h"
#include "ops/conv_bn_call.h"
#include "ops/conv_call.h"
#include "ops/conv_ops.h"
#include "ops/depthwise_ops.h"
#include "ops/run_graph.h"
#include "ops/stem_ops.h"
#include "ops/tensor_checks.h"
#include "graphs/engine_listing.h"
#include "core/engine_policy.h"
#include "core/requirements.h"
#include "graphs/plan_file.h"

namespace tcf {
namespace {

at::ScalarType dtype_from_name(const std::string& name) {
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float32") return at::kFloat;
  TORCH_CHECK(false, "cudnn_fusion: dtype must be 'float16', 'bfloat16' or 'float32', got '", name, "'");
}

template <size_t N>
std::array<int64_t, N> fixed(const std::vector<int64_t>& values, const char* name) {
  TORCH_CHECK(values.size() == N, "cudnn_fusion: ", name, " must have ", N, " values, got ", values.size());
  std::array<int64_t, N> out{};
  std::copy(values.begin(), values.end(), out.begin());
  return out;
}

ConvProblem problem_from(const std::string& dtype, bool channels_last, int64_t device, const std::vector<int64_t>& x_size,
                         const std::vector<int64_t>& w_size, const std::vector<int64_t>& stride,
                         const std::vector<int64_t>& padding_pre, const std::vector<int64_t>& padding_post,
                         const std::vector<int64_t>& dilation, int64_t groups, bool has_bias, bool has_residual,
                         int64_t activation, int64_t policy) {
  ConvProblem p;
  p.dtype = dtype_from_name(dtype);
  p.channels_last = channels_last;
  p.device = static_cast<int>(device);
  p.x_size = fixed<4>(x_size, "x_size");
  p.w_size = fixed<4>(w_size, "w_size");
  p.stride = fixed<2>(stride, "stride");
  p.pad_pre = fixed<2>(padding_pre, "padding_pre");
  p.pad_post = fixed<2>(padding_post, "padding_post");
  p.dilation = fixed<2>(dilation, "dilation");
  p.groups = groups;
  p.has_bias = has_bias;
  p.has_residual = has_residual;
  p.activation = activation_from(activation);
  p.policy = policy;
  check_conv_problem(p);  // before any arithmetic on the sizes (a stride of 0 would divide by zero)
  return p;
}

std::unordered_map<std::string, std::string> check_conv_layer_py(
    const std::string& dtype, bool channels_last, int64_t device, const std::vector<int64_t>& x_size,
    const std::vector<int64_t>& w_size, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding_pre,
    const std::vector<int64_t>& padding_post, const std::vector<int64_t>& dilation, int64_t groups, bool has_bias,
    bool has_residual, int64_t activation, bool backward, const std::vector<int64_t>& alignment, int64_t policy) {
  auto p = problem_from(dtype, channels_last, device, x_size, w_size, stride, padding_pre, padding_post, dilation,
                        groups, has_bias, has_residual, activation, policy);
  auto a = fixed<4>(alignment, "alignment");
  return check_conv_layer(p, backward, {static_cast<int8_t>(a[0]), static_cast<int8_t>(a[1]),
                                        static_cast<int8_t>(a[2]), static_cast<int8_t>(a[3])});
}

GraphKind graph_kind_from_name(const std::string& name) {
  if (name == "forward") return GraphKind::kConvBiasAct;
  if (name == "relu_bias_backward") return GraphKind::kReluBiasBackward;
  if (name == "dgrad") return GraphKind::kConvDgrad;
  if (name == "wgrad") return GraphKind::kConvWgrad;
  TORCH_CHECK(false, "cudnn_fusion: graph must be 'forward', 'relu_bias_backward', 'dgrad' or 'wgrad', got '", name,
              "'");
}

pybind11::dict plan_in_use_py(const std::string& graph, const std::string& dtype, bool channels_last, int64_t device,
                              const std::vector<int64_t>& x_size, const std::vector<int64_t>& w_size,
                              const std::vector<int64_t>& stride, const std::vector<int64_t>& padding_pre,
                              const std::vector<int64_t>& padding_post, const std::vector<int64_t>& dilation,
                              int64_t groups, bool has_bias, bool has_residual, int64_t activation,
                              const std::vector<int64_t>& alignment, int64_t policy) {
  auto p = problem_from(dtype, channels_last, device, x_size, w_size, stride, padding_pre, padding_post, dilation,
                        groups, has_bias, has_residual, activation, policy);
  auto a = fixed<5>(alignment, "alignment");
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
  auto info = plan_in_use(make_graph_key(
      graph_kind_from_name(graph), p,
      {static_cast<int8_t>(a[0]), static_cast<int8_t>(a[1]), static_cast<int8_t>(a[2]), static_cast<int8_t>(a[3]),
       static_cast<int8_t>(a[4])}));
  pybind11::dict out;
  out["cached"] = info.cached;
  out["name"] = info.name;
  out["workspace_bytes"] = info.workspace_bytes;
  out["tuned"] = info.tuned;
  out["aten_faster"] = info.aten_faster;
  out["tuned_ms"] = info.tuned_ms >= 0 ? pybind11::cast(static_cast<double>(info.tuned_ms)) : pybind11::none();
  out["aten_ms"] = info.aten_ms >= 0 ? pybind11::cast(static_cast<double>(info.aten_ms)) : pybind11::none();
  out["deserialized"] = info.deserialized;
  out["direct_execute"] = info.direct_execute;
  out["refusal"] = info.refusal;
  return out;
}

pybind11::dict list_engines_py(const std::string& graph, const std::string& dtype, bool channels_last, int64_t device,
                               const std::vector<int64_t>& x_size, const std::vector<int64_t>& w_size,
                               const std::vector<int64_t>& stride, const std::vector<int64_t>& padding_pre,
                               const std::vector<int64_t>& padding_post, const std::vector<int64_t>& dilation,
                               int64_t groups, bool has_bias, bool has_residual, int64_t activation, bool time,
                               int64_t repeats,
                               int64_t policy) {
  auto p = problem_from(dtype, channels_last, device, x_size, w_size, stride, padding_pre, padding_post, dilation,
                        groups, has_bias, has_residual, activation, policy);
  auto kind = graph_kind_from_name(graph);
  // ReLU's backward where no cuDNN graph runs it (our kernel, or ReLU6): no candidates to list, what runs instead
  auto runs_instead = kind == GraphKind::kReluBiasBackward ? relu_bias_backward_without_graph(p) : std::string();
  auto listing = runs_instead.empty() ? list_engines(kind, p, time, static_cast<int>(repeats)) : EngineListing();
  pybind11::list candidates;
  for (const auto& c : listing.candidates) {
    pybind11::dict row;
    row["index"] = c.index;
    row["name"] = c.name;
    row["behaviour_notes"] = c.behaviour_notes;
    row["workspace_bytes"] = c.workspace_bytes;
    row["error"] = c.error;
    row["median_ms"] = c.median_ms >= 0 ? pybind11::cast(static_cast<double>(c.median_ms)) : pybind11::none();
    row["build_seconds"] = c.build_seconds;
    candidates.append(row);
  }
  pybind11::dict out;
  out["candidates"] = candidates;
  out["heuristic_choice"] = listing.heuristic_choice;
  out["refusal"] = listing.refusal;
  out["runs_instead"] = runs_instead;
  return out;
}

std::unordered_map<std::string, std::string> check_batch_norm_layer_py(const std::string& dtype, bool channels_last,
                                                                    int64_t device, const std::vector<int64_t>& x_size,
                                                                    bool running_stats, bool has_residual,
                                                                    int64_t activation, double eps, int64_t policy,
                                                                    bool kernel_first) {
  auto unmet = batch_norm_layer_verdict(x_size, channels_last);
  if (!unmet.empty()) {  // no plan is built for a layer that will not run fused
    std::string joined;
    for (const auto& requirement : unmet) joined += (joined.empty() ? "" : "; ") + requirement;
    return {{"kernel", joined}, {"graph_forward", joined}, {"graph_backward", joined}, {"legacy", joined}};
  }
  BatchNormProblem p;
  p.policy = policy;
  p.dtype = dtype_from_name(dtype);
  p.channels_last = channels_last;
  p.device = static_cast<int>(device);
  p.x_size = fixed<4>(x_size, "x_size");
  p.running_stats = running_stats;
  p.has_residual = has_residual;
  p.activation = batch_norm_activation_from(activation);
  return check_batch_norm_layer(p, eps, kernel_first);
}

std::vector<GraphKind> graph_kinds(const std::vector<int64_t>& values, const char* name) {
  std::vector<GraphKind> kinds;
  for (auto kind : values) {
    TORCH_CHECK_VALUE(kind >= 0 && kind < kGraphKinds, "cudnn_fusion: ", name, " must hold Graph values (0..",
                      kGraphKinds - 1, "), got ", kind);
    kinds.push_back(static_cast<GraphKind>(kind));
  }
  return kinds;
}

void set_benchmark_tuning_py(int64_t candidates, const std::vector<int64_t>& aten_timed,
                             const std::vector<int64_t>& heuristic_only, const std::vector<int64_t>& aten_untimed) {
  set_benchmark_tuning(candidates, graph_kinds(aten_timed, "aten_timed"),
                       graph_kinds(heuristic_only, "heuristic_only"), graph_kinds(aten_untimed, "aten_untimed"));
}

int64_t register_policy_py(int64_t mode, bool deterministic, int64_t workspace_limit,
                           const std::unordered_map<std::string, std::string>& pinned) {
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 2, "cudnn_fusion: mode must be 0 (heuristic), 1 (autotune) or 2 (pinned), "
                    "got ", mode);
  RegisteredPolicy policy;
  policy.mode = static_cast<PolicyMode>(mode);
  policy.deterministic = deterministic;
  policy.workspace_limit = workspace_limit;
  policy.pinned = pinned;
  return register_policy(policy);
}

template <size_t N, typename T>
pybind11::list to_list(const std::array<T, N>& values) {
  pybind11::list out;
  for (auto v : values) out.append(static_cast<int64_t>(v));
  return out;
}

template <size_t N, typename T>
std::array<T, N> from_list(const pybind11::handle& values, const char* name) {
  auto list = values.cast<std::vector<int64_t>>();
  TORCH_CHECK_VALUE(list.size() == N, "cudnn_fusion: saved plan field ", name, " must have ", N, " values, got ",
                    list.size());
  std::array<T, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = static_cast<T>(list[i]);
  return out;
}

struct ShapeToDict {
  pybind11::dict& d;
  void operator()(const ConvShape& s) const {
    d["x_size"] = to_list(s.x_size);
    d["w_size"] = to_list(s.w_size);
    d["stride"] = to_list(s.stride);
    d["pad_pre"] = to_list(s.pad_pre);
    d["pad_post"] = to_list(s.pad_post);
    d["dilation"] = to_list(s.dilation);
    d["groups"] = s.groups;
    d["epilogue"] = pybind11::make_tuple(s.has_bias, s.has_residual, static_cast<int64_t>(s.activation));
  }
  void operator()(const ReluBiasShape& s) const { d["y_size"] = to_list(s.y_size); }
  void operator()(const BatchNormShape& s) const {
    d["x_size"] = to_list(s.x_size);
    d["running_stats"] = s.running_stats;
    d["has_residual"] = s.has_residual;
    d["activation"] = static_cast<int64_t>(s.activation);
  }
};

pybind11::dict key_to_dict(const GraphKey& k) {
  pybind11::dict d;
  d["kind"] = static_cast<int64_t>(k.kind);
  d["device"] = static_cast<int64_t>(k.device);
  d["cc"] = pybind11::make_tuple(static_cast<int64_t>(k.cc_major), static_cast<int64_t>(k.cc_minor));
  d["cudnn_version"] = k.cudnn_version;
  d["dtype"] = static_cast<int64_t>(k.dtype);
  d["channels_last"] = k.channels_last;
  d["allow_tf32"] = k.allow_tf32;
  d["alignment"] = to_list(k.alignment);
  d["policy"] = pybind11::make_tuple(static_cast<int64_t>(k.policy.mode), k.policy.deterministic,
                                     k.policy.workspace_limit, k.policy.pinned, k.policy.benchmark_candidates,
                                     k.policy.aten_under_benchmark);
  pybind11::dict shape;
  std::visit(ShapeToDict{shape}, k.shape);
  d["shape"] = shape;
  return d;
}

// The shape a saved key of `kind` holds (the alternative of its family).
std::variant<ConvShape, ReluBiasShape, BatchNormShape> shape_from_dict(GraphKind kind, const pybind11::dict& d) {
  switch (kind) {
    case GraphKind::kReluBiasBackward:
      return ReluBiasShape{from_list<4, int64_t>(d["y_size"], "y_size")};
    case GraphKind::kBatchNormForward:
    case GraphKind::kBatchNormBackward: {
      BatchNormShape s;
      s.x_size = from_list<4, int64_t>(d["x_size"], "x_size");
      s.running_stats = d["running_stats"].cast<bool>();
      s.has_residual = d["has_residual"].cast<bool>();
      auto activation = d["activation"].cast<int64_t>();
      TORCH_CHECK_VALUE(activation >= 0 && activation <= 2, "cudnn_fusion: saved plan activation ", activation,
                        " is unknown");
      s.activation = static_cast<Activation>(activation);
      return s;
    }
    default: {
      ConvShape s;
      s.x_size = from_list<4, int64_t>(d["x_size"], "x_size");
      s.w_size = from_list<4, int64_t>(d["w_size"], "w_size");
      s.stride = from_list<2, int64_t>(d["stride"], "stride");
      s.pad_pre = from_list<2, int64_t>(d["pad_pre"], "pad_pre");
      s.pad_post = from_list<2, int64_t>(d["pad_post"], "pad_post");
      s.dilation = from_list<2, int64_t>(d["dilation"], "dilation");
      s.groups = d["groups"].cast<int64_t>();
      // (has_bias, has_residual, activation); files written before ReLU6 hold a bool for ReLU: 1 or 0, the same
      auto epilogue = d["epilogue"].cast<std::vector<int64_t>>();
      TORCH_CHECK_VALUE(epilogue.size() == 3, "cudnn_fusion: saved plan field epilogue must have 3 values");
      TORCH_CHECK_VALUE(epilogue[2] >= 0 && epilogue[2] <= 2, "cudnn_fusion: saved plan activation ", epilogue[2],
                        " is unknown");
      s.has_bias = epilogue[0] != 0;
      s.has_residual = epilogue[1] != 0;
      s.activation = static_cast<Activation>(epilogue[2]);
      return s;
    }
  }
}

GraphKey key_from_dict(const pybind11::dict& d) {
  GraphKey k;
  auto kind = d["kind"].cast<int64_t>();
  TORCH_CHECK_VALUE(kind >= 0 && kind < kGraphKinds, "cudnn_fusion: saved plan kind ", kind, " is unknown");
  k.kind = static_cast<GraphKind>(kind);
  k.device = static_cast<int8_t>(d["device"].cast<int64_t>());
  auto cc = d["cc"].cast<std::vector<int64_t>>();
  TORCH_CHECK_VALUE(cc.size() == 2, "cudnn_fusion: saved plan field cc must have 2 values");
  k.cc_major = static_cast<int8_t>(cc[0]);
  k.cc_minor = static_cast<int8_t>(cc[1]);
  k.cudnn_version = d["cudnn_version"].cast<int64_t>();
  auto dtype = static_cast<at::ScalarType>(d["dtype"].cast<int64_t>());
  TORCH_CHECK_VALUE(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat,
                    "cudnn_fusion: saved plan dtype ", static_cast<int64_t>(dtype), " is not one the graphs take");
  k.dtype = static_cast<int8_t>(dtype);
  k.channels_last = d["channels_last"].cast<bool>();
  k.allow_tf32 = d["allow_tf32"].cast<bool>();
  k.alignment = from_list<5, int8_t>(d["alignment"], "alignment");
  auto policy = d["policy"].cast<pybind11::tuple>();
  TORCH_CHECK_VALUE(policy.size() == 6, "cudnn_fusion: saved plan field policy must have 6 values");
  auto mode = policy[0].cast<int64_t>();
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 2, "cudnn_fusion: saved plan policy mode ", mode, " is unknown");
  k.policy.mode = static_cast<PolicyMode>(mode);
  k.policy.deterministic = policy[1].cast<bool>();
  k.policy.workspace_limit = policy[2].cast<int64_t>();
  k.policy.pinned = policy[3].cast<std::string>();
  k.policy.benchmark_candidates = policy[4].cast<int64_t>();
  k.policy.aten_under_benchmark = policy[5].cast<bool>();
  k.shape = shape_from_dict(k.kind, d["shape"].cast<pybind11::dict>());
  return k;
}

pybind11::list saved_plans_py() {
  pybind11::list out;
  for (const auto& saved : saved_plans()) {
    pybind11::dict d;
    d["key"] = key_to_dict(saved.key);
    d["graph"] = graph_kind_name(saved.key.kind);
    d["engine"] = saved.engine;
    d["index"] = saved.index;
    d["tuned"] = saved.tuned;
    d["aten_faster"] = saved.aten_faster;
    d["tuned_ms"] = static_cast<double>(saved.tuned_ms);
    d["aten_ms"] = static_cast<double>(saved.aten_ms);
    d["serialized"] = pybind11::bytes(reinterpret_cast<const char*>(saved.serialized.data()), saved.serialized.size());
    d["serialize_note"] = saved.serialize_note;
    out.append(d);
  }
  return out;
}

std::string load_saved_plan_py(const pybind11::dict& d) {
  SavedPlan saved;
  saved.key = key_from_dict(d["key"].cast<pybind11::dict>());
  saved.engine = d["engine"].cast<std::string>();
  saved.index = d["index"].cast<int64_t>();
  saved.tuned = d["tuned"].cast<bool>();
  saved.aten_faster = d["aten_faster"].cast<bool>();
  saved.tuned_ms = static_cast<float>(d["tuned_ms"].cast<double>());
  saved.aten_ms = static_cast<float>(d["aten_ms"].cast<double>());
  auto bytes = d["serialized"].cast<std::string>();
  saved.serialized.assign(bytes.begin(), bytes.end());
  return load_saved_plan(saved);
}

pybind11::dict plan_cache_stats() {
  auto s = PlanCache::instance().stats();
  pybind11::dict out;
  out["entries"] = s.entries;
  out["capacity"] = s.capacity;
  out["hits"] = s.hits;
  out["misses"] = s.misses;
  out["builds"] = s.builds;
  out["refusals"] = s.refusals;
  out["evictions"] = s.evictions;
  out["build_seconds"] = s.build_seconds;
  out["tuned"] = s.tuned;
  out["tune_seconds"] = s.tune_seconds;
  out["runtime_fallbacks"] = s.runtime_fallbacks;
  out["last_runtime_fallback"] = s.last_runtime_fallback;
  return out;
}

pybind11::list depthwise_wgrad_choices_py() {
  pybind11::list out;
  for (const auto& made : depthwise_wgrad_choices()) {
    pybind11::dict d;
    d["x_size"] = std::vector<int64_t>(made.x_size.begin(), made.x_size.end());
    d["stride"] = made.stride;
    d["padding"] = std::vector<int64_t>(made.padding.begin(), made.padding.end());
    d["dtype"] = std::string(c10::toString(made.dtype));
    d["dw_dtype"] = std::string(c10::toString(made.dw_dtype));
    d["choice"] = made.choice < 0 ? std::string("pytorch") : "plan " + std::to_string(made.choice);
    d["ms"] = std::vector<double>(made.ms.begin(), made.ms.end());
    out.append(d);
  }
  return out;
}

pybind11::list batch_norm_forward_choices_py() {
  pybind11::list out;
  for (const auto& made : batch_norm_forward_choices()) {
    pybind11::dict d;
    d["x_size"] = std::vector<int64_t>(made.x_size.begin(), made.x_size.end());
    d["dtype"] = std::string(c10::toString(made.dtype));
    d["activation"] = made.activation;
    d["residual"] = made.residual;
    d["running_stats"] = made.running_stats;
    d["in_place"] = made.in_place;
    d["choice"] = std::string(made.graph ? "cudnn_graph" : "batch_norm_kernel");
    d["ms"] = std::vector<double>{made.ours_ms, made.graph_ms};
    out.append(d);
  }
  return out;
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY(cudnn_fusion, m) {
  m.def(
      "conv_bias_act(Tensor x, Tensor weight, Tensor? bias, Tensor? residual, int[2] stride, int[2] padding_pre, "
      "int[2] padding_post, int[2] dilation, int groups, int activation, int policy=0) -> Tensor");
  m.def("relu_bias_backward(Tensor grad_out, Tensor out, int activation=1, int policy=0) -> (Tensor, Tensor)");
  m.def(
      "conv_dgrad(Tensor grad_z, Tensor weight, int[4] x_size, int[2] stride, int[2] padding_pre, "
      "int[2] padding_post, int[2] dilation, int groups, int policy=0) -> Tensor");
  m.def(
      "conv_wgrad(Tensor grad_z, Tensor x, int[4] weight_size, int[2] stride, int[2] padding_pre, "
      "int[2] padding_post, int[2] dilation, int groups, int policy=0, ScalarType? out_dtype=None) -> Tensor");
  m.def(
      "batch_norm_act(Tensor x, Tensor weight, Tensor bias, Tensor? running_mean, Tensor? running_var, "
      "Tensor? residual, float momentum, float eps, int activation, int implementation, int policy=0, "
      "float negative_slope=0.01) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_act_update(Tensor x, Tensor weight, Tensor bias, Tensor(a!) running_mean, Tensor(b!) running_var, "
      "Tensor(c!)? num_batches_tracked, Tensor? residual, float momentum, float eps, int activation, "
      "int implementation, int policy=0, float negative_slope=0.01) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_act_backward(Tensor grad_y, Tensor x, Tensor? y, Tensor weight, Tensor bias, Tensor save_mean, "
      "Tensor save_invstd, Tensor reserve, float eps, int activation, bool has_residual, int implementation, "
      "int policy=0, float negative_slope=0.01) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_act_backward_reduce(Tensor grad_y, Tensor x, Tensor? y, Tensor weight, Tensor bias, "
      "Tensor save_mean, Tensor save_invstd, int activation, float negative_slope=0.01) -> (Tensor, Tensor, Tensor)");
  m.def(
      "batch_norm_act_backward_reduce_(Tensor(a!) grad_y, Tensor x, Tensor? y, Tensor weight, Tensor bias, "
      "Tensor save_mean, Tensor save_invstd, int activation, float negative_slope=0.01) -> (Tensor, Tensor)");
  m.def(
      "batch_norm_act_backward_(Tensor(a!) grad_y, Tensor x, Tensor weight, Tensor bias, Tensor save_mean, "
      "Tensor save_invstd, int activation, float negative_slope=0.01) -> (Tensor, Tensor)");
  m.def(
      "batch_norm_backward_dx(Tensor grad_z, Tensor x, Tensor weight, Tensor bias, Tensor save_mean, "
      "Tensor save_invstd, Tensor grad_weight, Tensor grad_bias) -> Tensor");
  m.def(
      "conv_batch_norm_act(Tensor x, Tensor conv_weight, Tensor? conv_bias, int[2] stride, int[2] padding, "
      "int[2] dilation, int groups, Tensor weight, Tensor bias, Tensor(a!)? running_mean, Tensor(b!)? running_var, "
      "Tensor(c!)? num_batches_tracked, Tensor? residual, float momentum, float eps, int activation, "
      "int implementation, ScalarType? conv_dtype=None, int policy=0, float negative_slope=0.01) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "stem_conv_bias_act(Tensor x, Tensor weight, Tensor? bias, Tensor? residual, Tensor index, Tensor inverse, "
      "int[7] form, int activation, int policy=0, ScalarType? conv_dtype=None) -> Tensor");  // ops/stem_ops.cpp
  m.def(
      "stem_conv_batch_norm_act(Tensor x, Tensor conv_weight, Tensor? conv_bias, Tensor index, Tensor inverse, "
      "int[7] form, Tensor weight, Tensor bias, Tensor(a!)? running_mean, Tensor(b!)? running_var, "
      "Tensor(c!)? num_batches_tracked, Tensor? residual, float momentum, float eps, int activation, "
      "int implementation, ScalarType? conv_dtype=None, int policy=0, float negative_slope=0.01) -> "
      "(Tensor, Tensor, Tensor, Tensor, Tensor)");  // ops/stem_ops.cpp
  m.def("space_to_depth(Tensor x, int[2] padding_pre, int[2] out_size, ScalarType? dtype=None) -> Tensor");
  m.def(
      "stem_filter(Tensor weight, Tensor index, Tensor inverse, int[2] kernel, int channels, "
      "ScalarType? dtype=None) -> Tensor");  // ops/stem_ops.cpp
  m.def("stem_filter_backward(Tensor grad, Tensor inverse, int[4] weight_size, ScalarType weight_dtype) -> Tensor");
  m.def("global_avg_pool(Tensor x) -> Tensor");  // ops/pool_ops.cpp
  m.def(
      "squeeze_excite(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, int activation, bool hard_gate) -> "
      "Tensor");  // ops/squeeze_excite_ops.cpp
}

TORCH_LIBRARY_IMPL(cudnn_fusion, CUDA, m) {
  m.impl("conv_bias_act", &tcf::conv_bias_act);
  m.impl("relu_bias_backward", &tcf::relu_bias_backward);
  m.impl("conv_dgrad", &tcf::conv_dgrad);
  m.impl("conv_wgrad", &tcf::conv_wgrad);
  m.impl("batch_norm_act", &tcf::batch_norm_act_forward);
  m.impl("batch_norm_act_update", &tcf::batch_norm_act_update_forward);
  m.impl("batch_norm_act_backward", &tcf::batch_norm_act_backward);
  m.impl("batch_norm_act_backward_reduce", &tcf::batch_norm_act_backward_reduce);
  m.impl("batch_norm_act_backward_reduce_", &tcf::batch_norm_act_backward_reduce_);
  m.impl("batch_norm_act_backward_", &tcf::batch_norm_act_backward_);
  m.impl("batch_norm_backward_dx", &tcf::batch_norm_backward_dx);
  m.impl("conv_batch_norm_act", &tcf::conv_batch_norm_act_forward);
  m.impl("space_to_depth", &tcf::space_to_depth);
  m.impl("stem_filter", &tcf::stem_filter);
  m.impl("stem_filter_backward", &tcf::stem_filter_backward);
  m.impl("stem_conv_bias_act", &tcf::stem_conv_bias_act);
  m.impl("stem_conv_batch_norm_act", &tcf::stem_conv_batch_norm_act);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "torch_cudnn_fusion's compiled core: cuDNN graphs, plan cache and ops";
  py::class_<tcf::ConvBatchNormCall>(m, "ConvBatchNormCall",
                                     "A training Conv2d + BatchNorm layer's call recorded for the one op "
                                     "(see csrc/ops/conv_bn_call.h)")
      .def(py::init<const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, std::vector<int64_t>,
                    std::vector<int64_t>, std::vector<int64_t>, int64_t, double, int64_t, int64_t, int64_t, double,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, std::vector<int64_t>>(),
           py::arg("x"), py::arg("conv_weight"), py::arg("conv_bias"), py::arg("weight"), py::arg("bias"),
           py::arg("running_mean"), py::arg("running_var"), py::arg("num_batches_tracked"), py::arg("residual"),
           py::arg("stride"), py::arg("padding"), py::arg("dilation"), py::arg("groups"), py::arg("eps"),
           py::arg("activation"), py::arg("implementation"), py::arg("policy"), py::arg("negative_slope") = 0.01,
           py::arg("stem_index") = py::none(), py::arg("stem_inverse") = py::none(),
           py::arg("stem_form") = std::vector<int64_t>())
      .def("run", &tcf::ConvBatchNormCall::run,
           "y of cudnn_fusion::conv_batch_norm_act for this call, or None when it differs from the recorded one");
  py::class_<tcf::BatchNormCall>(m, "BatchNormCall",
                                 "A training BatchNorm layer's call recorded for the op "
                                 "cudnn_fusion::batch_norm_act_update (see csrc/ops/bn_call.h)")
      .def(py::init<const at::Tensor&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&, double, int64_t, int64_t, int64_t, double>(),
           py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("running_mean"), py::arg("running_var"),
           py::arg("num_batches_tracked"), py::arg("residual"), py::arg("eps"), py::arg("activation"),
           py::arg("implementation"), py::arg("policy"), py::arg("negative_slope") = 0.01)
      .def("run", &tcf::BatchNormCall::run,
           "y of cudnn_fusion::batch_norm_act_update for this call, or None when it differs from the recorded one");
  py::class_<tcf::ConvBiasActCall>(m, "ConvBiasActCall",
                                   "A conv + bias (+ residual) + activation layer's call recorded for the op "
                                   "cudnn_fusion::conv_bias_act (see csrc/ops/conv_call.h)")
      .def(py::init<const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                    const std::optional<at::Tensor>&, std::vector<int64_t>, std::vector<int64_t>,
                    std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, int64_t,
                    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, std::vector<int64_t>>(),
           py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("residual"), py::arg("stride"),
           py::arg("padding_pre"), py::arg("padding_post"), py::arg("dilation"), py::arg("groups"),
           py::arg("activation"), py::arg("policy"), py::arg("stem_index") = py::none(),
           py::arg("stem_inverse") = py::none(), py::arg("stem_form") = std::vector<int64_t>())
      .def("run", &tcf::ConvBiasActCall::run,
           "y of cudnn_fusion::conv_bias_act for this call, or None when it differs from the recorded one")
      .def("matches", &tcf::ConvBiasActCall::matches,
           "Whether this call's tensors and the global state match the recorded ones");
  // The checks may build plans (whole seconds when cold): Python's other threads run meanwhile.
  m.def("check_conv_layer", &tcf::check_conv_layer_py,
        "The layer's verdict, then the plans it would use built (or found); returns each graph's refusal, '' when built",
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "depthwise_kernel_verdict",
      [](int64_t in_channels, const std::vector<int64_t>& w_size, const std::vector<int64_t>& stride,
         const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, int64_t groups,
         bool channels_last, const std::string& dtype, bool has_epilogue,
         const std::optional<std::vector<int64_t>>& out_size) {
        auto unmet = tcf::depthwise_kernel_unmet(in_channels, w_size, stride, dilation, groups, channels_last);
        pybind11::dict out;
        out["unmet"] = unmet;
        out["forward"] = "pytorch";
        out["dgrad"] = "pytorch";
        out["wgrad"] = "pytorch";
        if (!unmet.empty()) return out;  // stride, dilation and the filter's size are as our kernels take them
        tcf::ConvProblem p;
        p.dtype = tcf::dtype_from_name(dtype);
        p.w_size = tcf::fixed<4>(w_size, "w_size");
        p.stride = tcf::fixed<2>(stride, "stride");
        p.pad_pre = p.pad_post = tcf::fixed<2>(padding, "padding");
        p.groups = groups;
        // an output of unknown size (none given, or a size below 1: traced): the steps of a small and a large one
        const bool known = out_size.has_value() && out_size->size() == 2 && (*out_size)[0] > 0 && (*out_size)[1] > 0;
        const int64_t large = tcf::kDepthwiseSmallOutput + 1;
        auto steps = known ? tcf::depthwise_kernel_steps(p, has_epilogue, (*out_size)[0], (*out_size)[1])
                           : tcf::depthwise_kernel_steps(p, has_epilogue, large, large);
        const auto small = known ? steps : tcf::depthwise_kernel_steps(p, has_epilogue, 1, 1);
        auto ours = [](bool at_size, bool small_only) {
          return at_size ? "ours" : small_only ? "ours_small" : "pytorch";
        };
        out["forward"] = ours(steps.forward, small.forward);
        out["dgrad"] = steps.dgrad == tcf::DepthwiseDgrad::kOurKernel       ? "ours"
                       : steps.dgrad == tcf::DepthwiseDgrad::kTurnedForward ? "turned_forward"
                                                                             : "pytorch";
        out["wgrad"] = ours(steps.wgrad, small.wgrad);
        return out;
      },
      py::arg("in_channels"), py::arg("w_size"), py::arg("stride"), py::arg("padding"), py::arg("dilation"),
      py::arg("groups"), py::arg("channels_last"), py::arg("dtype"), py::arg("has_epilogue"),
      py::arg("out_size") = py::none(),
      "unmet: '' when our depthwise kernels may run this convolution (symmetric padding), else why not; forward and "
      "wgrad: 'ours', 'pytorch', or, where out_size (the output's [H, W]) is not given or not known (-1), "
      "'ours_small': ours for outputs of at most depthwise_small_output rows and columns, PyTorch's beyond; dgrad: "
      "'ours', 'turned_forward' (PyTorch's forward with the filter turned 180 degrees) or 'pytorch'");
  m.attr("depthwise_small_output") = tcf::kDepthwiseSmallOutput;
  m.def("batch_norm_layer_verdict", &tcf::batch_norm_layer_verdict, py::arg("x_size"), py::arg("channels_last"),
        "The unmet requirements of a BatchNorm layer in training (empty: cuDNN is asked); -1: a size not known yet");
  m.def("set_benchmark_tuning", &tcf::set_benchmark_tuning_py, py::arg("candidates"), py::arg("aten_timed"),
        py::arg("heuristic_only"), py::arg("aten_untimed"),
        "Under torch.backends.cudnn.benchmark: how many heuristic candidates a first run times, the graphs (Graph "
        "values) whose ATen composition is timed with them, and the graphs that time the heuristic's first alone; "
        "without it, the graphs whose ATen composition runs in the heuristic policy");
  m.def("check_batch_norm_layer", &tcf::check_batch_norm_layer_py, py::arg("dtype"), py::arg("channels_last"),
        py::arg("device"), py::arg("x_size"), py::arg("running_stats"), py::arg("has_residual"), py::arg("activation"),
        py::arg("eps"), py::arg("policy"), py::arg("kernel_first") = false,
        "Why each BatchNorm implementation (our kernel, cuDNN graph forward/backward, legacy API) cannot run a layer, "
        "'' if it can; with kernel_first, our kernel's verdict alone where it takes the layer (no graph is asked)",
        py::call_guard<py::gil_scoped_release>());
  m.def("list_engines", &tcf::list_engines_py,
        "Every candidate plan cuDNN's heuristics offer for one graph of a conv layer, optionally timed");
  m.def("plan_in_use", &tcf::plan_in_use_py, "The plan the cache runs for one graph of a conv layer");
  m.def("plan_cache_stats", &tcf::plan_cache_stats, "Counters of the plan cache");
  m.def("register_policy", &tcf::register_policy_py,
        "Register an engine policy (mode 0 heuristic, 1 autotune, 2 pinned); returns the id the ops take");
  m.def("saved_plans", &tcf::saved_plans_py, "Every built plan in the cache, as saved to a plan file");
  m.def("load_saved_plan", &tcf::load_saved_plan_py, "Put one saved plan back in the cache; returns '' or why not");
  m.def(
      "clear_plan_cache",
      []() {
        tcf::PlanCache::instance().clear();
        tcf::clear_depthwise_wgrad_choices();
        tcf::clear_batch_norm_forward_choices();
      },
      "Drop every cached plan, and every depthwise wgrad and BatchNorm forward choice timed under cudnn.benchmark");
  m.def("batch_norm_forward_choices", &tcf::batch_norm_forward_choices_py,
        "The BatchNorm training forward chosen under torch.backends.cudnn.benchmark where our kernel was asked for, "
        "per device, shape, dtype, activation, residual, running statistics and in place or not: 'batch_norm_kernel' "
        "or 'cudnn_graph', and the median ms of each (ours, the graph's; negative: did not run)");
  m.def("depthwise_wgrad_choices", &tcf::depthwise_wgrad_choices_py,
        "The depthwise wgrad chosen under torch.backends.cudnn.benchmark for each device, shape and dtypes: 'plan 0', "
        "'plan 1' (our kernels) or 'pytorch', and the median ms of each (plan 0, plan 1, PyTorch's; negative: could "
        "not run)");
  m.def(
      "set_plan_cache_capacity",
      [](int64_t capacity) {
        TORCH_CHECK(capacity >= 1, "cudnn_fusion: capacity must be >= 1, got ", capacity);
        tcf::PlanCache::instance().set_capacity(capacity);
      },
      "Bound the number of cached plans (least recently used are evicted)");
  m.def("set_poison_outputs", &tcf::set_poison_outputs,
        "Test aid: fill every op output with NaN before its graph runs");
  m.def("set_frontend_execute_for_tests", &tcf::set_frontend_execute_for_tests,
        "Test aid: run every plan through cudnn-frontend's execute, also where it could run directly");
  m.def("direct_executions_for_tests", &tcf::direct_executions_for_tests,
        "Test aid: how many plan runs in this process ran directly, without cudnn-frontend's execute");
  m.def("set_build_delay_for_tests", &tcf::set_build_delay_for_tests,
        "Test aid: every plan build first sleeps this many milliseconds (0: off)");
  m.def("set_depthwise_wgrad_plan_for_tests", &tcf::set_depthwise_wgrad_plan_for_tests,
        "Test aid: every depthwise wgrad our kernels take runs this plan (0, 1 or 2), untimed (-1: off)");
  m.def("set_refused_activation_for_tests", &tcf::set_refused_activation_for_tests,
        "Test aid: conv + bias graphs with this activation code are refused (-1: off)");
  // The enums the ops and functions above take as integers; torch_cudnn_fusion/_cpp_enums.py restates them for
  // Python without the extension, and a test holds it to these.
  py::enum_<tcf::Activation>(m, "Activation")
      .value("IDENTITY", tcf::Activation::kNone)
      .value("RELU", tcf::Activation::kRelu)
      .value("RELU6", tcf::Activation::kRelu6)
      .value("SILU", tcf::Activation::kSilu)
      .value("HARDSWISH", tcf::Activation::kHardswish)
      .value("LEAKY_RELU", tcf::Activation::kLeakyRelu);
  py::enum_<tcf::BatchNormImplementation>(m, "BatchNormImplementation")
      .value("CUDNN_GRAPH", tcf::BatchNormImplementation::kGraph)
      .value("CUDNN_LEGACY", tcf::BatchNormImplementation::kLegacy)
      .value("KERNEL", tcf::BatchNormImplementation::kKernel);
  py::enum_<tcf::PolicyMode>(m, "PolicyMode")
      .value("HEURISTIC", tcf::PolicyMode::kHeuristic)
      .value("AUTOTUNE", tcf::PolicyMode::kAutotune)
      .value("PINNED", tcf::PolicyMode::kPinned);
  py::enum_<tcf::GraphKind>(m, "Graph")
      .value("FORWARD", tcf::GraphKind::kConvBiasAct)
      .value("RELU_BIAS_BACKWARD", tcf::GraphKind::kReluBiasBackward)
      .value("DGRAD", tcf::GraphKind::kConvDgrad)
      .value("WGRAD", tcf::GraphKind::kConvWgrad)
      .value("BATCHNORM_FORWARD", tcf::GraphKind::kBatchNormForward)
      .value("BATCHNORM_BACKWARD", tcf::GraphKind::kBatchNormBackward);
  m.def("cudnn_version", []() { return static_cast<int64_t>(cudnnGetVersion()); }, "cuDNN version at run time");
  m.def(
      "frontend_version",
      []() {
        return std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) +
               "." + std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
      },
      "cudnn-frontend headers the extension was built with");
}
