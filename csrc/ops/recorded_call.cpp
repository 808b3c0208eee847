#include "ops/recorded_call.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "ops/tensor_checks.h"

namespace tcf {

TensorMetadata TensorMetadata::of(const at::Tensor* t, bool with_alignment) {
  TensorMetadata m;
  if (t == nullptr) return m;
  m.defined = true;
  m.sizes = t->sizes().vec();
  m.strides = t->strides().vec();
  m.dtype = t->scalar_type();
  m.device = t->device();
  m.requires_grad = t->requires_grad();
  if (with_alignment) m.alignment = alignment_of(*t);
  return m;
}

bool TensorMetadata::matches(const at::Tensor* t) const {
  if (t == nullptr) return !defined;
  return defined && t->scalar_type() == dtype && t->device() == device && t->requires_grad() == requires_grad &&
         t->sizes() == at::IntArrayRef(sizes) && t->strides() == at::IntArrayRef(strides) &&
         (alignment < 0 || alignment_of(*t) == alignment);
}

CallState CallState::now() {
  CallState s;
  s.grad_enabled = at::GradMode::is_enabled();
  s.autocast = at::autocast::is_autocast_enabled(at::kCUDA);
  s.autocast_dtype = s.autocast ? at::autocast::get_autocast_dtype(at::kCUDA) : at::kFloat;
  s.deterministic = at::globalContext().deterministicAlgorithms();
  s.allow_tf32 = at::globalContext().allowTF32CuDNN();
  return s;
}

bool CallState::operator==(const CallState& other) const {
  return grad_enabled == other.grad_enabled && autocast == other.autocast && autocast_dtype == other.autocast_dtype &&
         deterministic == other.deterministic && allow_tf32 == other.allow_tf32;
}

CallRecord::CallRecord(std::initializer_list<const at::Tensor*> tensors, bool with_alignment)
    : state_(CallState::now()) {
  for (const at::Tensor* t : tensors) metadata_.push_back(TensorMetadata::of(t, with_alignment));
}

RecordedAffine::RecordedAffine(const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                               int64_t channels, const at::TensorOptions& options, const char* who) {
  bool no_affine = pointer(weight) == nullptr && pointer(bias) == nullptr;
  bool float_affine = pointer(weight) != nullptr && pointer(bias) != nullptr && weight->scalar_type() == at::kFloat &&
                      bias->scalar_type() == at::kFloat && weight->is_contiguous() && bias->is_contiguous();
  TORCH_CHECK(no_affine || float_affine, "cudnn_fusion: ", who,
              " takes a float32 contiguous BatchNorm weight and bias, or neither");
  if (no_affine) {
    ones_ = at::ones({channels}, options.dtype(at::kFloat));
    zeros_ = at::zeros({channels}, options.dtype(at::kFloat));
  }
}

std::optional<CallState> CallRecord::check(std::initializer_list<const at::Tensor*> tensors) const {
  if (tensors.size() != metadata_.size()) return std::nullopt;
  size_t i = 0;
  for (const at::Tensor* t : tensors) {
    if (!metadata_[i++].matches(t)) return std::nullopt;
  }
  auto state = CallState::now();
  if (!(state == state_)) return std::nullopt;
  return state;
}

}  // namespace tcf
