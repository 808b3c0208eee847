// Building a graph's plan: describe the graph, ask cuDNN's heuristics, build the candidate the policy picks; a
// refusal becomes a cached plan carrying the reason (core/requirements.h words it).
#include "graphs/graph_builder.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>

#include "core/requirements.h"

namespace tcf {

namespace {

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

}  // namespace

// Whether candidate `index` builds and fits the policy's workspace limit (cuDNN 9.2+ checks the limit in
// check_support and build_plans only, not when one candidate is built by index).

bool candidate_usable(fe::graph::Graph& graph, const EnginePolicy& policy, int64_t index) {
  if (graph.build_plan_at_index(index).is_bad()) return false;
  return policy.workspace_limit < 0 || graph.get_workspace_size_plan_at_index(index) <= policy.workspace_limit;
}

// The pinned candidate's index. An engine that is not among the usable candidates is the user's error, raised as

namespace {

// ValueError with the valid choices: running another engine would defeat pinning's purpose (reproducibility).
int64_t find_pinned(fe::graph::Graph& graph, const GraphKey& key) {
  std::ostringstream valid;
  int64_t found = -1;
  for (int64_t index = 0; index < graph.get_execution_plan_count(); ++index) {
    if (!candidate_usable(graph, key.policy, index)) continue;
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

std::atomic<int64_t> build_delay_ms{0};
std::atomic<int> refused_activation{-1};

std::shared_ptr<CachedPlan> build_plan(const GraphKey& key) {
  if (int64_t delay = build_delay_ms.load()) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  // cuDNN builds plans without looking at pointers, then refuses to execute them on misaligned ones
  // (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, seen with a 2-byte aligned bf16 input): check first.
  for (int8_t alignment : key.alignment) {
    if (alignment != 0 && alignment < 16) {
      return refused(key, "the requirement check", "a data pointer is not 16-byte aligned");
    }
  }
  if (key.kind == GraphKind::kConvBiasAct && static_cast<int>(key.conv().activation) == refused_activation.load()) {
    return refused(key, "the requirement check", "test aid: conv + bias graphs with this activation are refused");
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
    graph->prepare_direct_run();
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

}  // namespace

std::shared_ptr<RunnableGraph> candidate_graph(const GraphKey& key, BuildFailure& failure) {
  auto graph = new_graph(key);
  try {
    failure = describe_and_query(*graph, key);
  } catch (const std::exception& e) {
    failure = BuildFailure{"graph construction", e.what()};
  }
  return failure.failed() ? nullptr : graph;
}


void set_build_delay_for_tests(int64_t milliseconds) { build_delay_ms.store(milliseconds); }

void set_refused_activation_for_tests(int64_t activation) { refused_activation.store(static_cast<int>(activation)); }

std::shared_ptr<const CachedPlan> get_plan(const GraphKey& key) {
  return PlanCache::instance().get_or_build(key, [&key]() { return build_plan(key); });
}

}  // namespace tcf
