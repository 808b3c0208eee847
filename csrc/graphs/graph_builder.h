// The graph builders' shared helpers (conv_graphs, bn_graphs, build, tune, execute, engine_listing, plan_file): the only
// header that includes cudnn-frontend, whose headers alone take about 37 s to compile (-O2, 2-core machine) in each
// file that includes them.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <cudnn.h>
#include <cudnn_frontend.h>

#include "core/device.h"
#include "graphs/bn_graphs.h"
#include "graphs/conv_graphs.h"
#include "graphs/timing.h"

namespace tcf {

// Helpers shared by the graph builders (conv_graphs.cpp, bn_graphs.cpp).
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// A frontend graph that can also run its built plans without the frontend's preparation at each execute. The
// frontend's execute walks the graph on every call for pass-by-value scalars, tensors kept in its own workspace,
// uid replacements and auxiliary kernels, then looks each variant-pack uid up in the pointer map. A graph with none of
// those (the conv graphs) lists its variant pack's uids once, after its build (prepare_direct_run), and each run hands
// cuDNN the pointers in that order (execute_direct). Timed inside the process on H200 (branch phase-timing; 2026-11-28
// in docs/benchmarks.md), six conv layers' three executes each took -1 to 4 us less host time at batch 8 and 2 to 10
// at batch 128, of 10-60 us that are otherwise cuDNN's own; a layer's forward + backward varies more than that from
// run to run on one machine.
class RunnableGraph : public fe::graph::Graph {
 public:
  // After the graph's operation graph is built: lists the variant pack's uids if nothing needs the frontend's
  // preparation at execute; runs_direct() stays false otherwise. Call before the graph is shared between threads.
  void prepare_direct_run();
  bool runs_direct() const { return !direct_uids_.empty(); }
  // Runs built plan `index` (-1: the plan the build chose) on `pointers` (uid -> device pointer), as
  // execute_plan_at_index does; only where runs_direct().
  fe::error_t execute_direct(cudnnHandle_t handle, const std::unordered_map<int64_t, void*>& pointers, void* workspace,
                             int64_t index) const;

 private:
  std::vector<int64_t> direct_uids_;
};

fe::DataType_t fe_dtype(at::ScalarType dtype);
std::vector<int64_t> as_vector(const std::array<int64_t, 4>& a);
std::vector<int64_t> as_vector(const std::array<int64_t, 2>& a);
// A graph input / a graph output with explicit dims and dense strides in the layout.
TensorPtr add_tensor(fe::graph::Graph& graph, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                     bool channels_last, fe::DataType_t dtype);
void mark_output(const TensorPtr& tensor, const char* name, int64_t uid, const std::array<int64_t, 4>& size,
                 bool channels_last, fe::DataType_t dtype);
// An empty graph in the key's I/O dtype, float32 intermediates and compute.
std::shared_ptr<RunnableGraph> new_graph(const GraphKey& key);

// Where cuDNN refused a graph: the build step and cuDNN's message (both empty when nothing failed).
struct BuildFailure {
  std::string stage;
  std::string message;
  bool failed() const { return !stage.empty(); }
};

// Whether candidate `index` of a graph whose candidates were listed builds and fits the policy's workspace limit.
bool candidate_usable(fe::graph::Graph& graph, const EnginePolicy& policy, int64_t index);

// `key`'s graph with the heuristic's candidate plans listed but none built (for engine listing), or null with
// `failure` set.
std::shared_ptr<RunnableGraph> candidate_graph(const GraphKey& key, BuildFailure& failure);

// if_not_capturing of the current stream (PyTorch's cuDNN handle is bound to it).
cudaStream_t stream_if_not_capturing(cudnnHandle_t handle);

// Median milliseconds of `repeats` runs of built plan `index` on `pointers` after a warm-up, on the current
// stream; negative if it cannot run (or while a CUDA graph is being captured).
float time_plan_ms(fe::graph::Graph& graph, int64_t index, const std::unordered_map<int64_t, void*>& pointers,
                   const at::Device& device, int repeats);

// Strides cuDNN must be given for a dense tensor of `size` in the layout: set explicitly for every tensor,
// outputs included (the frontend's default output strides are NHWC, which silently wrote NHWC data into
// NCHW buffers when they were left unset).
std::vector<int64_t> dense_strides(const std::array<int64_t, 4>& size, bool channels_last);

// Each graph's nodes, added to an empty graph from new_graph (conv_graphs.cpp, bn_graphs.cpp); build.cpp picks one
// by the key's kind.
void describe_conv_bias_act(fe::graph::Graph& graph, const GraphKey& key);
void describe_relu_bias_backward(fe::graph::Graph& graph, const GraphKey& key);
void describe_dgrad(fe::graph::Graph& graph, const GraphKey& key);
void describe_wgrad(fe::graph::Graph& graph, const GraphKey& key);
void describe_batch_norm_forward(fe::graph::Graph& graph, const GraphKey& key);
void describe_batch_norm_backward(fe::graph::Graph& graph, const GraphKey& key);

}  // namespace tcf
