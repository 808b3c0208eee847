// Plan cache: built cuDNN graphs keyed by everything that changes the plan, bounded LRU, thread safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/graph_key.h"

namespace cudnn_frontend {}

namespace tcf {

namespace fe = cudnn_frontend;

// Declared only: the frontend's headers cost about 27 s of compile time per file that includes them, so only the
// files that build, run or serialize graphs do (graph_builder.h, which defines it).
class RunnableGraph;

// A built graph ready to execute, or the reason cuDNN refused to build it.
struct CachedPlan {
  std::shared_ptr<RunnableGraph> graph;     // null when refused
  int64_t workspace_bytes = 0;              // of the heuristic's first buildable plan
  std::string refusal;                      // empty when built

  int64_t chosen_index = -1;               // the pinned candidate; -1: the heuristic's choice
  // Loaded from a plan file as cuDNN's serialized plan: the graph then holds that plan only (asking it for names or
  // serializing it again crashed), so the saved name, position and bytes are kept to report and save it again.
  bool deserialized = false;
  std::string loaded_engine;
  int64_t loaded_index = -1;
  std::vector<uint8_t> loaded_serialized;
  EnginePolicy policy;                      // the key's: whether and how the first run tunes

  // Set once, on the first run under the autotune policy or torch.backends.cudnn.benchmark: the fastest candidate
  // (the heuristic's first choice measured up to 1.7x slower than another of its top plans on H200), and under
  // autotune whether the ATen composition beat every candidate.
  mutable std::mutex tune_mutex;
  mutable std::atomic<bool> tuned{false};
  mutable std::atomic<int64_t> tuned_index{-1};  // -1: chosen_index, or the heuristic's choice
  mutable std::atomic<int64_t> tuned_workspace_bytes{0};
  mutable std::atomic<bool> aten_faster{false};  // autotune: run the ATen composition instead
  mutable std::atomic<float> tuned_ms{-1.0f};    // the fastest candidate's median time
  mutable std::atomic<float> aten_ms{-1.0f};     // the ATen composition's (autotune only)

  bool ok() const { return graph != nullptr; }
  int64_t index_in_use() const {
    int64_t index = tuned_index.load(std::memory_order_acquire);
    return index >= 0 ? index : chosen_index;
  }
};

struct PlanCacheStats {
  int64_t entries = 0;
  int64_t capacity = 0;
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t builds = 0;         // graphs cuDNN built successfully
  int64_t refusals = 0;       // graphs cuDNN refused (cached as refused)
  int64_t evictions = 0;
  double build_seconds = 0;   // total time spent building, refused attempts included
  int64_t tuned = 0;          // plans autotuned (torch.backends.cudnn.benchmark)
  double tune_seconds = 0;    // total time spent tuning them: building the candidates, timing them and ATen's kernel
  int64_t runtime_fallbacks = 0;  // op calls that ran the ATen composition: plan refused, or execution failed
  std::string last_runtime_fallback;  // why the latest of those did
};

class PlanCache {
 public:
  static PlanCache& instance();

  // Returns the cached plan for `key`, building it with `build` on a miss. Refusals are cached too, so a
  // configuration cuDNN refused is not rebuilt on every call. A build (whole seconds when cold) runs outside the
  // cache's lock: threads asking for other keys go on meanwhile; threads asking for the same key wait for that one
  // build (each key has its own in-flight record, a once-guard).
  std::shared_ptr<const CachedPlan> get_or_build(const GraphKey& key,
                                                 const std::function<std::shared_ptr<CachedPlan>()>& build);
  // The cached plan for `key`, or null; builds nothing and counts nothing (for reports).
  std::shared_ptr<const CachedPlan> find(const GraphKey& key);

  // Puts a plan loaded from a file in the cache (replacing any entry for `key`).
  void insert(const GraphKey& key, std::shared_ptr<const CachedPlan> plan);
  // Every cached entry, most recently used first (for saving).
  std::vector<std::pair<GraphKey, std::shared_ptr<const CachedPlan>>> entries();

  PlanCacheStats stats();
  void clear();  // drops every plan and zeroes the counters
  void set_capacity(int64_t capacity);
  void count_runtime_fallback(const std::string& why);
  void count_tuned(double seconds);

 private:
  using Entry = std::pair<GraphKey, std::shared_ptr<const CachedPlan>>;
  // A build in progress: whoever started it fulfils the promise; others asking for the key wait on the future.
  struct InFlight {
    std::promise<std::shared_ptr<const CachedPlan>> promise;
    std::shared_future<std::shared_ptr<const CachedPlan>> result = promise.get_future().share();
  };

  void evict_to_capacity_locked();

  std::mutex mutex_;
  std::unordered_map<GraphKey, std::shared_ptr<InFlight>, GraphKeyHash> in_flight_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<GraphKey, std::list<Entry>::iterator, GraphKeyHash> index_;
  PlanCacheStats stats_;
  int64_t capacity_ = 1024;
};

}  // namespace tcf
