// Running a built plan on PyTorch's cuDNN handle and stream, and reporting the plan a key runs.
#include "graphs/graph_builder.h"

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>

namespace tcf {

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

PlanInUse plan_in_use(const GraphKey& key) {
  PlanInUse info;
  auto plan = PlanCache::instance().find(key);  // a report builds nothing: an evicted plan is said to be so
  if (plan == nullptr) {
    info.cached = false;
    return info;
  }
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

}  // namespace tcf
