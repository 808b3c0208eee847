#include "core/engine_policy.h"

#include <atomic>
#include <mutex>
#include <vector>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

namespace tcf {
namespace {

std::mutex registry_mutex;
std::vector<RegisteredPolicy>& registry() {
  static auto* policies = new std::vector<RegisteredPolicy>{RegisteredPolicy{}};  // id 0: heuristic
  return *policies;
}

bool same(const RegisteredPolicy& a, const RegisteredPolicy& b) {
  return a.mode == b.mode && a.deterministic == b.deterministic && a.workspace_limit == b.workspace_limit &&
         a.pinned == b.pinned;
}

std::atomic<int64_t> benchmark_candidates{1};
std::atomic<uint32_t> aten_timed_kinds{0};  // bit k: GraphKind k
std::atomic<uint32_t> heuristic_only_kinds{0};  // bit k: GraphKind k
std::atomic<uint32_t> aten_untimed_kinds{0};  // bit k: GraphKind k

uint32_t kind_bits(const std::vector<GraphKind>& kinds) {
  uint32_t bits = 0;
  for (auto kind : kinds) bits |= 1u << static_cast<int>(kind);
  return bits;
}

}  // namespace

void set_benchmark_tuning(int64_t candidates, const std::vector<GraphKind>& aten_timed,
                          const std::vector<GraphKind>& heuristic_only, const std::vector<GraphKind>& aten_untimed) {
  TORCH_CHECK_VALUE(candidates >= 1, "cudnn_fusion: benchmark candidates must be >= 1, got ", candidates);
  benchmark_candidates.store(candidates);
  aten_timed_kinds.store(kind_bits(aten_timed));
  heuristic_only_kinds.store(kind_bits(heuristic_only));
  aten_untimed_kinds.store(kind_bits(aten_untimed));
}

bool aten_untimed(GraphKind kind, const EnginePolicy& policy) {
  return policy.mode == PolicyMode::kHeuristic && !at::globalContext().benchmarkCuDNN() &&
         ((aten_untimed_kinds.load(std::memory_order_relaxed) >> static_cast<int>(kind)) & 1u);
}

int64_t register_policy(const RegisteredPolicy& policy) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto& policies = registry();
  for (size_t id = 0; id < policies.size(); ++id) {
    if (same(policies[id], policy)) return static_cast<int64_t>(id);
  }
  policies.push_back(policy);
  return static_cast<int64_t>(policies.size() - 1);
}

EnginePolicy policy_for(int64_t id, GraphKind kind) {
  EnginePolicy out;
  if (id != 0) {
    std::lock_guard<std::mutex> lock(registry_mutex);
    const auto& policies = registry();
    TORCH_CHECK_VALUE(id > 0 && id < static_cast<int64_t>(policies.size()),
                      "cudnn_fusion: policy must be an id from register_policy (0..", policies.size() - 1, "), got ",
                      id);
    const auto& policy = policies[id];
    out.mode = policy.mode;
    out.deterministic = policy.deterministic;
    out.workspace_limit = policy.workspace_limit;
    if (policy.mode == PolicyMode::kPinned) {
      auto found = policy.pinned.find(graph_short_name(kind));
      if (found != policy.pinned.end()) {
        out.pinned = found->second;
      } else {
        out.mode = PolicyMode::kHeuristic;  // pinned for another graph of the layer
      }
    }
  }
  if (at::globalContext().deterministicAlgorithms()) out.deterministic = true;
  const bool heuristic_only = (heuristic_only_kinds.load(std::memory_order_relaxed) >> static_cast<int>(kind)) & 1u;
  out.benchmark_candidates = heuristic_only ? 1 : benchmark_candidates.load(std::memory_order_relaxed);
  out.aten_under_benchmark = (aten_timed_kinds.load(std::memory_order_relaxed) >> static_cast<int>(kind)) & 1u;
  return out;
}

}  // namespace tcf
