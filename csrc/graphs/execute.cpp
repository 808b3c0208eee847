// Running a built plan on PyTorch's cuDNN handle and stream, and reporting the plan a key runs.
#include "graphs/graph_builder.h"

#include <atomic>

#include <ATen/ATen.h>
#include <ATen/cudnn/Handle.h>

namespace tcf {

namespace {

std::atomic<bool> frontend_execute_only{false};
std::atomic<int64_t> direct_executions{0};  // test aid: which path ran (one relaxed increment an execute)

}  // namespace

void RunnableGraph::prepare_direct_run() {
  direct_uids_.clear();
  using Uid = fe::graph::Tensor_attributes::uid_t;
  std::unordered_map<Uid, fe::graph::Tensor_attributes::pass_by_values_t> by_value;
  std::unordered_map<Uid, std::tuple<int64_t, int64_t, std::vector<float>>> in_workspace;
  std::unordered_map<Uid, std::pair<Uid, int64_t>> replacements;
  int64_t offset = 0;
  if (collect_pass_by_value_tensors_subtree(by_value).is_bad() || !by_value.empty()) return;
  if (collect_tensors_in_workspace_subtree(in_workspace, offset).is_bad() || !in_workspace.empty()) return;
  if (collect_variant_pack_replacements_subtree(replacements).is_bad() || !replacements.empty()) return;
  if (get_fe_workspace_size_subtree() != 0) return;
  direct_uids_.assign(variant_pack_uids.begin(), variant_pack_uids.end());
}

fe::error_t RunnableGraph::execute_direct(cudnnHandle_t handle, const std::unordered_map<int64_t, void*>& pointers,
                                          void* workspace, int64_t index) const {
  const int64_t chosen = index >= 0 ? index : plans.candidate;
  auto executable = plans.is_plan_index_executable(chosen);
  if (executable.is_bad()) return executable;
  std::vector<void*> device_pointers;
  device_pointers.reserve(direct_uids_.size());
  for (int64_t uid : direct_uids_) {
    auto found = pointers.find(uid);
    if (found == pointers.end()) {
      return {fe::error_code_t::INVALID_VARIANT_PACK, "uid " + std::to_string(uid) + " has no pointer"};
    }
    device_pointers.push_back(found->second);
  }
  return fe::detail::execute(handle, plans.execution_plans[chosen].get(), device_pointers, direct_uids_, workspace);
}

void set_frontend_execute_for_tests(bool enabled) { frontend_execute_only.store(enabled); }

int64_t direct_executions_for_tests() { return direct_executions.load(); }

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
  auto& graph = *plan.graph;
  const bool direct = graph.runs_direct() && !frontend_execute_only.load(std::memory_order_relaxed);
  if (direct) direct_executions.fetch_add(1, std::memory_order_relaxed);
  auto status = direct ? graph.execute_direct(handle, pointers, workspace_ptr, index)
                : index >= 0 ? graph.execute_plan_at_index(handle, pointers, workspace_ptr, index)
                             : graph.execute(handle, pointers, workspace_ptr);
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
  info.direct_execute = plan->graph->runs_direct();
  return info;
}

}  // namespace tcf
