// The integer arguments an autograd node keeps for its backward, as one entry of ctx->saved_data. Each entry costs a
// hash-map insertion and an IValue (a list one allocates) in forward and a lookup in backward: with nine entries a
// node's forward and backward took 33.9 us against 31.7 with them packed into one, its forward 4.1 against 3.2
// (benchmarks/autograd_saved_data.py on the CPU, torch 2.14, a 2-core AMD EPYC host, medians of 21 rounds:
// benchmarks/results/autograd_saved_data_cpu_2026-11-27.txt).
#pragma once

#include <cstdint>
#include <vector>

#include <torch/autograd.h>

namespace tcf {

// Writes values and length-prefixed lists in order; SavedIntsReader reads them back in the same order.
class SavedInts {
 public:
  SavedInts& add(int64_t value) {
    values_.push_back(value);
    return *this;
  }
  SavedInts& add(at::IntArrayRef values) {
    values_.push_back(static_cast<int64_t>(values.size()));
    values_.insert(values_.end(), values.begin(), values.end());
    return *this;
  }
  void save(torch::autograd::AutogradContext* ctx) { ctx->saved_data["ints"] = std::move(values_); }

 private:
  std::vector<int64_t> values_;
};

class SavedIntsReader {
 public:
  explicit SavedIntsReader(torch::autograd::AutogradContext* ctx) : values_(ctx->saved_data["ints"].toIntVector()) {}
  int64_t next() { return values_.at(next_++); }
  bool next_bool() { return next() != 0; }
  at::ScalarType next_dtype() { return static_cast<at::ScalarType>(next()); }
  std::vector<int64_t> next_list() {
    const auto size = static_cast<size_t>(next());
    TORCH_CHECK(next_ + size <= values_.size(), "cudnn_fusion: a saved argument list runs past the saved values");
    std::vector<int64_t> list(values_.begin() + next_, values_.begin() + next_ + size);
    next_ += size;
    return list;
  }

 private:
  std::vector<int64_t> values_;
  size_t next_ = 0;
};

}  // namespace tcf
