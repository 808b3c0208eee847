#include "ops/run_graph.h"

#include <atomic>
#include <limits>

#include "core/engine_policy.h"
#include "graphs/conv_graphs.h"

namespace tcf {

namespace {

std::atomic<bool> poison_outputs{false};

}  // namespace

bool run_cached_graph(const GraphKey& key, std::unordered_map<int64_t, void*> pointers,
                      std::initializer_list<at::Tensor> outputs, const at::Device& device,
                      const std::function<void()>& aten) {
  if (aten_untimed(key.kind, key.policy)) return false;
  return run_cached_graph(get_plan(key), key.kind, std::move(pointers), outputs, device, aten);
}

bool run_cached_graph(const std::shared_ptr<const CachedPlan>& plan, GraphKind kind,
                      std::unordered_map<int64_t, void*> pointers, std::initializer_list<at::Tensor> outputs,
                      const at::Device& device, const std::function<void()>& aten) {
  if (!plan->ok()) {
    PlanCache::instance().count_runtime_fallback(plan->refusal);
    return false;
  }
  maybe_tune(*plan, pointers, device, aten);
  if (plan->aten_faster.load(std::memory_order_acquire)) return false;
  for (const auto& output : outputs) poison_output(output);
  return execute_plan(*plan, kind, pointers, device);
}

void set_poison_outputs(bool enabled) { poison_outputs.store(enabled); }

void poison_output(const at::Tensor& t) {
  if (poison_outputs.load(std::memory_order_relaxed)) t.fill_(std::numeric_limits<double>::quiet_NaN());
}

}  // namespace tcf
