// Autograd for the stem form's two rearrangements, in C++ as the other ops' (in Python, their autograd cost the host
// more per call than the stem's GPU time on a batch of 128):
// - cudnn_fusion::space_to_depth saves no tensor: x's gradient is the inverse rearrangement of the output's, in ATen
//   ops, from x's sizes and dtype; the channels past 4 * C and the zero-padding blocks take none.
// - cudnn_fusion::stem_filter saves its `inverse` index: each weight element lands in the form exactly once, so the
//   weight's gradient is one gather of the form's, by that index (the form's zeros take none): our kernel, the op
//   cudnn_fusion::stem_filter_backward, which has no autograd of its own (as the conv ops' backward ops).
#include <torch/autograd.h>
#include <torch/library.h>

#include "ops/saved_ints.h"
#include "ops/stem_form.h"

namespace tcf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
    return {call_stem_filter_backward(grad, inverse, size, dtype), none, none, none, none, none};
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
