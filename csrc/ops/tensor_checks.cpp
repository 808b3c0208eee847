#include "ops/tensor_checks.h"

#include "core/device.h"
#include "kernels/element_type.h"

namespace tcf {

static_assert(kActivationRelu == static_cast<int>(Activation::kRelu) &&
              kActivationRelu6 == static_cast<int>(Activation::kRelu6) &&
              kActivationSilu == static_cast<int>(Activation::kSilu) &&
              kActivationHardswish == static_cast<int>(Activation::kHardswish) &&
              kActivationLeakyRelu == static_cast<int>(Activation::kLeakyRelu));

Activation activation_from(int64_t value) {
  TORCH_CHECK(value >= 0 && value <= 2, "cudnn_fusion: activation must be 0 (none), 1 (ReLU) or 2 (ReLU6), got ",
              value);
  return static_cast<Activation>(value);
}

Activation batch_norm_activation_from(int64_t value) {
  TORCH_CHECK(value >= 0 && value <= 5, "cudnn_fusion: activation must be 0 (none), 1 (ReLU), 2 (ReLU6), 3 (SiLU), "
              "4 (Hardswish) or 5 (LeakyReLU), got ", value);
  return static_cast<Activation>(value);
}

void apply_activation_(at::Tensor& y, Activation activation, double negative_slope) {
  if (activation == Activation::kRelu) y.relu_();
  if (activation == Activation::kRelu6) y.clamp_(0, 6);
  if (activation == Activation::kSilu) at::silu_(y);
  if (activation == Activation::kHardswish) at::hardswish_(y);
  if (activation == Activation::kLeakyRelu) at::leaky_relu_(y, negative_slope);
}

at::Tensor activation_backward_from_input(const at::Tensor& grad_y, const at::Tensor& input, Activation activation,
                                          double negative_slope) {
  TORCH_CHECK(applied_after_cudnn(activation), "cudnn_fusion: activation_backward_from_input takes SiLU (3), "
              "Hardswish (4) or LeakyReLU (5), got ", static_cast<int64_t>(activation));
  if (activation == Activation::kLeakyRelu) return at::leaky_relu_backward(grad_y, input, negative_slope, false);
  return activation == Activation::kSilu ? at::silu_backward(grad_y, input) : at::hardswish_backward(grad_y, input);
}

at::Tensor activation_backward(const at::Tensor& grad_y, const at::Tensor& y, Activation activation) {
  if (activation == Activation::kRelu) return at::threshold_backward(grad_y, y, 0);
  if (activation == Activation::kRelu6) return at::hardtanh_backward(grad_y, y, 0, 6);
  return grad_y;
}

void check_supported_dtype(at::ScalarType dtype, const char* name) {
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat, "cudnn_fusion: ", name,
              " must be float16, bfloat16 or float32, got ", dtype);
}

void check_supported_dtype(const at::Tensor& t, const char* name) { check_supported_dtype(t.scalar_type(), name); }

void check_4d_cuda(const at::Tensor& t, const char* name, const char* layout) {
  TORCH_CHECK(t.is_cuda(), "cudnn_fusion: ", name, " must be a CUDA tensor, got one on ", t.device());
  TORCH_CHECK(t.dim() == 4, "cudnn_fusion: ", name, " must be a 4-D tensor ", layout, ", got ", t.dim(),
              "-D with shape ", t.sizes());
  check_supported_dtype(t, name);
}

void check_like(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK(t.device() == x.device(), "cudnn_fusion: ", name, " must be on the same device as x (", x.device(),
              "), got ", t.device());
  TORCH_CHECK(t.scalar_type() == x.scalar_type(), "cudnn_fusion: ", name, " dtype must match x dtype (",
              x.scalar_type(), "), got ", t.scalar_type());
}

void check_same_as(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK(t.device() == x.device() && t.scalar_type() == x.scalar_type() && t.sizes() == x.sizes(),
              "cudnn_fusion: ", name, " must match x (", x.sizes(), ", ", x.scalar_type(), ", ", x.device(),
              "), got ", t.sizes(), ", ", t.scalar_type(), ", ", t.device());
}

std::array<int64_t, 4> size4(at::IntArrayRef size) { return {size[0], size[1], size[2], size[3]}; }

bool use_channels_last(const at::Tensor& a, const at::Tensor& b) {
  return a.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
         b.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
}

at::MemoryFormat memory_format(bool channels_last) {
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

bool is_traced(const at::Tensor& t) {
  const auto traced = c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::Functionalize,
                                           c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
  return t.key_set().has_any(traced);
}

int8_t alignment_of(const at::Tensor& t) { return t.defined() && t.numel() > 0 ? pointer_alignment(t.data_ptr()) : 0; }

}  // namespace tcf
