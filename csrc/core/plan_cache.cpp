#include "core/plan_cache.h"

#include <chrono>

namespace tcf {

PlanCache& PlanCache::instance() {
  // Leaked on purpose: plans hold cuDNN descriptors that must not be destroyed after cuDNN unloads at exit.
  static PlanCache* cache = new PlanCache();
  return *cache;
}

std::shared_ptr<const CachedPlan> PlanCache::get_or_build(const GraphKey& key,
                                                          const std::function<std::shared_ptr<CachedPlan>()>& build) {
  std::shared_ptr<InFlight> in_flight;
  bool builds_here = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = index_.find(key);
    if (found != index_.end()) {
      ++stats_.hits;
      lru_.splice(lru_.begin(), lru_, found->second);
      return found->second->second;
    }
    auto building = in_flight_.find(key);
    if (building != in_flight_.end()) {
      in_flight = building->second;
      ++stats_.hits;  // built once, by the thread already at it
    } else {
      in_flight = std::make_shared<InFlight>();
      in_flight_.emplace(key, in_flight);
      builds_here = true;
      ++stats_.misses;
    }
  }
  if (!builds_here) return in_flight->result.get();  // rethrows what the build threw

  auto start = std::chrono::steady_clock::now();
  std::shared_ptr<const CachedPlan> plan;
  try {
    plan = build();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_flight_.erase(key);
    }
    in_flight->promise.set_exception(std::current_exception());
    throw;
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.build_seconds += seconds;
    ++(plan->ok() ? stats_.builds : stats_.refusals);
    in_flight_.erase(key);
    auto found = index_.find(key);  // a plan file loaded meanwhile: keep the newer entry
    if (found == index_.end()) {
      lru_.emplace_front(key, plan);
      index_[key] = lru_.begin();
      evict_to_capacity_locked();
    }
  }
  in_flight->promise.set_value(plan);
  return plan;
}

std::shared_ptr<const CachedPlan> PlanCache::find(const GraphKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = index_.find(key);
  return found == index_.end() ? nullptr : found->second->second;
}

void PlanCache::evict_to_capacity_locked() {
  while (static_cast<int64_t>(lru_.size()) > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
    ++stats_.evictions;
  }
}

void PlanCache::insert(const GraphKey& key, std::shared_ptr<const CachedPlan> plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = index_.find(key);
  if (found != index_.end()) {
    lru_.erase(found->second);
    index_.erase(found);
  }
  lru_.emplace_front(key, std::move(plan));
  index_[key] = lru_.begin();
  evict_to_capacity_locked();
}

std::vector<std::pair<GraphKey, std::shared_ptr<const CachedPlan>>> PlanCache::entries() {
  std::lock_guard<std::mutex> lock(mutex_);
  return {lru_.begin(), lru_.end()};
}

PlanCacheStats PlanCache::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  PlanCacheStats out = stats_;
  out.entries = static_cast<int64_t>(lru_.size());
  out.capacity = capacity_;
  return out;
}

void PlanCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  index_.clear();
  lru_.clear();
  stats_ = PlanCacheStats{};
}

void PlanCache::set_capacity(int64_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_ = capacity;
  evict_to_capacity_locked();
}

void PlanCache::count_tuned(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.tuned;
  stats_.tune_seconds += seconds;
}

void PlanCache::count_runtime_fallback(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.runtime_fallbacks;
  stats_.last_runtime_fallback = why;
}

}  // namespace tcf
