// Engine policies registered from Python (torch_cudnn_fusion.EnginePolicy): the ops take a policy id, and each
// graph's plan cache key carries the policy it resolves to for that graph.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "core/plan_cache.h"

namespace tcf {

struct RegisteredPolicy {
  PolicyMode mode = PolicyMode::kHeuristic;
  bool deterministic = false;
  int64_t workspace_limit = -1;
  std::unordered_map<std::string, std::string> pinned;  // graph name ("forward", "dgrad", ...) -> engine
};

// The id of `policy` (the same id for equal policies); id 0 is the default heuristic policy.
int64_t register_policy(const RegisteredPolicy& policy);

// How a plan's first run tunes it under torch.backends.cudnn.benchmark, for every policy: the number of the
// heuristic's candidates timed, the graphs whose ATen composition is timed with them, and the graphs that time only
// the heuristic's first candidate. Python sets them when the extension loads (torch_cudnn_fusion/policy.py holds the
// values and the measurements behind them); until then one candidate and no ATen timing, the heuristic's own choice.
void set_benchmark_tuning(int64_t candidates, const std::vector<GraphKind>& aten_timed,
                          const std::vector<GraphKind>& heuristic_only);

// What policy `id` asks of `kind`'s graph. deterministic is also on while torch.use_deterministic_algorithms(True).
// A kind the policy pins no engine for gets the heuristic's choice.
EnginePolicy policy_for(int64_t id, GraphKind kind);


}  // namespace tcf
