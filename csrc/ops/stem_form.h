// A stem conv's space-to-depth form (torch_cudnn_fusion/ops/stem.py) inside the conv ops' autograd nodes: the ops
// cudnn_fusion::stem_conv_bias_act and stem_conv_batch_norm_act run their conv on x and the filter rearranged, and
// their nodes (ConvBiasActFunction in conv_autograd.cpp, ConvFunction in bn_autograd.cpp) keep x in the conv's dtype
// and the filter as passed, not the rearranged tensors (zero channels and padding make those larger than what eager
// keeps); backward rearranges them again and takes the gradients back through the rearrangements. One op call and one
// node, in C++: the form's three op calls from Python, with saved-tensor hooks in Python, cost twice eager's host time
// on a small batch (H200, docs/benchmarks.md).
#pragma once

#include <array>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "ops/saved_ints.h"

namespace tcf {

// The form's conv: stride 1 (also its dilation), no padding, one group.
inline constexpr std::array<int64_t, 2> kFormStride{1, 1};
inline constexpr std::array<int64_t, 2> kFormPadding{0, 0};

class StemForm {
 public:
  // form: [block rows and columns of zeros before x's first, the rearranged input's block rows and columns, the
  // rearranged filter's rows and columns, its channels (8 or 16)] (stem.py's StemPlan.form); index and inverse: the
  // plan's; dtype: the conv's (the rearranged tensors are written in it).
  StemForm(at::Tensor index, at::Tensor inverse, at::IntArrayRef form, at::ScalarType dtype);

  at::Tensor input(const at::Tensor& x) const;  // cudnn_fusion::space_to_depth
  at::Tensor filter(const at::Tensor& weight) const;  // cudnn_fusion::stem_filter
  // The gradient of x [x_size, x_dtype] from that of its rearrangement; of the filter [weight_size, weight_dtype]
  // from that of the rearranged filter.
  at::Tensor input_grad(const at::Tensor& grad, at::IntArrayRef x_size, at::ScalarType x_dtype) const;
  at::Tensor filter_grad(const at::Tensor& grad, at::IntArrayRef weight_size, at::ScalarType weight_dtype) const;
  // The rearranged input's and filter's sizes for x [N, ...] and a filter of `out_channels`.
  std::vector<int64_t> input_size(int64_t batch) const;
  std::vector<int64_t> filter_size(int64_t out_channels) const;
  at::ScalarType dtype() const { return dtype_; }

  // For an autograd node: the ints into `ints`, index and inverse appended to `tensors`; back from the reader and
  // the saved tensors from position `first`.
  void save(SavedInts& ints, std::vector<at::Tensor>& tensors) const;
  static StemForm load(SavedIntsReader& ints, const std::vector<at::Tensor>& tensors, size_t first);

 private:
  at::Tensor index_, inverse_;
  std::array<int64_t, 7> form_;
  at::ScalarType dtype_;
};

// The two rearrangements through the dispatcher (their autograd where grad mode and the operand ask for it).
at::Tensor call_space_to_depth(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                               std::optional<at::ScalarType> dtype);
at::Tensor call_stem_filter(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                            at::IntArrayRef kernel, int64_t channels, std::optional<at::ScalarType> dtype);

// The gradient of x [x_size, x_dtype] from that of its rearrangement (also space_to_depth's own autograd).
at::Tensor space_to_depth_backward(const at::Tensor& grad, at::IntArrayRef x_size, at::ScalarType x_dtype,
                                   at::IntArrayRef padding_pre);
// cudnn_fusion::stem_filter_backward through the dispatcher (also stem_filter's own autograd).
at::Tensor call_stem_filter_backward(const at::Tensor& grad, const at::Tensor& inverse, at::IntArrayRef weight_size,
                                     at::ScalarType weight_dtype);

}  // namespace tcf
