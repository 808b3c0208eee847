#include "ops/stem_form.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "ops/stem_ops.h"

namespace tcf {

at::Tensor call_space_to_depth(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                               std::optional<at::ScalarType> dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::space_to_depth", "")
                       .typed<decltype(space_to_depth)>();
  return op.call(x, padding_pre, out_size, dtype);
}

at::Tensor call_stem_filter(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                            at::IntArrayRef kernel, int64_t channels, std::optional<at::ScalarType> dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::stem_filter", "")
                       .typed<decltype(stem_filter)>();
  return op.call(weight, index, inverse, kernel, channels, dtype);
}

namespace {

std::array<int64_t, 7> form_values(at::IntArrayRef form) {
  TORCH_CHECK(form.size() == 7,
              "cudnn_fusion: a stem conv's form must be 7 values (padding before, the rearranged input's size, the "
              "rearranged filter's size, its channels; torch_cudnn_fusion.ops.stem.plan), got ", form);
  std::array<int64_t, 7> values;
  std::copy(form.begin(), form.end(), values.begin());
  return values;
}

}  // namespace

StemForm::StemForm(at::Tensor index, at::Tensor inverse, at::IntArrayRef form, at::ScalarType dtype)
    : index_(std::move(index)), inverse_(std::move(inverse)), form_(form_values(form)), dtype_(dtype) {}

at::Tensor StemForm::input(const at::Tensor& x) const {
  return call_space_to_depth(x, {form_[0], form_[1]}, {form_[2], form_[3]}, dtype_);
}

at::Tensor StemForm::filter(const at::Tensor& weight) const {
  return call_stem_filter(weight, index_, inverse_, {form_[4], form_[5]}, form_[6], dtype_);
}

at::Tensor StemForm::input_grad(const at::Tensor& grad, at::IntArrayRef x_size, at::ScalarType x_dtype) const {
  return space_to_depth_backward(grad, x_size, x_dtype, {form_[0], form_[1]});
}

at::Tensor StemForm::filter_grad(const at::Tensor& grad, at::IntArrayRef weight_size,
                                 at::ScalarType weight_dtype) const {
  return call_stem_filter_backward(grad, inverse_, weight_size, weight_dtype);
}

std::vector<int64_t> StemForm::input_size(int64_t batch) const { return {batch, form_[6], form_[2], form_[3]}; }

std::vector<int64_t> StemForm::filter_size(int64_t out_channels) const {
  return {out_channels, form_[6], form_[4], form_[5]};
}

void StemForm::save(SavedInts& ints, std::vector<at::Tensor>& tensors) const {
  ints.add(form_).add(static_cast<int64_t>(dtype_));
  tensors.push_back(index_);
  tensors.push_back(inverse_);
}

StemForm StemForm::load(SavedIntsReader& ints, const std::vector<at::Tensor>& tensors, size_t first) {
  const auto form = ints.next_list();
  const auto dtype = ints.next_dtype();
  return StemForm(tensors.at(first), tensors.at(first + 1), form, dtype);
}

// Channel (a * 2 + b) * c + k of block (R, X) goes back to x's channel k at (2 * (R - top) + a, 2 * (X - left) + b);
// the channels past 4 * c and the blocks of zeros take none.
at::Tensor space_to_depth_backward(const at::Tensor& grad, at::IntArrayRef x_size, at::ScalarType x_dtype,
                                   at::IntArrayRef padding_pre) {
  const int64_t n = x_size[0], c = x_size[1], h = x_size[2], w = x_size[3];
  const int64_t half_h = (h + 1) / 2, half_w = (w + 1) / 2;
  const int64_t top = padding_pre[0], left = padding_pre[1];
  auto g = grad.slice(1, 0, 4 * c);
  // negative padding crops: the blocks of zeros before x's first and past its last go
  g = at::constant_pad_nd(g, {-left, left + half_w - g.size(3), -top, top + half_h - g.size(2)}, 0);
  g = g.reshape({n, 2, 2, c, half_h, half_w}).permute({0, 3, 4, 1, 5, 2}).reshape({n, c, 2 * half_h, 2 * half_w});
  return g.slice(2, 0, h).slice(3, 0, w).to(x_dtype);
}

at::Tensor call_stem_filter_backward(const at::Tensor& grad, const at::Tensor& inverse, at::IntArrayRef weight_size,
                                     at::ScalarType weight_dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::stem_filter_backward", "")
                       .typed<decltype(stem_filter_backward)>();
  return op.call(grad, inverse, weight_size, weight_dtype);
}

}  // namespace tcf
