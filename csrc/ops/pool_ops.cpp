// cudnn_fusion::global_avg_pool: F.adaptive_avg_pool2d(x, 1), whose backward hands the layer before it the gradient
// channels_last, in a tensor of its own (torch_cudnn_fusion/nn/pool.py says why). Both halves are ATen's: the forward
// is eager's own call, the backward the same division by H * W, laid out channels_last. The autograd node is C++: a
// gradient made in a Python backward reached the next node where a fused BatchNorm backward could not write over it
// (tests/test_bn_gpu.py counts those calls).
#include <torch/autograd.h>
#include <torch/library.h>

namespace tcf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor global_avg_pool(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 4, "cudnn_fusion::global_avg_pool: x must be 4-d (N, C, H, W), got ", x.dim(),
              " dimensions");
  return at::adaptive_avg_pool2d(x, {1, 1});
}

at::Tensor call_global_avg_pool(const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::global_avg_pool", "")
                       .typed<decltype(global_avg_pool)>();
  return op.call(x);
}

class GlobalAvgPoolFunction : public torch::autograd::Function<GlobalAvgPoolFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->saved_data["x_size"] = x.sizes().vec();
    return call_global_avg_pool(x);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto& grad = grad_outputs[0];
    if (!grad.defined()) return {at::Tensor()};
    auto size = ctx->saved_data["x_size"].toIntVector();
    // each element grad / (H * W) in grad's dtype, as eager's mean backward computes it
    return {grad.div(size[2] * size[3]).expand(size).contiguous(at::MemoryFormat::ChannelsLast)};
  }
};

at::Tensor global_avg_pool_autograd(const at::Tensor& x) {
  if (!at::GradMode::is_enabled() || !x.requires_grad()) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;  // nothing to record
    return call_global_avg_pool(x);
  }
  return GlobalAvgPoolFunction::apply(x);
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, CompositeExplicitAutograd, m) { m.impl("global_avg_pool", &tcf::global_avg_pool); }

TORCH_LIBRARY_IMPL(cudnn_fusion, Autograd, m) { m.impl("global_avg_pool", &tcf::global_avg_pool_autograd); }
