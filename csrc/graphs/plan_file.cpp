#include "graphs/plan_file.h"

#include "graphs/graph_builder.h"

#include <ATen/cudnn/Handle.h>
#include <c10/core/DeviceGuard.h>
#include <cuda_runtime_api.h>

namespace tcf {
namespace {

// The batchnorm graphs read epsilon and momentum as pass-by-value scalars, and a deserialized graph replays the
// values it was saved with: momentum changes every step with momentum=None, so those graphs are rebuilt instead.
bool serializable_kind(GraphKind kind) {
  return kind != GraphKind::kBatchNormForward && kind != GraphKind::kBatchNormBackward;
}

std::string check_hardware(const GraphKey& key) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || key.device < 0 || key.device >= devices) {
    return "it is for cuda:" + std::to_string(key.device) + ", which this process does not have";
  }
  auto cc = compute_capability(key.device);
  if (cc.major != key.cc_major || cc.minor != key.cc_minor) {
    return "it was built for sm_" + std::to_string(key.cc_major) + std::to_string(key.cc_minor) + ", this GPU is sm_" +
           std::to_string(cc.major) + std::to_string(cc.minor);
  }
  auto version = static_cast<int64_t>(cudnnGetVersion());
  if (version != key.cudnn_version) {
    return "it was built with cuDNN " + std::to_string(key.cudnn_version) + ", this process runs cuDNN " +
           std::to_string(version);
  }
  return "";
}

}  // namespace

std::vector<SavedPlan> saved_plans() {
  std::vector<SavedPlan> out;
  for (auto& [key, plan] : PlanCache::instance().entries()) {
    if (!plan->ok()) continue;
    SavedPlan saved;
    saved.key = key;
    saved.tuned = plan->tuned.load();
    saved.aten_faster = plan->aten_faster.load();
    saved.tuned_ms = plan->tuned_ms.load();
    saved.aten_ms = plan->aten_ms.load();
    if (plan->deserialized) {
      saved.engine = plan->loaded_engine;
      saved.index = plan->loaded_index;
      saved.serialized = plan->loaded_serialized;
      out.push_back(std::move(saved));
      continue;
    }
    std::lock_guard<std::mutex> lock(plan->tune_mutex);  // not while a first run tunes it
    auto& graph = *plan->graph;
    int64_t index = plan->index_in_use();  // -1: the heuristic's choice, the graph's candidate
    // Building the candidate in use (already built: this only selects it) makes it the one serialize() writes.
    if (index >= 0 && graph.build_plan_at_index(index).is_bad()) continue;
    saved.index = index;
    auto status = index >= 0 ? graph.get_plan_name_at_index(index, saved.engine) : graph.get_plan_name(saved.engine);
    if (status.is_bad()) saved.engine.clear();
    if (!serializable_kind(key.kind)) {
      saved.serialize_note = "batchnorm graphs are rebuilt (their scalars are baked into a serialized plan)";
    } else {
      try {
        auto status = graph.serialize(saved.serialized);
        if (status.is_bad()) {
          saved.serialized.clear();
          saved.serialize_note = "cuDNN could not serialize it: " + status.get_message();
        }
      } catch (const std::exception& e) {
        saved.serialized.clear();
        saved.serialize_note = std::string("cuDNN could not serialize it: ") + e.what();
      }
    }
    out.push_back(std::move(saved));
  }
  return out;
}

std::string load_saved_plan(const SavedPlan& saved) {
  auto why = check_hardware(saved.key);
  if (!why.empty()) return why;
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(saved.key.device)));
  auto plan = std::make_shared<CachedPlan>();
  plan->policy = saved.key.policy;
  plan->aten_faster.store(saved.aten_faster);
  plan->tuned_ms.store(saved.tuned_ms);
  plan->aten_ms.store(saved.aten_ms);
  std::string deserialize_error;
  if (!saved.serialized.empty() && serializable_kind(saved.key.kind)) {
    try {
      auto graph = std::make_shared<RunnableGraph>();  // runs through the frontend's execute (no prepare_direct_run)
      auto status = graph->deserialize(at::native::getCudnnHandle(), saved.serialized);
      int64_t workspace = 0;
      if (status.is_good()) status = graph->get_workspace_size(workspace);
      if (status.is_good()) {
        plan->graph = graph;
        plan->workspace_bytes = workspace;
        plan->deserialized = true;
        plan->loaded_engine = saved.engine;
        plan->loaded_index = saved.index;
        plan->loaded_serialized = saved.serialized;
        plan->tuned.store(saved.tuned);
        PlanCache::instance().insert(saved.key, plan);
        return "";
      }
      deserialize_error = status.get_message();
    } catch (const std::exception& e) {
      deserialize_error = e.what();
    }
  }
  // Rebuild the graph and build the saved candidate only.
  BuildFailure failure;
  auto graph = candidate_graph(saved.key, failure);
  if (!graph) return "cuDNN refused to rebuild it: " + failure.message;
  auto is_saved_engine = [&](int64_t index) {
    std::string name;
    return index >= 0 && index < graph->get_execution_plan_count() && graph->build_plan_at_index(index).is_good() &&
           graph->get_plan_name_at_index(index, name).is_good() && name == saved.engine;
  };
  int64_t found = is_saved_engine(saved.index) ? saved.index : -1;  // the same position, normally
  for (int64_t index = 0; index < graph->get_execution_plan_count() && found < 0; ++index) {
    if (index != saved.index && is_saved_engine(index)) found = index;
  }
  if (found < 0) {
    return "its engine " + saved.engine + " is no longer among cuDNN's candidates" +
           (deserialize_error.empty() ? "" : " (and deserializing failed: " + deserialize_error + ")");
  }
  if (graph->build_plan_at_index(found).is_bad()) return "its engine " + saved.engine + " no longer builds";
  graph->prepare_direct_run();
  plan->graph = graph;
  plan->chosen_index = found;
  plan->workspace_bytes = graph->get_workspace_size_plan_at_index(found);
  plan->tuned.store(true);  // the saved choice stands: no heuristic query, no timing
  PlanCache::instance().insert(saved.key, plan);
  return "";
}

}  // namespace tcf
