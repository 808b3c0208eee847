#include "conv_graphs.h"

#include "graph_builder.h"

#include <ATen/ATen.h>

#include "bn_graphs.h"
#include "engine_policy.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <sstream>

#include <ATen/cudnn/Handle.h>
#include <cuda_runtime_api.h>

namespace tcf {

ComputeCapability compute_capability(int device) {
  thread_local int last_device = -1;  // the per-call path asks for one device again and again
  thread_local ComputeCapability last;
  if (device == last_device) return last;
  static std::mutex mutex;
  static std::unordered_map<int, ComputeCapability> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(device);
  if (found != known.end()) {
    last_device = device;
    last = found->second;
    return last;
  }
  int major = 0, minor = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess,
              "torch_cudnn_fusion: could not read the compute capability of cuda:", device);
  ComputeCapability cc{static_cast<int8_t>(major), static_cast<int8_t>(minor)};
  known.emplace(device, cc);
  last_device = device;
  last = cc;
  return cc;
}

fe::DataType_t fe_dtype(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return fe::DataType_t::HALF;
    case at::kBFloat16:
      return fe::DataType_t::BFLOAT16;
    case at::kFloat:
      return fe::DataType_t::FLOAT;
    default:
      TORCH_CHECK(false, "torch_cudnn_fusion: dtype must be float16, bfloat16 or float32, got ", dtype);
  }
}

std::vector<int64_t> as_vector(const std::array<int64_t, 4>& a) { return {a.begin(), a.end()}; }
std::vector<int64_t> as_vector(const std::array<int64_t, 2>& a) { return {a.begin(), a.end()}; }

std::array<int64_t, 4> output_size(const GraphKey& key) {
  std::array<int64_t, 4> y{key.x_size[0], key.w_size[0], 0, 0};
  for (int i = 0; i < 2; ++i) {
    int64_t extent = key.x_size[2 + i] + key.pad_pre[i] + key.pad_post[i];
    int64_t window = key.dilation[i] * (key.w_size[2 + i] - 1) + 1;
    y[2 + i] = (extent - window) / key.stride[i] + 1;
  }
  return y;
}

TensorPtr add_tensor(fe::graph::Graph& graph, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                     bool channels_last, fe::DataType_t dtype) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(name)
                          .set_uid(uid)
                          .set_dim(as_vector(size))
                          .set_stride(dense_strides(size, channels_last))
                          .set_data_type(dtype));
}

void mark_output(const TensorPtr& tensor, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                 bool channels_last, fe::DataType_t dtype) {
  tensor->set_output(true)
      .set_name(name)
      .set_uid(uid)
      .set_dim(as_vector(size))
      .set_stride(dense_strides(size, channels_last))
      .set_data_type(dtype);
}

// Bias and its gradient: one value per output channel, shaped [1, K, 1, 1].
static std::array<int64_t, 4> channel_vector_size(const GraphKey& key) { return {1, key.w_size[0], 1, 1}; }

std::shared_ptr<fe::graph::Graph> new_graph(const GraphKey& key) {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe_dtype(static_cast<at::ScalarType>(key.dtype)))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

