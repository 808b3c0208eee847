// Running a graph from an op: the cached plan for a key (built on a miss), tuned on its first run as its policy
// asks, and the test aid that poisons outputs first. Shared by the conv and BatchNorm ops.
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <unordered_map>

#include <ATen/ATen.h>

#include "core/plan_cache.h"

namespace tcf {

// Runs `key`'s plan on `pointers` after poisoning `outputs` (test aid below); on its first run, tunes it as its
// policy asks (maybe_tune), timing `aten` (the same result computed with ATen) where the policy says so. Returns
// false when the caller must compute the result with ATen: cuDNN refused the plan or failed to execute it (a
// run-time fallback, counted), tuning found ATen faster, or the policy leaves the graph to ATen untimed
// (core/engine_policy.h, aten_untimed: no plan is built); those two not counted.
bool run_cached_graph(const GraphKey& key, std::unordered_map<int64_t, void*> pointers,
                      std::initializer_list<at::Tensor> outputs, const at::Device& device,
                      const std::function<void()>& aten);
// The same for a plan already looked up (get_plan) for a graph of `kind` (the caller asked aten_untimed first).
bool run_cached_graph(const std::shared_ptr<const CachedPlan>& plan, GraphKind kind,
                      std::unordered_map<int64_t, void*> pointers, std::initializer_list<at::Tensor> outputs,
                      const at::Device& device, const std::function<void()>& aten);

// Test aid: when on, every output is filled with NaN before its graph runs, so an element cuDNN did not write
// shows up in the comparison with eager.
void set_poison_outputs(bool enabled);
// Fills `t` with NaN when the test aid above is on (before a graph or kernel writes it).
void poison_output(const at::Tensor& t);

}  // namespace tcf
