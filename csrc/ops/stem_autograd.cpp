// Autograd for the stem form's two rearrangements, in C++ as the other ops' (in Python, their autograd cost the host
// more per call than the stem's GPU time on a batch of 128):
// - cudnn_fusion::space_to_depth saves no tensor: x's gradient is the inverse rearrangement of the output's, in ATen
//   ops, from x's sizes and dtype; the channels past 4 * C and the zero-padding blocks take none.
// - cudnn_fusion::stem_filter saves its `inverse` index: each weight element lands in the form exactly once, so the
//   weight's gradient is one gather of the form's, by that index (the form's zeros take none). It is linear in the
//   gradient and reads nothing forward computed, so ATen differentiates it again under create_graph.
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/saved_ints.h"
#include "ops/stem_ops.h"

namespace tcf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_space_to_depth(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                               std::optional<at::ScalarType> dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::space_to_depth", "")
                       .typed<decltype(space_to_depth)>();
  return op.call(x, padding_pre, out_size, dtype);
}

// The gradient of x [n, c, h, w] from that of its rearrangement `grad` [n, >= 4c, rows, cols]: channel (a * 2 + b) * c
// + k of block (R, X) goes back to x's channel k at (2 * (R - top) + a, 2 * (X - left) + b).
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

class SpaceToDepthFunction : public torch::autograd::Function<SpaceToDepthFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::IntArrayRef padding_pre,
                               at::IntArrayRef out_size, std::optional<at::ScalarType> dtype) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto out = call_space_to_depth(x, padding_pre, out_size, dtype);
    SavedInts().add(x.sizes()).add(static_cast<int64_t>(x.scalar_type())).add(padding_pre).save(ctx);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    at::Tensor none;
    const auto& grad = grad_outputs[0];
    if (!grad.defined()) return {none, none, none, none};
    SavedIntsReader ints(ctx);  // in the order forward saved them
    const auto x_size = ints.next_list();
    const auto x_dtype = ints.next_dtype();
    const auto padding_pre = ints.next_list();
    return {space_to_depth_backward(grad, x_size, x_dtype, padding_pre), none, none, none};
  }
};

at::Tensor space_to_depth_autograd(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                                   std::optional<at::ScalarType> dtype) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) {
    // Nothing to record (the stem's input is usually the image): no autograd node.
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_space_to_depth(x, padding_pre, out_size, dtype);
  }
  return SpaceToDepthFunction::apply(x, padding_pre, out_size, dtype)[0];
}

at::Tensor call_stem_filter(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                            at::IntArrayRef kernel, int64_t channels, std::optional<at::ScalarType> dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::stem_filter", "")
                       .typed<decltype(stem_filter)>();
  return op.call(weight, index, inverse, kernel, channels, dtype);
}

class StemFilterFunction : public torch::autograd::Function<StemFilterFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& index,
                               const at::Tensor& inverse, at::IntArrayRef kernel, int64_t channels,
                               std::optional<at::ScalarType> dtype) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto out = call_stem_filter(weight, index, inverse, kernel, channels, dtype);
    ctx->save_for_backward({inverse});
    SavedInts().add(weight.sizes()).add(static_cast<int64_t>(weight.scalar_type())).save(ctx);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    at::Tensor none;
    const auto& grad = grad_outputs[0];
    if (!grad.defined()) return {none, none, none, none, none, none};
    const auto inverse = ctx->get_saved_variables()[0];
    SavedIntsReader ints(ctx);  // in the order forward saved them
    const auto size = ints.next_list();  // [O, C, kh, kw]
    const auto dtype = ints.next_dtype();
    auto flat = grad.permute({0, 2, 3, 1}).reshape({size[0], -1}).index_select(1, inverse).to(dtype);
    auto grad_weight = flat.view({size[0], size[2], size[3], size[1]}).permute({0, 3, 1, 2});
    return {grad_weight, none, none, none, none, none};
  }
};

at::Tensor stem_filter_autograd(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                                at::IntArrayRef kernel, int64_t channels, std::optional<at::ScalarType> dtype) {
  if (!at::GradMode::is_enabled() || !weight.requires_grad()) {  // nothing to record: no node, nothing saved
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return call_stem_filter(weight, index, inverse, kernel, channels, dtype);
  }
  return StemFilterFunction::apply(weight, index, inverse, kernel, channels, dtype)[0];
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, Autograd, m) {
  m.impl("space_to_depth", &tcf::space_to_depth_autograd);
  m.impl("stem_filter", &tcf::stem_filter_autograd);
}