namespace {

template <typename Attributes>
Attributes conv_attributes(const GraphKey& key, Attributes attributes) {
  return attributes.set_pre_padding(as_vector(key.pad_pre))
      .set_post_padding(as_vector(key.pad_post))
      .set_stride(as_vector(key.stride))
      .set_dilation(as_vector(key.dilation))
      .set_compute_data_type(fe::DataType_t::FLOAT);
}

void describe_conv_bias_act(fe::graph::Graph& graph, const GraphKey& key) {
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto x = add_tensor(graph, "x", kUidX, key.x_size, key.channels_last, io);
  auto w = add_tensor(graph, "w", kUidW, key.w_size, key.channels_last, io);
  auto y = graph.conv_fprop(x, w, conv_attributes(key, fe::graph::Conv_fprop_attributes().set_name("conv")));
  if (key.has_bias) {
    auto bias = add_tensor(graph, "bias", kUidBias, channel_vector_size(key), true, io);
    y = graph.pointwise(y, bias, fe::graph::Pointwise_attributes().set_name("add_bias").set_mode(fe::PointwiseMode_t::ADD));
  }
  if (key.has_residual) {
    auto residual = add_tensor(graph, "residual", kUidResidual, output_size(key), key.channels_last, io);
    y = graph.pointwise(y, residual,
                        fe::graph::Pointwise_attributes().set_name("add_residual").set_mode(fe::PointwiseMode_t::ADD));
  }
  if (key.relu) {
    y = graph.pointwise(y, fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
  }
  mark_output(y, "y", kUidY, output_size(key), key.channels_last, io);
}

void describe_relu_bias_backward(fe::graph::Graph& graph, const GraphKey& key) {
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto y_size = output_size(key);
  auto dy = add_tensor(graph, "dy", kUidDy, y_size, key.channels_last, io);
  // The mask comes from the saved forward output: y > 0 exactly where the pre-activation was > 0.
  auto y = add_tensor(graph, "y", kUidY, y_size, key.channels_last, io);
  auto dz = graph.pointwise(dy, y, fe::graph::Pointwise_attributes().set_name("relu_backward").set_mode(fe::PointwiseMode_t::RELU_BWD));
  mark_output(dz, "dz", kUidDz, y_size, key.channels_last, io);
  auto dbias = graph.reduction(dz, fe::graph::Reduction_attributes()
                                       .set_name("bias_grad")
                                       .set_mode(fe::ReductionMode_t::ADD)
                                       .set_compute_data_type(fe::DataType_t::FLOAT));
  mark_output(dbias, "dbias", kUidDbias, channel_vector_size(key), true, fe::DataType_t::FLOAT);
}

void describe_dgrad(fe::graph::Graph& graph, const GraphKey& key) {
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto dz = add_tensor(graph, "dz", kUidDz, output_size(key), key.channels_last, io);
  auto w = add_tensor(graph, "w", kUidW, key.w_size, key.channels_last, io);
  auto dx = graph.conv_dgrad(dz, w, conv_attributes(key, fe::graph::Conv_dgrad_attributes().set_name("dgrad")));
  mark_output(dx, "dx", kUidDx, key.x_size, key.channels_last, io);
}

void describe_wgrad(fe::graph::Graph& graph, const GraphKey& key) {
  auto io = fe_dtype(static_cast<at::ScalarType>(key.dtype));
  auto dz = add_tensor(graph, "dz", kUidDz, output_size(key), key.channels_last, io);
  auto x = add_tensor(graph, "x", kUidX, key.x_size, key.channels_last, io);
  auto dw = graph.conv_wgrad(dz, x, conv_attributes(key, fe::graph::Conv_wgrad_attributes().set_name("wgrad")));
  mark_output(dw, "dw", kUidDw, key.w_size, key.channels_last, io);
}

std::string describe_problem(const GraphKey& key) {
  std::ostringstream out;
  if (key.kind == GraphKind::kBatchNormForward || key.kind == GraphKind::kBatchNormBackward) {
    out << "x [" << key.x_size[0] << ", " << key.x_size[1] << ", " << key.x_size[2] << ", " << key.x_size[3] << "], "
        << static_cast<at::ScalarType>(key.dtype) << ", " << (key.channels_last ? "NHWC" : "NCHW") << ", sm_"
        << int(key.cc_major) << int(key.cc_minor) << ", cuDNN " << key.cudnn_version;
    return out.str();
  }
  out << "x [" << key.x_size[0] << ", " << key.x_size[1] << ", " << key.x_size[2] << ", " << key.x_size[3]
      << "], w [" << key.w_size[0] << ", " << key.w_size[1] << ", " << key.w_size[2] << ", " << key.w_size[3]
      << "], " << static_cast<at::ScalarType>(key.dtype) << ", " << (key.channels_last ? "NHWC" : "NCHW")
      << ", groups " << key.groups << ", sm_" << int(key.cc_major) << int(key.cc_minor) << ", cuDNN "
      << key.cudnn_version;
  return out.str();
}

// The requirements of cuDNN's fused (runtime fusion) engines that this configuration does not meet, so that a
// refusal names what to change rather than a bare status.
std::vector<std::string> unmet_requirements(const GraphKey& key) {
  std::vector<std::string> unmet;
  auto dtype = static_cast<at::ScalarType>(key.dtype);
  if (!key.channels_last) {
    unmet.push_back("layout: tensors are NCHW; the fused engines want channels_last (NHWC)");
  }
  int64_t multiple = dtype == at::kFloat ? 4 : 8;
  // The relu backward graph has no input channels of its own (its key describes a 1x1 conv K -> K).
  int64_t c_per_group = key.kind == GraphKind::kReluBiasBackward ? key.w_size[0] : key.w_size[1];
  int64_t k_per_group = key.w_size[0] / key.groups;
  if (c_per_group % multiple != 0 || k_per_group % multiple != 0) {
    std::ostringstream msg;
    msg << "channel alignment: input channels per group (" << c_per_group << ") and output channels per group ("
        << k_per_group << ") must be multiples of " << multiple << " for " << dtype;
    unmet.push_back(msg.str());
  }
  for (size_t i = 0; i < key.alignment.size(); ++i) {
    if (key.alignment[i] != 0 && key.alignment[i] < 16) {
      std::ostringstream msg;
      msg << "pointer alignment: operand " << i << " of the graph is " << int(key.alignment[i])
          << "-byte aligned; the vectorized engines need 16";
      unmet.push_back(msg.str());
      break;
    }
  }
  int min_major = dtype == at::kBFloat16 ? 8 : 7;
  if (key.cc_major < min_major) {
    std::ostringstream msg;
    msg << "compute capability: sm_" << int(key.cc_major) << int(key.cc_minor) << " is below sm_" << min_major
        << "0, the oldest GPU with fused engines for " << dtype;
    unmet.push_back(msg.str());
  }
  bool batch_norm = key.kind == GraphKind::kBatchNormForward || key.kind == GraphKind::kBatchNormBackward;
  if (dtype == at::kFloat && !key.allow_tf32 && !batch_norm) {
    unmet.push_back("math: float32 with torch.backends.cudnn.allow_tf32=False excludes every tensor-core engine");
  }
  if (key.groups > 1) unmet.push_back("groups: grouped convolutions have few fused engines");
  if (key.policy.deterministic) {
    unmet.push_back("policy: deterministic (or torch.use_deterministic_algorithms) excludes every engine with "
                    "cuDNN's NONDETERMINISTIC note");
  }
  if (key.policy.workspace_limit >= 0) {
    std::ostringstream msg;
    msg << "policy: workspace limit " << key.policy.workspace_limit << " bytes excludes engines that need more";
    unmet.push_back(msg.str());
  }
  return unmet;
}

std::shared_ptr<CachedPlan> refused(const GraphKey& key, const char* stage, const std::string& message) {
  auto plan = std::make_shared<CachedPlan>();
  plan->refusal = describe_refusal(key, stage, message);
  return plan;
}

#define TCF_BUILD_STEP(expr, stage)                                            \
  do {                                                                         \
    auto status = (expr);                                                      \
    if (status.is_bad()) return BuildFailure{stage, status.get_message()};     \
  } while (0)

// Describes `key`'s graph and asks cuDNN's heuristics (mode A) for its candidate plans, with the numerical notes
// PyTorch's own cuDNN convolutions exclude: never engines that down-convert inputs, and float32 uses the tensor
// cores (TF32) only when torch.backends.cudnn.allow_tf32 says so.
BuildFailure describe_and_query(fe::graph::Graph& graph, const GraphKey& key) {
  switch (key.kind) {
    case GraphKind::kConvBiasAct:
      describe_conv_bias_act(graph, key);
      break;
    case GraphKind::kReluBiasBackward:
      describe_relu_bias_backward(graph, key);
      break;
    case GraphKind::kConvDgrad:
      describe_dgrad(graph, key);
      break;
    case GraphKind::kConvWgrad:
      describe_wgrad(graph, key);
      break;
    case GraphKind::kBatchNormForward:
      describe_batch_norm_forward(graph, key);
      break;
    case GraphKind::kBatchNormBackward:
      describe_batch_norm_backward(graph, key);
      break;
  }
  cudnnHandle_t handle = at::native::getCudnnHandle();
  TCF_BUILD_STEP(graph.validate(), "validate");
  TCF_BUILD_STEP(graph.build_operation_graph(handle), "build_operation_graph");
  TCF_BUILD_STEP(graph.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  std::vector<fe::NumericalNote_t> excluded{fe::NumericalNote_t::DOWN_CONVERT_INPUTS};
  if (static_cast<at::ScalarType>(key.dtype) == at::kFloat && !key.allow_tf32) {
    excluded.push_back(fe::NumericalNote_t::TENSOR_CORE);
  }
  if (key.policy.deterministic) excluded.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
  graph.deselect_numeric_notes(excluded);
  if (key.policy.workspace_limit >= 0) graph.deselect_workspace_greater_than(key.policy.workspace_limit);
  return {};
}

// Whether candidate `index` builds and fits the policy's workspace limit (cuDNN 9.2+ checks the limit in
// check_support and build_plans only, not when one candidate is built by index).
bool candidate_usable(fe::graph::Graph& graph, const GraphKey& key, int64_t index) {
  if (graph.build_plan_at_index(index).is_bad()) return false;
  return key.policy.workspace_limit < 0 || graph.get_workspace_size_plan_at_index(index) <= key.policy.workspace_limit;
}

// The pinned candidate's index. An engine that is not among the usable candidates is the user's error, raised as
// ValueError with the valid choices: running another engine would defeat pinning's purpose (reproducibility).
int64_t find_pinned(fe::graph::Graph& graph, const GraphKey& key) {
  std::ostringstream valid;
  int64_t found = -1;
  for (int64_t index = 0; index < graph.get_execution_plan_count(); ++index) {
    if (!candidate_usable(graph, key, index)) continue;
    std::string name;
    if (graph.get_plan_name_at_index(index, name).is_bad()) continue;
    valid << (valid.tellp() > 0 ? ", " : "") << "#" << index << " " << name;
    if (found < 0 && (key.policy.pinned == name || key.policy.pinned == "#" + std::to_string(index))) found = index;
  }
  TORCH_CHECK_VALUE(found >= 0, "cudnn_fusion: the pinned engine '", key.policy.pinned, "' is not a usable candidate ",
                    "for the ", graph_kind_name(key.kind), " graph (", describe_problem(key), "). Valid choices: ",
                    valid.tellp() > 0 ? valid.str() : std::string("none"),
                    " (torch_cudnn_fusion.engines() lists them with their times)");
  TORCH_CHECK(graph.build_plan_at_index(found).is_good(), "cudnn_fusion: could not rebuild the pinned engine");
  return found;  // built last, so it is also the graph's candidate (what execute() and serialize() use)
}

BuildFailure build_chosen_plan(fe::graph::Graph& graph, const GraphKey& key, int64_t& workspace, int64_t& chosen) {
  auto failure = describe_and_query(graph, key);
  if (failure.failed()) return failure;
  cudnnHandle_t handle = at::native::getCudnnHandle();
  TCF_BUILD_STEP(graph.check_support(handle), "check_support");
  if (key.policy.mode == PolicyMode::kPinned) {
    chosen = find_pinned(graph, key);
    workspace = graph.get_workspace_size_plan_at_index(chosen);
    return {};
  }
  TCF_BUILD_STEP(graph.build_plans(handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  TCF_BUILD_STEP(graph.get_workspace_size(workspace), "get_workspace_size");
  return {};
}
#undef TCF_BUILD_STEP

// With TORCH_CUDNN_FUSION_DEBUG_DIR set, every graph the plan cache builds is written there as JSON, with its
// configuration and cuDNN's refusal if any (Python also turns cudnn-frontend's and cuDNN's logs on, to files there).
void dump_graph_if_asked(const GraphKey& key, const fe::graph::Graph& graph, const std::string& refusal) {
  static const char* directory = std::getenv("TORCH_CUDNN_FUSION_DEBUG_DIR");
  if (directory == nullptr || *directory == '\0') return;
  static std::atomic<int> counter{0};
  int number = counter++;
  nlohmann::json out;
  out["graph_kind"] = graph_kind_name(key.kind);
  out["configuration"] = describe_problem(key);
  out["refusal"] = refusal;
  try {
    out["graph"] = nlohmann::json::parse(graph.print());
  } catch (const std::exception& e) {
    out["graph"] = std::string("could not serialize: ") + e.what();
  }
  std::ofstream file(std::string(directory) + "/graph_" + std::to_string(number) + ".json");
  file << out.dump(1) << "\n";
}

std::shared_ptr<CachedPlan> build_plan(const GraphKey& key) {
  // cuDNN builds plans without looking at pointers, then refuses to execute them on misaligned ones
  // (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, seen with a 2-byte aligned bf16 input): check first.
  for (int8_t alignment : key.alignment) {
    if (alignment != 0 && alignment < 16) {
      return refused(key, "the requirement check", "a data pointer is not 16-byte aligned");
    }
  }
  auto graph = new_graph(key);
  try {
    int64_t workspace = 0, chosen = -1;
    auto failure = build_chosen_plan(*graph, key, workspace, chosen);
    if (failure.failed()) {
      auto refusal = refused(key, failure.stage.c_str(), failure.message);
      dump_graph_if_asked(key, *graph, refusal->refusal);
      return refusal;
    }
    dump_graph_if_asked(key, *graph, "");
    auto plan = std::make_shared<CachedPlan>();
    plan->graph = graph;
    plan->workspace_bytes = workspace;
    plan->chosen_index = chosen;
    plan->policy = key.policy;
    return plan;
  } catch (const c10::ValueError&) {
    throw;  // an invalid pinned engine: the user's error, not cuDNN's refusal
  } catch (const std::exception& e) {
    return refused(key, "graph construction", e.what());
  }
}

constexpr int64_t kPlansToTune = 8;

}  // namespace

std::string describe_refusal(const GraphKey& key, const std::string& stage, const std::string& message) {
  std::ostringstream out;
  out << "cuDNN refused the " << graph_kind_name(key.kind) << " graph (" << describe_problem(key) << ") at "
      << stage << ": " << message;
  auto unmet = unmet_requirements(key);
  if (unmet.empty()) {
    out << ". The configuration meets every requirement this library knows of (NHWC, channel and pointer "
           "alignment, compute capability, TF32); cuDNN gave no further reason";
  } else {
    out << ". Requirements not met:";
    for (const auto& requirement : unmet) out << " [" << requirement << "]";
  }
  return out.str();
}

std::shared_ptr<fe::graph::Graph> candidate_graph(const GraphKey& key, BuildFailure& failure) {
  auto graph = new_graph(key);
  try {
    failure = describe_and_query(*graph, key);
  } catch (const std::exception& e) {
    failure = BuildFailure{"graph construction", e.what()};
  }
  return failure.failed() ? nullptr : graph;
}

// The current stream (PyTorch's cuDNN handle is bound to it), or null while it captures a CUDA graph: nothing is
// timed inside a capture.
cudaStream_t stream_if_not_capturing(cudnnHandle_t handle) {
  cudaStream_t stream = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudnnGetStream(handle, &stream) != CUDNN_STATUS_SUCCESS ||
      cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
    return nullptr;
  }
  return stream == nullptr ? cudaStreamLegacy : stream;
}

float median_event_ms(const std::function<bool()>& run, cudaStream_t stream, int repeats) {
  if (!run()) return -1.0f;  // warm-up
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) return -1.0f;
  std::vector<float> samples;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    float ms = 0;
    if (cudaEventRecord(start, stream) != cudaSuccess || !run() || cudaEventRecord(stop, stream) != cudaSuccess ||
        cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      samples.clear();
      break;
    }
    samples.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (samples.empty()) return -1.0f;
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

float time_plan_ms(fe::graph::Graph& graph, int64_t index, const std::unordered_map<int64_t, void*>& pointers,
                   const at::Device& device, int repeats) {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  cudaStream_t stream = stream_if_not_capturing(handle);
  if (stream == nullptr) return -1.0f;
  int64_t workspace_bytes = graph.get_workspace_size_plan_at_index(index);
  auto workspace = at::empty({std::max<int64_t>(workspace_bytes, 1)}, at::TensorOptions().dtype(at::kByte).device(device));
  auto run = [&]() {
    auto variant_pack = pointers;  // execute extends the map it is given
    return graph.execute_plan_at_index(handle, variant_pack, workspace.data_ptr(), index).is_good();
  };
  return median_event_ms(run, stream, repeats);
}

void maybe_tune(const CachedPlan& plan, const std::unordered_map<int64_t, void*>& pointers, const at::Device& device,
                const std::function<void()>& aten, bool aten_under_benchmark) {
  if (plan.tuned.load(std::memory_order_acquire) || plan.deserialized) return;
  bool autotune = plan.policy.mode == PolicyMode::kAutotune;
  bool benchmark = plan.policy.mode == PolicyMode::kHeuristic && at::globalContext().benchmarkCuDNN();
  if (!autotune && !benchmark) return;
  cudaStream_t stream = stream_if_not_capturing(at::native::getCudnnHandle());
  if (stream == nullptr) return;  // a later run outside the capture tunes
  std::lock_guard<std::mutex> lock(plan.tune_mutex);
  if (plan.tuned.load()) return;
  auto& graph = *plan.graph;
  GraphKey limits;
  limits.policy = plan.policy;
  int64_t best_index = -1, best_workspace = 0;
  float best_ms = std::numeric_limits<float>::max();
  int64_t count = graph.get_execution_plan_count();
  int64_t candidates = autotune ? count : std::min<int64_t>(count, kPlansToTune);
  for (int64_t index = 0; index < candidates; ++index) {
    if (!candidate_usable(graph, limits, index)) continue;  // deselected (notes, workspace) or unbuildable
    float ms = time_plan_ms(graph, index, pointers, device, autotune ? 5 : 3);
    if (ms >= 0 && ms < best_ms) {
      best_ms = ms;
      best_index = index;
      best_workspace = graph.get_workspace_size_plan_at_index(index);
    }
  }
  if (best_index >= 0) {
    plan.tuned_ms.store(best_ms);
    plan.tuned_workspace_bytes.store(best_workspace);
    plan.tuned_index.store(best_index, std::memory_order_release);
  }
  if ((autotune || aten_under_benchmark) && aten) {
    float aten_ms = median_event_ms([&]() { aten(); return true; }, stream, 5);
    plan.aten_ms.store(aten_ms);
    plan.aten_faster.store(aten_ms >= 0 && (best_index < 0 || aten_ms < best_ms));
  }
  plan.tuned.store(true, std::memory_order_release);
  PlanCache::instance().count_tuned();
}

PlanInUse plan_in_use(const GraphKey& key) {
  PlanInUse info;
  auto plan = get_plan(key);
  if (!plan->ok()) {
    info.refusal = plan->refusal;
    return info;
  }
  int64_t index = plan->index_in_use();
  info.tuned = plan->tuned_index.load() >= 0 || (plan->deserialized && plan->tuned.load());
  if (plan->deserialized) {
    info.name = plan->loaded_engine;
  } else {
    auto status = index >= 0 ? plan->graph->get_plan_name_at_index(index, info.name)
                             : plan->graph->get_plan_name(info.name);
    if (status.is_bad()) info.name = "unknown (" + status.get_message() + ")";
  }
  info.workspace_bytes = info.tuned ? plan->tuned_workspace_bytes.load() : plan->workspace_bytes;
  info.aten_faster = plan->aten_faster.load();
  info.tuned_ms = plan->tuned_ms.load();
  info.aten_ms = plan->aten_ms.load();
  info.deserialized = plan->deserialized;
  return info;
}

void check_conv_problem(const ConvProblem& p) {
  auto at_least = [](const std::array<int64_t, 2>& values, int64_t min_value, const char* name) {
    TORCH_CHECK_VALUE(values[0] >= min_value && values[1] >= min_value, "cudnn_fusion: ", name,
                      " values must be >= ", min_value, ", got ", at::IntArrayRef(values));
  };
  at_least(p.stride, 1, "stride");
  at_least(p.dilation, 1, "dilation");
  at_least(p.pad_pre, 0, "padding (before)");
  at_least(p.pad_post, 0, "padding (after)");
  TORCH_CHECK_VALUE(p.groups >= 1, "cudnn_fusion: groups must be >= 1, got ", p.groups);
  TORCH_CHECK_VALUE(p.x_size[0] >= 0 && p.x_size[1] >= 1 && p.x_size[2] >= 1 && p.x_size[3] >= 1,
                    "cudnn_fusion: x's size must be [N >= 0, C >= 1, H >= 1, W >= 1], got ", at::IntArrayRef(p.x_size));
  TORCH_CHECK_VALUE(p.w_size[0] >= 1 && p.w_size[1] >= 1 && p.w_size[2] >= 1 && p.w_size[3] >= 1,
                    "cudnn_fusion: weight's size must be positive, got ", at::IntArrayRef(p.w_size));
  TORCH_CHECK_VALUE(p.x_size[1] == p.w_size[1] * p.groups, "cudnn_fusion: x has ", p.x_size[1],
                    " channels but weight of shape ", at::IntArrayRef(p.w_size), " with groups=", p.groups,
                    " expects ", p.w_size[1] * p.groups);
  TORCH_CHECK_VALUE(p.w_size[0] % p.groups == 0, "cudnn_fusion: weight's out_channels (", p.w_size[0],
                    ") must be divisible by groups (", p.groups, ")");
  for (int i = 0; i < 2; ++i) {
    int64_t extent = p.x_size[2 + i] + p.pad_pre[i] + p.pad_post[i];
    int64_t window = p.dilation[i] * (p.w_size[2 + i] - 1) + 1;
    TORCH_CHECK_VALUE(extent >= window, "cudnn_fusion: the padded input (", (i ? "width " : "height "), extent,
                      ") is smaller than the dilated kernel (", window, ")");
  }
}

std::array<int64_t, 4> ConvProblem::y_size() const {
  GraphKey key;
  key.x_size = x_size;
  key.w_size = w_size;
  key.stride = stride;
  key.pad_pre = pad_pre;
  key.pad_post = pad_post;
  key.dilation = dilation;
  return output_size(key);
}

std::vector<int64_t> dense_strides(const std::array<int64_t, 4>& size, bool channels_last) {
  const int64_t n = size[0], c = size[1], h = size[2], w = size[3];
  (void)n;
  if (channels_last) return {c * h * w, 1, w * c, c};
  return {c * h * w, h * w, w, 1};
}

int multiprocessor_count(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(device);
  if (found != known.end()) return found->second;
  int count = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess,
              "torch_cudnn_fusion: could not read the multiprocessor count of cuda:", device);
  known.emplace(device, count);
  return count;
}

int8_t pointer_alignment(const void* ptr) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  int8_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

GraphKey make_graph_key(GraphKind kind, const ConvProblem& p, const std::array<int8_t, 5>& alignment) {
  GraphKey key;
  key.kind = kind;
  key.device = static_cast<int8_t>(p.device);
  auto cc = compute_capability(p.device);
  key.cc_major = cc.major;
  key.cc_minor = cc.minor;
  static const int64_t cudnn_version = static_cast<int64_t>(cudnnGetVersion());
  key.cudnn_version = cudnn_version;
  key.dtype = static_cast<int8_t>(p.dtype);
  key.channels_last = p.channels_last;
  key.x_size = p.x_size;
  key.w_size = p.w_size;
  key.stride = p.stride;
  key.pad_pre = p.pad_pre;
  key.pad_post = p.pad_post;
  key.dilation = p.dilation;
  key.groups = p.groups;
  // Fields a kind's graph does not read stay at their defaults so they cannot split the cache.
  if (kind == GraphKind::kConvBiasAct) {
    key.has_bias = p.has_bias;
    key.has_residual = p.has_residual;
    key.relu = p.relu;
  }
  if (kind == GraphKind::kReluBiasBackward) {
    // An elementwise graph over y: described as a 1x1 conv whose output is y, with no conv parameters.
    key.x_size = p.y_size();
    key.w_size = {p.w_size[0], 1, 1, 1};
    key.stride = {1, 1};
    key.pad_pre = {0, 0};
    key.pad_post = {0, 0};
    key.dilation = {1, 1};
    key.groups = 1;
  }
  key.allow_tf32 = p.dtype == at::kFloat && at::globalContext().allowTF32CuDNN();
  key.alignment = alignment;
  key.policy = policy_for(p.policy, kind);
  return key;
}

std::shared_ptr<const CachedPlan> get_plan(const GraphKey& key) {
  return PlanCache::instance().get_or_build(key, [&key]() { return build_plan(key); });
}

bool execute_plan(const CachedPlan& plan, GraphKind kind, std::unordered_map<int64_t, void*>& pointers,
                  const at::Device& device) {
  cudnnHandle_t handle = at::native::getCudnnHandle();  // bound to the current stream
  int64_t index = plan.index_in_use();
  int64_t workspace_bytes = plan.tuned_index.load() >= 0 ? plan.tuned_workspace_bytes.load() : plan.workspace_bytes;
  at::Tensor workspace;
  void* workspace_ptr = nullptr;
  if (workspace_bytes > 0) {
    workspace = at::empty({workspace_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    workspace_ptr = workspace.data_ptr();
  }
  auto status = index >= 0 ? plan.graph->execute_plan_at_index(handle, pointers, workspace_ptr, index)
                           : plan.graph->execute(handle, pointers, workspace_ptr);
  if (status.is_good()) return true;
  PlanCache::instance().count_runtime_fallback(std::string("cuDNN failed to execute the ") + graph_kind_name(kind) +
                                               " graph: " + status.get_message());
  return false;
}

}  // namespace tcf
