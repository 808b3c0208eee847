// Tuning a built plan on its first run (autotune, or torch.backends.cudnn.benchmark): every candidate timed with
// CUDA events on the call's own pointers, the fastest kept.
#include "graphs/graph_builder.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/cuda/Sleep.h>
#include <ATen/cudnn/Handle.h>
#include <cuda_runtime_api.h>

namespace tcf {

cudaStream_t if_not_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // the query's error, not a kernel's
    return nullptr;
  }
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  return stream == nullptr ? cudaStreamLegacy : stream;
}

cudaStream_t stream_if_not_capturing(cudnnHandle_t handle) {
  cudaStream_t stream = nullptr;
  if (cudnnGetStream(handle, &stream) != CUDNN_STATUS_SUCCESS) return nullptr;
  return if_not_capturing(stream);
}

float median_event_ms(const std::function<bool()>& run, cudaStream_t stream, int repeats, int64_t sleep_cycles) {
  if (!run()) return -1.0f;  // warm-up
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) return -1.0f;
  std::vector<float> samples;
  for (int repeat = 0; repeat < repeats; ++repeat) {
    float ms = 0;
    if (sleep_cycles > 0) at::cuda::sleep(sleep_cycles);
    if (cudaEventRecord(start, stream) != cudaSuccess || !run() || cudaEventRecord(stop, stream) != cudaSuccess ||
        cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      samples.clear();
      break;
    }
    samples.push_back(ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (samples.empty()) return -1.0f;
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

float time_plan_ms(fe::graph::Graph& graph, int64_t index, const std::unordered_map<int64_t, void*>& pointers,
                   const at::Device& device, int repeats) {
  cudnnHandle_t handle = at::native::getCudnnHandle();
  cudaStream_t stream = stream_if_not_capturing(handle);
  if (stream == nullptr) return -1.0f;
  int64_t workspace_bytes = graph.get_workspace_size_plan_at_index(index);
  auto workspace = at::empty({std::max<int64_t>(workspace_bytes, 1)}, at::TensorOptions().dtype(at::kByte).device(device));
  auto run = [&]() {
    auto variant_pack = pointers;  // execute extends the map it is given
    return graph.execute_plan_at_index(handle, variant_pack, workspace.data_ptr(), index).is_good();
  };
  return median_event_ms(run, stream, repeats, kTimingSleepCycles);
}

void maybe_tune(const CachedPlan& plan, const std::unordered_map<int64_t, void*>& pointers, const at::Device& device,
                const std::function<void()>& aten) {
  if (plan.tuned.load(std::memory_order_acquire) || plan.deserialized) return;
  bool autotune = plan.policy.mode == PolicyMode::kAutotune;
  bool benchmark = plan.policy.mode == PolicyMode::kHeuristic && at::globalContext().benchmarkCuDNN();
  if (!autotune && !benchmark) return;
  cudaStream_t stream = stream_if_not_capturing(at::native::getCudnnHandle());
  if (stream == nullptr) return;  // a later run outside the capture tunes
  std::lock_guard<std::mutex> lock(plan.tune_mutex);
  if (plan.tuned.load()) return;
  const auto start = std::chrono::steady_clock::now();
  auto& graph = *plan.graph;
  int64_t best_index = -1, best_workspace = 0;
  float best_ms = std::numeric_limits<float>::max();
  int64_t count = graph.get_execution_plan_count();
  int64_t candidates = autotune ? count : std::min<int64_t>(count, plan.policy.benchmark_candidates);
  for (int64_t index = 0; index < candidates; ++index) {
    if (!candidate_usable(graph, plan.policy, index)) continue;  // deselected (notes, workspace) or unbuildable
    float ms = time_plan_ms(graph, index, pointers, device, autotune ? 5 : 3);
    if (ms >= 0 && ms < best_ms) {
      best_ms = ms;
      best_index = index;
      best_workspace = graph.get_workspace_size_plan_at_index(index);
    }
  }
  if (best_index >= 0) {
    plan.tuned_ms.store(best_ms);
    plan.tuned_workspace_bytes.store(best_workspace);
    plan.tuned_index.store(best_index, std::memory_order_release);
  }
  if ((autotune || plan.policy.aten_under_benchmark) && aten) {
    float aten_ms = median_event_ms([&]() { aten(); return true; }, stream, 5, kTimingSleepCycles);
    plan.aten_ms.store(aten_ms);
    plan.aten_faster.store(aten_ms >= 0 && (best_index < 0 || aten_ms < best_ms));
  }
  plan.tuned.store(true, std::memory_order_release);
  PlanCache::instance().count_tuned(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace tcf
