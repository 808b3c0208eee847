// A conv layer's problem and the plans of its graphs, as the ops see them: the cache key, the plan lookup (built on
// a miss), its tuning and its execution. The graph builders' own helpers, which need the frontend's types, are in
// graph_builder.h.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "core/device.h"
#include "core/plan_cache.h"

namespace tcf {

// One conv layer's configuration: its shape (the conv graphs' key shape) and what the ops add to it.
struct ConvProblem : ConvShape {
  at::ScalarType dtype = at::kFloat;
  bool channels_last = true;
  int device = 0;
  int64_t policy = 0;  // a registered engine policy's id (engine_policy.h); 0: the heuristic's choice
};

// Raises a c10::Error naming the argument (stride, padding, dilation, groups, channels, sizes) when `p` is not a
// valid convolution. Every entry point calls it before any arithmetic on the sizes: a stride of 0 reached a
// division and killed the process (SIGFPE).
void check_conv_problem(const ConvProblem& p);

// Tensor UIDs in the variant packs.
enum TensorUid : int64_t {
  kUidX = 1,
  kUidW = 2,
  kUidBias = 3,
  kUidResidual = 4,
  kUidY = 5,
  kUidDy = 6,
  kUidDz = 7,
  kUidDbias = 8,
  kUidDx = 9,
  kUidDw = 10,
  // batchnorm graphs
  kUidScale = 11,
  kUidShift = 12,
  kUidSavedMean = 13,
  kUidSavedInvStd = 14,
  kUidRunningMeanIn = 15,
  kUidRunningVarIn = 16,
  kUidRunningMeanOut = 17,
  kUidRunningVarOut = 18,
  kUidEpsilon = 19,
  kUidMomentum = 20,
  kUidDscale = 21,
  kUidDshift = 22,
};

// The key fields every graph shares: this device's compute capability, the cuDNN loaded, `policy` resolved for
// `kind`. The callers below add their family's shape.
GraphKey key_common(GraphKind kind, at::ScalarType dtype, bool channels_last, int device, int64_t policy,
                    const std::array<int8_t, 5>& alignment);

// The plan cache key for `kind` over `problem`. `alignment` lists the operands' pointer alignments in the
// order the kind reads them (forward: x, w, bias, residual, y; relu backward: dy, y, dz; dgrad: dz, w, dx;
// wgrad: dz, x, dw).
GraphKey make_graph_key(GraphKind kind, const ConvProblem& problem, const std::array<int8_t, 5>& alignment);
// The ReLU-backward-with-bias-gradient key over the conv output y (alignments: dy, y, dz, dbias).
GraphKey make_relu_bias_key(at::ScalarType dtype, bool channels_last, int device, const std::array<int64_t, 4>& y_size,
                            int64_t policy, const std::array<int8_t, 5>& alignment);

// Returns the built plan for `key` (from the cache, or built now and cached), or the refusal.
std::shared_ptr<const CachedPlan> get_plan(const GraphKey& key);

// Test aid: every build first sleeps `milliseconds` (0: off), so a test can hold a build open while other threads
// use the cache.
void set_build_delay_for_tests(int64_t milliseconds);
// Test aid: every plan runs through the frontend's execute, also where it could run directly (RunnableGraph), so a
// test can compare the two.
void set_frontend_execute_for_tests(bool enabled);
// Test aid: how many plan runs in this process took the direct path (RunnableGraph::execute_direct).
int64_t direct_executions_for_tests();
// Test aid: every conv + bias graph with this activation (Activation's code; -1: off) is refused as cuDNN would refuse
// it, so that the path taken after a refusal can be tested.
void set_refused_activation_for_tests(int64_t activation);

// Runs a built plan (the candidate its policy chose) on the current stream with PyTorch's cuDNN handle and a
// workspace from PyTorch's caching allocator. Returns false, after recording why as a runtime fallback, if cuDNN
// fails to execute it: the caller then computes the result with ATen.
bool execute_plan(const CachedPlan& plan, GraphKind kind, std::unordered_map<int64_t, void*>& pointers,
                  const at::Device& device);

// On a plan's first run, where its policy asks for it (autotune, or heuristic with torch.backends.cudnn.benchmark
// on): times the candidates on these pointers (under cudnn.benchmark the heuristic's first
// policy.benchmark_candidates) and keeps the fastest for every later run; under autotune, or cudnn.benchmark with
// policy.aten_under_benchmark, also times `aten` (the ATen composition the graph stands for; may be empty) and marks
// the plan aten_faster when it won.
// Skipped inside CUDA graph capture (a later run outside one tunes). Outputs in `pointers` are overwritten.
void maybe_tune(const CachedPlan& plan, const std::unordered_map<int64_t, void*>& pointers, const at::Device& device,
                const std::function<void()>& aten);

// The plan the cache runs for `key`: cuDNN's name for it (engine id and knobs), its workspace, whether autotuning
// chose it; or the refusal; or, when the cache does not hold it (evicted, cleared), cached = false.
struct PlanInUse {
  bool cached = true;
  std::string name;
  int64_t workspace_bytes = 0;
  bool tuned = false;
  bool aten_faster = false;  // autotune ran the ATen composition instead: it was faster
  float tuned_ms = -1.0f;    // the chosen candidate's median time when tuned
  float aten_ms = -1.0f;     // the ATen composition's, under autotune
  bool deserialized = false;
  bool direct_execute = false;  // runs without the frontend's preparation at each execute (RunnableGraph)
  std::string refusal;
};
PlanInUse plan_in_use(const GraphKey& key);

}  // namespace tcf
