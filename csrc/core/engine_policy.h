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
// the heuristic's first candidate; and the graphs whose ATen composition runs in the heuristic policy without
// cudnn.benchmark, where nothing is timed (aten_untimed). Python sets them when the extension loads
// (torch_cudnn_fusion/policy.py holds the values and the measurements behind them); until then one candidate, no ATen
// timing and no graph left to ATen, the heuristic's own choice.
void set_benchmark_tuning(int64_t candidates, const std::vector<GraphKind>& aten_timed,
                          const std::vector<GraphKind>& heuristic_only, const std::vector<GraphKind>& aten_untimed);

// Whether `kind`'s graph leaves its work to its ATen composition under `policy` (policy_for's) now: a kind in
// set_benchmark_tuning's aten_untimed, in the heuristic policy, with cudnn.benchmark off. No plan is built for it.
bool aten_untimed(GraphKind kind, const EnginePolicy& policy);

// What policy `id` asks of `kind`'s graph. deterministic is also on while torch.use_deterministic_algorithms(True).
// A kind the policy pins no engine for gets the heuristic's choice.
EnginePolicy policy_for(int64_t id, GraphKind kind);


}  // namespace tcf
