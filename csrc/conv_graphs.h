// cuDNN frontend graphs for a fused conv layer: one build function per graph kind, one execute function.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include <torch/extension.h>

#include "plan_cache.h"

namespace tcf {

// One conv layer's configuration: what the graphs are built from. Sizes are in logical NCHW order
// whatever the memory layout.
struct ConvProblem {
  at::ScalarType dtype = at::kFloat;
  bool channels_last = true;
  int device = 0;
  std::array<int64_t, 4> x_size{};  // N, C, H, W
  std::array<int64_t, 4> w_size{};  // K, C / groups, R, S
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> pad_pre{0, 0};
  std::array<int64_t, 2> pad_post{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
  bool has_bias = false;
  bool has_residual = false;
  bool relu = true;
  int64_t policy = 0;  // a registered engine policy's id (engine_policy.h); 0: the heuristic's choice

  std::array<int64_t, 4> y_size() const;
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

// Helpers shared by the graph builders (conv_graphs.cpp, bn_graphs.cpp).
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

struct ComputeCapability {
  int8_t major = 0;
  int8_t minor = 0;
};
ComputeCapability compute_capability(int device);  // cached per device
fe::DataType_t fe_dtype(at::ScalarType dtype);
std::vector<int64_t> as_vector(const std::array<int64_t, 4>& a);
std::vector<int64_t> as_vector(const std::array<int64_t, 2>& a);
std::array<int64_t, 4> output_size(const GraphKey& key);  // of the conv a key describes
// A graph input / a graph output with explicit dims and dense strides in the layout.
TensorPtr add_tensor(fe::graph::Graph& graph, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                     bool channels_last, fe::DataType_t dtype);
void mark_output(const TensorPtr& tensor, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                 bool channels_last, fe::DataType_t dtype);
// An empty graph in the key's I/O dtype, float32 intermediates and compute.
std::shared_ptr<fe::graph::Graph> new_graph(const GraphKey& key);

// Multiprocessors of a CUDA device (cached).
int multiprocessor_count(int device);

// Byte alignment of a data pointer, capped at 16 (what cuDNN's vectorized engines ask for).
int8_t pointer_alignment(const void* ptr);

// The plan cache key for `kind` over `problem`. `alignment` lists the operands' pointer alignments in the
// order the kind reads them (forward: x, w, bias, residual, y; relu backward: dy, y, dz; dgrad: dz, w, dx;
// wgrad: dz, x, dw).
GraphKey make_graph_key(GraphKind kind, const ConvProblem& problem, const std::array<int8_t, 5>& alignment);

// Returns the built plan for `key` (from the cache, or built now and cached), or the refusal.
std::shared_ptr<const CachedPlan> get_plan(const GraphKey& key);

// Runs a built plan (the candidate its policy chose) on the current stream with PyTorch's cuDNN handle and a
// workspace from PyTorch's caching allocator. Returns false, after recording why as a runtime fallback, if cuDNN
// fails to execute it: the caller then computes the result with ATen.
bool execute_plan(const CachedPlan& plan, GraphKind kind, std::unordered_map<int64_t, void*>& pointers,
                  const at::Device& device);

// On a plan's first run, where its policy asks for it (autotune, or heuristic with torch.backends.cudnn.benchmark
// on): times the candidates on these pointers and keeps the fastest for every later run; under autotune also times
// `aten` (the ATen composition the graph stands for; may be empty) and marks the plan aten_faster when it won
// (with `aten_under_benchmark`, under cudnn.benchmark too).
// Skipped inside CUDA graph capture (a later run outside one tunes). Outputs in `pointers` are overwritten.
void maybe_tune(const CachedPlan& plan, const std::unordered_map<int64_t, void*>& pointers, const at::Device& device,
                const std::function<void()>& aten, bool aten_under_benchmark = false);

// Where cuDNN refused a graph: the build step and cuDNN's message (both empty when nothing failed).
struct BuildFailure {
  std::string stage;
  std::string message;
  bool failed() const { return !stage.empty(); }
};

// "cuDNN refused the <graph> graph (<configuration>) at <stage>: <message>. Requirements not met: [...]": names the
// requirements of the fused engines the configuration does not meet, not only cuDNN's status.
std::string describe_refusal(const GraphKey& key, const std::string& stage, const std::string& message);

// `key`'s graph with the heuristic's candidate plans listed but none built (for engine listing), or null with
// `failure` set.
std::shared_ptr<fe::graph::Graph> candidate_graph(const GraphKey& key, BuildFailure& failure);

// The current stream (PyTorch's cuDNN handle is bound to it), or null while it captures a CUDA graph: nothing is
// timed inside a capture.
cudaStream_t stream_if_not_capturing(cudnnHandle_t handle);

// Median milliseconds of `repeats` CUDA-event timings of `run` on `stream`, after one warm-up run; negative if a
// run returns false or an event fails.
float median_event_ms(const std::function<bool()>& run, cudaStream_t stream, int repeats);

// Median milliseconds of `repeats` runs of built plan `index` on `pointers` after a warm-up, on the current
// stream; negative if it cannot run (or while a CUDA graph is being captured).
float time_plan_ms(fe::graph::Graph& graph, int64_t index, const std::unordered_map<int64_t, void*>& pointers,
                   const at::Device& device, int repeats);

// The plan the cache runs for `key` (building it if needed): cuDNN's name for it (engine id and knobs), its
// workspace, whether autotuning chose it; or the refusal.
struct PlanInUse {
  std::string name;
  int64_t workspace_bytes = 0;
  bool tuned = false;
  bool aten_faster = false;  // autotune ran the ATen composition instead: it was faster
  float tuned_ms = -1.0f;    // the chosen candidate's median time when tuned
  float aten_ms = -1.0f;     // the ATen composition's, under autotune
  bool deserialized = false;
  std::string refusal;
};
PlanInUse plan_in_use(const GraphKey& key);

// Strides cuDNN must be given for a dense tensor of `size` in the layout: set explicitly for every tensor,
// outputs included (the frontend's default output strides are NHWC, which silently wrote NHWC data into
// NCHW buffers when they were left unset).
std::vector<int64_t> dense_strides(const std::array<int64_t, 4>& size, bool channels_last);

}  // namespace tcf
