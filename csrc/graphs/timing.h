// CUDA-event timing for the choices made under torch.backends.cudnn.benchmark (plans, ATen's kernels, our kernels'
// plans and implementations), without cudnn-frontend: ops that time only our kernels include this alone
// (defined in graphs/tune.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include <cuda_runtime_api.h>

namespace tcf {

// `stream`, or null while it captures a CUDA graph (or cannot be asked): nothing is timed inside a capture. The
// default stream is returned as cudaStreamLegacy.
cudaStream_t if_not_capturing(cudaStream_t stream);

// Median milliseconds of `repeats` CUDA-event timings of `run` on `stream` (the current stream), after one warm-up
// run; negative if a run returns false or an event fails. With sleep_cycles > 0 each timed run is enqueued behind a
// kernel that spins that many cycles (at::cuda::sleep), so that the host's time to issue the run is not timed as the
// GPU idling: for runs of a few microseconds, whose host cost is as long as the kernels.
float median_event_ms(const std::function<bool()>& run, cudaStream_t stream, int repeats, int64_t sleep_cycles = 0);

// The spin that each timed run of a choice waits behind (about 100 us at 2 GHz), longer than the host takes to issue
// a run, so that the choice is made on GPU time (median_event_ms). Without it, the depthwise wgrad's choice ran
// slower than its plan 0 on small layers (H200s, 2026-11-26ac, ops/depthwise_ops.cpp); and the BatchNorm backward's
// graph, timed against ATen's kernels, ran 14.7 us at 160 channels 7x7 (batch 256, bf16) where eager's ATen kernels
// took 12.4 (H100, 2026-12-07c). Timed so, the op's backward there still took 14.5 us against eager's 12.5 (H100,
// 2026-12-07g, batch_norm_backward.py): those 12.5 us are a CUDA-graph replay's. Issued on one stream, as an eager
// step issues them, eager's kernels took 14.4 us there (H100, 2026-12-07j, docs/benchmarks.md).
constexpr int64_t kTimingSleepCycles = 200000;

// The choices timed under torch.backends.cudnn.benchmark, one per key (the depthwise wgrad's plan, the BatchNorm
// forward's implementation), thread safe. A caller times without holding the lock, which would hold every other
// key's choice (and the listings) for the timing's milliseconds: two threads that time one key at once each time it,
// and the first to keep its choice wins.
template <typename Key, typename Choice>
class TimedChoices {
 public:
  std::optional<Choice> find(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = choices_.find(key);
    if (found == choices_.end()) return std::nullopt;
    return found->second;
  }
  // `made`, or the choice kept for `key` before it
  Choice keep(const Key& key, const Choice& made) {
    std::lock_guard<std::mutex> lock(mutex_);
    return choices_.emplace(key, made).first->second;
  }
  std::vector<Choice> all() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<Choice> out;
    for (const auto& entry : choices_) out.push_back(entry.second);
    return out;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    choices_.clear();
  }

 private:
  std::mutex mutex_;
  std::map<Key, Choice> choices_;
};

}  // namespace tcf
