// cudnn_fusion::squeeze_excite: a squeeze-and-excitation block, x * gate(conv2(act(conv1(mean_hw(x))))), as one op
// call with one autograd node. Eager runs it as six modules and, under autocast, about ten autograd nodes (pool,
// two convs and their four operand casts, activation, gate, multiply); in the small models that carry these blocks
// (efficientnet_b0, mobilenet_v3, regnet_y) a training step waits on the host, and those calls are its time. The
// kernels are ATen's: the 1x1 convs on a 1x1 input are GEMMs (addmm), the rest ATen's pointwise ops and reductions,
// in the order and dtypes eager computes them. The decision to run it (CUDA, the conv dtype equal to x's) is
// Python's (torch_cudnn_fusion/ops/squeeze_excite.py).
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include "core/graph_key.h"
#include "ops/saved_ints.h"
#include "ops/tensor_checks.h"

namespace tcf {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_squeeze_excite(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2, int64_t activation) {
  TORCH_CHECK(x.dim() == 4, "cudnn_fusion::squeeze_excite: x must be 4-d (N, C, H, W), got ", x.dim(), " dimensions");
  int64_t c = x.size(1);
  TORCH_CHECK(w1.dim() == 4 && w1.size(1) == c && w1.size(2) == 1 && w1.size(3) == 1,
              "cudnn_fusion::squeeze_excite: w1 must be [R, ", c, ", 1, 1] for x of ", c, " channels, got ",
              w1.sizes());
  TORCH_CHECK(w2.dim() == 4 && w2.size(0) == c && w2.size(1) == w1.size(0) && w2.size(2) == 1 && w2.size(3) == 1,
              "cudnn_fusion::squeeze_excite: w2 must be [", c, ", ", w1.size(0), ", 1, 1], got ", w2.sizes());
  TORCH_CHECK(activation == static_cast<int64_t>(Activation::kRelu) ||
                  activation == static_cast<int64_t>(Activation::kSilu),
              "cudnn_fusion::squeeze_excite: activation must be ReLU's (", static_cast<int64_t>(Activation::kRelu),
              ") or SiLU's (", static_cast<int64_t>(Activation::kSilu), ") code, got ", activation);
}

// A 1x1 conv's weight as the [out, in] matrix of its GEMM, in x's dtype (the cast autocast makes of a conv operand).
at::Tensor as_matrix(const at::Tensor& w, at::ScalarType dtype) {
  return in_dtype(w.reshape({w.size(0), w.size(1)}), dtype);
}

at::Tensor one_by_one_conv(const at::Tensor& input, const at::Tensor& w, const std::optional<at::Tensor>& b) {
  if (b.has_value() && b->defined()) return at::addmm(in_dtype(*b, input.scalar_type()), input, w.t());
  return at::mm(input, w.t());
}

// The forward's values the backward reads: the weights as GEMM matrices in x's dtype, s = mean_hw(x),
// h_pre = conv1(s), h = act(h_pre), z = conv2(h), g = gate(z).
struct SqueezeExciteValues {
  at::Tensor w1m, w2m, s, h_pre, h, z, g;
};

SqueezeExciteValues squeeze_excite_values(const at::Tensor& x, const at::Tensor& w1,
                                          const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                                          const std::optional<at::Tensor>& b2, int64_t activation, bool hard_gate) {
  // The ops below as written: autocast would keep them in x's dtype anyway, but leaves no doubt.
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  SqueezeExciteValues v;
  auto dtype = x.scalar_type();
  v.w1m = as_matrix(w1, dtype);
  v.w2m = as_matrix(w2, dtype);
  v.s = x.mean({2, 3});  // [N, C], rounded to x's dtype as eager's global pool (ATen's is this mean)
  v.h_pre = one_by_one_conv(v.s, v.w1m, b1);
  v.h = activation == static_cast<int64_t>(Activation::kRelu) ? at::relu(v.h_pre) : at::silu(v.h_pre);
  v.z = one_by_one_conv(v.h, v.w2m, b2);
  v.g = hard_gate ? at::hardsigmoid(v.z) : at::sigmoid(v.z);
  return v;
}

// x * g at every position, as eager's broadcast multiply (the output takes x's layout)
at::Tensor excite(const at::Tensor& x, const at::Tensor& g) {
  return at::mul(x, g.view({g.size(0), g.size(1), 1, 1}));
}

at::Tensor squeeze_excite(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                          const at::Tensor& w2, const std::optional<at::Tensor>& b2, int64_t activation,
                          bool hard_gate) {
  check_squeeze_excite(x, w1, w2, activation);
  return excite(x, squeeze_excite_values(x, w1, b1, w2, b2, activation, hard_gate).g);
}

class SqueezeExciteFunction : public torch::autograd::Function<SqueezeExciteFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                            const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                            const std::optional<at::Tensor>& b2, int64_t activation, bool hard_gate) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    check_squeeze_excite(x, w1, w2, activation);
    auto v = squeeze_excite_values(x, w1, b1, w2, b2, activation, hard_gate);
    bool silu = activation == static_cast<int64_t>(Activation::kSilu);
    // ReLU's backward reads its output h, SiLU's its input h_pre; sigmoid's backward reads g, hardsigmoid's z
    ctx->save_for_backward({x, v.w1m, v.w2m, v.s, silu ? v.h_pre : at::Tensor(), v.h, v.g,
                            hard_gate ? v.z : at::Tensor()});
    auto dtype_code = [](const std::optional<at::Tensor>& t, const at::Tensor& otherwise) {
      return static_cast<int64_t>(t.has_value() && t->defined() ? t->scalar_type() : otherwise.scalar_type());
    };
    SavedInts()
        .add(silu)
        .add(hard_gate)
        .add(b1.has_value() && b1->defined())
        .add(b2.has_value() && b2->defined())
        .add(static_cast<int64_t>(w1.scalar_type()))
        .add(static_cast<int64_t>(w2.scalar_type()))
        .add(dtype_code(b1, w1))
        .add(dtype_code(b2, w2))
        .add(w1.sizes())
        .add(w2.sizes())
        .save(ctx);
    return excite(x, v.g);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    variable_list grads(7);
    const auto& dy = grad_outputs[0];
    if (!dy.defined()) return grads;
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w1m = saved[1], &w2m = saved[2], &s = saved[3], &h_pre = saved[4], &h = saved[5];
    const auto &g = saved[6], &z = saved[7];
    SavedIntsReader ints(ctx);  // in the order forward saved them
    const bool silu = ints.next_bool(), hard_gate = ints.next_bool();
    const bool has_b1 = ints.next_bool(), has_b2 = ints.next_bool();
    const auto w1_dtype = ints.next_dtype(), w2_dtype = ints.next_dtype();
    const auto b1_dtype = ints.next_dtype(), b2_dtype = ints.next_dtype();
    const auto w1_size = ints.next_list(), w2_size = ints.next_list();
    int64_t n = x.size(0), c = x.size(1);
    // The multiply's backward, as eager's: dy * g for x, and for g the sum over H and W of dy * x.
    auto dg = at::mul(dy, x).sum({2, 3});
    auto dz = hard_gate ? at::hardsigmoid_backward(dg, z) : at::sigmoid_backward(dg, g);
    auto dh = dz.mm(w2m);
    auto dh_pre = silu ? at::silu_backward(dh, h_pre) : at::threshold_backward(dh, h, 0);
    // the node's edges are its defined tensor inputs: x, w1, b1 (if given), w2, b2 (if given)
    size_t edge = 0;
    bool need_x = ctx->needs_input_grad(edge++), need_w1 = ctx->needs_input_grad(edge++);
    bool need_b1 = has_b1 && ctx->needs_input_grad(edge++);
    bool need_w2 = ctx->needs_input_grad(edge++);
    bool need_b2 = has_b2 && ctx->needs_input_grad(edge++);
    if (need_x) {
      auto dx = at::mul(dy, g.view({n, c, 1, 1}));
      // the mean's backward, ds / (H * W) at every position, added to the multiply's as autograd sums the two
      dx.add_(dh_pre.mm(w1m).div(x.size(2) * x.size(3)).view({n, c, 1, 1}));
      grads[0] = dx;
    }
    // The weights' gradients in x's dtype, as eager's conv backward computes them, then cast to the weights' own
    // (autocast's cast node).
    auto weight_grad = [](const at::Tensor& d, const at::Tensor& input, at::IntArrayRef size, at::ScalarType dtype) {
      return in_dtype(d.t().mm(input).reshape(size), dtype);
    };
    if (need_w1) grads[1] = weight_grad(dh_pre, s, w1_size, w1_dtype);
    if (need_b1) grads[2] = in_dtype(dh_pre.sum(0), b1_dtype);
    if (need_w2) grads[3] = weight_grad(dz, h, w2_size, w2_dtype);
    if (need_b2) grads[4] = in_dtype(dz.sum(0), b2_dtype);
    return at::GradMode::is_enabled() && !is_traced(x) ? not_differentiable_again(grads) : grads;
  }

  // Under create_graph=True the gradients above would carry a graph through ATen's ops, but not through what the
  // forward computed without one (the casts, the pooled and gated values): a second derivative would come out
  // silently incomplete. As Python's @once_differentiable, each gradient instead leads to a node that raises if it is
  // differentiated. (Not when torch.compile traces the backward: its tensors are fake.)
  static variable_list not_differentiable_again(variable_list grads) {
    variable_list defined;
    for (const auto& g : grads) {
      if (g.defined()) defined.push_back(g.detach().requires_grad_(true));
    }
    auto error = std::make_shared<torch::autograd::DelayedError>(
        "cudnn_fusion::squeeze_excite (SqueezeExcite) is differentiable once: a second derivative through it (e.g. a "
        "gradient penalty) needs the block eager, as in the model before fuse()",
        static_cast<int64_t>(defined.size()));
    auto wrapped = error->apply(std::move(defined));
    size_t next = 0;
    for (auto& g : grads) {
      if (g.defined()) g = wrapped[next++];
    }
    return grads;
  }
};

at::Tensor squeeze_excite_autograd(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                                   const at::Tensor& w2, const std::optional<at::Tensor>& b2, int64_t activation,
                                   bool hard_gate) {
  if (!at::GradMode::is_enabled()) {  // nothing to record: no node, nothing saved
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return squeeze_excite(x, w1, b1, w2, b2, activation, hard_gate);
  }
  return SqueezeExciteFunction::apply(x, w1, b1, w2, b2, activation, hard_gate);
}

}  // namespace
}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, CompositeExplicitAutograd, m) { m.impl("squeeze_excite", &tcf::squeeze_excite); }

TORCH_LIBRARY_IMPL(cudnn_fusion, Autograd, m) { m.impl("squeeze_excite", &tcf::squeeze_excite_autograd); }
