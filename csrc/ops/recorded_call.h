// What a recorded call (conv_call.h, conv_bn_call.h) compares a repeat with: the metadata of each tensor and the
// global state its decision depended on. A record holds them as they were when Python decided; a repeat whose
// tensors and state all match runs from C++ without Python's checks.
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

namespace tcf {

// What of one tensor a decision depends on; `alignment` only where the recording op's plans depend on it.
struct TensorMetadata {
  bool defined = false;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
  bool requires_grad = false;
  int8_t alignment = -1;  // alignment_of(t), or -1: not compared

  static TensorMetadata of(const at::Tensor* t, bool with_alignment);
  bool matches(const at::Tensor* t) const;
};

// The global state a decision reads: grad mode, CUDA autocast and its dtype, deterministic algorithms, cuDNN's TF32.
struct CallState {
  bool grad_enabled = false;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kFloat;
  bool deterministic = false;
  bool allow_tf32 = false;

  static CallState now();
  bool operator==(const CallState& other) const;
};

// A recorded call's tensors (in a fixed order, nullptr for an absent one) and the global state, as they were when
// Python decided the call.
class CallRecord {
 public:
  CallRecord(std::initializer_list<const at::Tensor*> tensors, bool with_alignment);
  // The global state now, when `tensors` (in the recorded order) and it match the record; nothing otherwise.
  std::optional<CallState> check(std::initializer_list<const at::Tensor*> tensors) const;

 private:
  std::vector<TensorMetadata> metadata_;
  CallState state_;
};

// A pointer to an optional tensor's value, nullptr when absent or undefined.
inline const at::Tensor* pointer(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? &*t : nullptr;
}

// A recorded BatchNorm's scale and shift as its op takes them (conv_bn_call.h, bn_call.h): the layer's own weight and
// bias, float32 and contiguous, handed over as they are; or, where the layer has neither (affine=False), 1 and 0 made
// once with the record. `who` names the record in the error.
class RecordedAffine {
 public:
  RecordedAffine(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, int64_t channels,
                 const at::TensorOptions& options, const char* who);
  // The call's scale and shift: a call that matched the record has a weight and bias exactly where it had them.
  const at::Tensor& scale(const std::optional<at::Tensor>& weight) const { return pointer(weight) ? *weight : ones_; }
  const at::Tensor& shift(const std::optional<at::Tensor>& bias) const { return pointer(bias) ? *bias : zeros_; }

 private:
  at::Tensor ones_, zeros_;
};

}  // namespace tcf
