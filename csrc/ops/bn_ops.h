// The CUDA implementations of the BatchNorm ops: BatchNorm in training (batch statistics, running statistics
// update) with the residual add and ReLU / ReLU6 fused after it, and its backward. Three implementations, chosen by
// the caller: our NHWC kernel (kernels/batch_norm_forward_kernel.cu) for the forward, the frontend graph (batchnorm
// node + pointwise ops) and the legacy BatchNorm API (cudnnBatchNormalizationForwardTrainingEx / BackwardEx with its
// fused activation). Where a cuDNN one fails at run time the op computes the same result with ATen and counts a
// runtime fallback.
#pragma once

#include <array>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <ATen/ATen.h>

#include "graphs/bn_graphs.h"

namespace tcf {

// kKernel: the forward in our NHWC kernel (an x that is not channels_last runs the graph's), the backward as the
// graph implementation's (our kernel with an activation, NHWC; cuDNN's batchnorm-backward graph otherwise).
enum class BatchNormImplementation : int64_t { kGraph = 0, kLegacy = 1, kKernel = 2 };

// Under torch.backends.cudnn.benchmark (not under deterministic algorithms), a training forward that asks for our
// kernel (implementation 2, channels_last) on a shape first seen is timed against the graph implementation (cuDNN's
// batchnorm graph where it builds one, with the launch that commits the running statistics where the op updates
// them in place; SiLU, Hardswish and LeakyReLU applied after it): medians of 5 CUDA-event timings after a warm-up,
// each behind the spin of graphs/timing.h (GPU time, not the host's issue time), on the call's own tensors,
// with the running statistics written to copies. The faster runs from then on, as cuDNN's algorithms are chosen
// under benchmark. Neither is the faster everywhere: at batch 256, bf16 (H100, 2026-12-07c, batch_norm_forward.py)
// ours took 0.120 ms at 16 channels 112x112 against the graph's 0.128, and 0.271 against 0.369 at 144@56, but
// 0.0174 against 0.0123 at 160@7 and 0.0318 against 0.0180 at 576@7, where eager took 0.0159 and 0.0442. The graph
// costs the host more a call (24.8 against 14.5 us at batch 8): the choice is on GPU time, as cuDNN's are.
// Nothing is timed inside a CUDA graph capture: our kernel runs there until a call outside one has chosen.
struct BatchNormForwardChoice {
  std::array<int64_t, 4> x_size{};  // N, C, H, W
  at::ScalarType dtype = at::kFloat;
  int64_t activation = 0;
  bool residual = false, running_stats = false, in_place = false;
  bool graph = false;                  // the graph implementation runs; false: our kernel
  float ours_ms = -1.0f, graph_ms = -1.0f;  // negative: did not run (the graph refused, or failed at run time)
};
// Every choice timed so far (for diagnostics), and forgetting them (torch_cudnn_fusion.clear_plan_cache).
std::vector<BatchNormForwardChoice> batch_norm_forward_choices();
void clear_batch_norm_forward_choices();

// `policy`: a registered engine policy's id (engine_policy.h; 0: the heuristic's choice). `negative_slope`:
// LeakyReLU's slope below 0 (activation 5); the other activations ignore it.
// y = act(batch_norm(x) + residual) with batch statistics. weight, bias, running_mean, running_var: float32 [C].
// Returns y, the saved mean and inverse standard deviation (biased variance), the updated running mean and
// variance (unbiased variance; empty without running statistics: the inputs are not modified), and the reserve
// buffer the legacy implementation's backward needs (empty for the graph).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_act_forward(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& residual, double momentum,
    double eps, int64_t activation, int64_t implementation, int64_t policy,
    double negative_slope);

// Gradients of batch_norm_act_forward: grad_x, grad_residual (empty without a residual), grad_weight, grad_bias.
// The activation's mask comes from the saved output y (y > 0, and y < 6 for ReLU6), or, where our NHWC kernel runs
// it without a residual, from x (the normalized x, recomputed as the kernel reads it). y may be undefined wherever
// batch_norm_backward_reads_y says it is not read; the autograd nodes save it only where it is (eager BatchNorm
// saves no output either, so an in-place op on it afterwards is fine, and a y not kept alive by the node is freed
// as soon as the layers after it are done with it).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, const at::Tensor& reserve,
    double eps, int64_t activation, bool has_residual, int64_t implementation, int64_t policy,
    double negative_slope);

// Whether batch_norm_act_backward reads y for a layer run with this activation, residual and implementation, on an
// x that is NHWC (channels_last) or not: with an activation, where the legacy API runs it, where a residual was added
// before the activation (the mask is not the normalized x's) or where the layout is not NHWC (ATen's activation
// backward first).
bool batch_norm_backward_reads_y(int64_t activation, bool has_residual, int64_t implementation, bool channels_last);

// Whether our NHWC kernel runs batch_norm_act_backward (with an activation, channels_last, not the legacy API):
// the backward that the two-step and in-place variants below run. Without an activation it is not our kernel: with
// g = dy (4d4658d, reverted) it took 22.6, 25.0 and 23.8 us on mobilenet_v2's narrow layers without one (64 and 96
// channels at 14x14, 160 at 7x7, batch 256, bf16, H100, 2026-12-07d) against eager's 16.0, 20.3 and 12.5, where
// cuDNN's graph or ATen's kernel took 15.5, 19.1 and 14.7 in another process (2026-12-07c): its fixed cost on few
// rows a thread (docs/benchmarks.md 2026-12-07d).
bool batch_norm_backward_in_our_kernel(int64_t activation, int64_t implementation, bool channels_last);

// Whether the autograd node runs batch_norm_act_backward as its two steps below, freeing grad_y between them: after
// a residual add, where our NHWC kernel runs it. The one op would hold grad_y, the residual's gradient and dx at
// once, where eager's ReLU node has freed grad_y before BatchNorm's backward allocates.
bool batch_norm_backward_in_two_steps(int64_t activation, bool has_residual, int64_t implementation,
                                      bool channels_last);

// Whether the autograd node may hand `grad` (the incoming gradient of x's shape) to the in-place variants below: the
// engine holds the only reference to it and to its storage (no hook, retain_grad or second consumer keeps it), it is
// dense channels_last in x's dtype on x's device, needs no gradient itself, and no tracer looks on (torch.compile's
// fake and functional tensors take the functional ops).
bool batch_norm_backward_may_overwrite(const at::Tensor& grad, const at::Tensor& x);

// batch_norm_act_backward without a residual where our kernel runs it, with grad_x written over grad_y (each element
// is read, then written, by one thread): returns grad_weight, grad_bias. One activation-sized tensor fewer than
// eager's ReLU and BatchNorm backward, which allocate one each.
std::tuple<at::Tensor, at::Tensor> batch_norm_act_backward_(const at::Tensor& grad_y, const at::Tensor& x,
                                                            const at::Tensor& weight, const at::Tensor& bias,
                                                            const at::Tensor& save_mean,
                                                            const at::Tensor& save_invstd, int64_t activation,
                                                            double negative_slope);

// Step 1: grad_z (the masked gradient, which is also the residual's), grad_weight, grad_bias. x channels_last; y the
// forward output (the mask after a residual add) or None (recomputed from x).
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_act_backward_reduce(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, int64_t activation,
    double negative_slope);

// Step 1 with grad_z (the masked gradient) written over grad_y: returns grad_weight, grad_bias.
std::tuple<at::Tensor, at::Tensor> batch_norm_act_backward_reduce_(
    const at::Tensor& grad_y, const at::Tensor& x, const std::optional<at::Tensor>& y, const at::Tensor& weight,
    const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd, int64_t activation,
    double negative_slope);

// Step 2: grad_x from step 1's grad_z, grad_weight and grad_bias (dx's coefficients are theirs over the rows: no
// tensor of its own between the steps).
at::Tensor batch_norm_backward_dx(const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight,
                                  const at::Tensor& bias, const at::Tensor& save_mean, const at::Tensor& save_invstd,
                                  const at::Tensor& grad_weight, const at::Tensor& grad_bias);

// batch_norm_act_forward with the running statistics updated in place and the step counted in num_batches_tracked
// when given, in one kernel launch, as conv_batch_norm_act_forward does (for a training BatchNorm2d that follows no
// conv: one launch where batch_norm_act's caller copied both statistics back and counted the step itself). running_mean
// and running_var: float32, contiguous, on x's device. Returns y, save_mean, save_invstd and the legacy API's reserve.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_act_update_forward(
    const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& running_mean,
    const at::Tensor& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation, int64_t implementation,
    int64_t policy, double negative_slope);

// The training Conv2d + BatchNorm2d (+ residual) (+ activation) layer as one op, for the host time of one call
// instead of several: z = conv2d(x, conv_weight, conv_bias) as ATen computes it (at::convolution: PyTorch's own
// cuDNN call, so the same numbers as F.conv2d), in `conv_dtype` when given (x, conv_weight and conv_bias cast to it
// first, as autocast casts F.conv2d's operands), then batch_norm_act_forward(z, ...). Unlike batch_norm_act it
// updates running_mean and running_var in place, and counts the step in num_batches_tracked when given (as
// nn.BatchNorm2d does; their version counters move), in one kernel launch. Returns y, z, save_mean, save_invstd and
// the legacy API's reserve.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> conv_batch_norm_act_forward(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
    const at::Tensor& weight, const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope);

// batch_norm_act_update through the dispatcher (its autograd kernel calls it below autograd; the C++ record,
// bn_call.h, above it).
using BatchNormUpdateOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
BatchNormUpdateOutputs call_batch_norm_act_update(const at::Tensor& x, const at::Tensor& weight,
                                                  const at::Tensor& bias, const at::Tensor& running_mean,
                                                  const at::Tensor& running_var,
                                                  const std::optional<at::Tensor>& num_batches_tracked,
                                                  const std::optional<at::Tensor>& residual, double momentum,
                                                  double eps, int64_t activation, int64_t implementation,
                                                  int64_t policy, double negative_slope);

// conv_batch_norm_act through the dispatcher (its autograd kernel and the stem form's op call it below autograd; the
// C++ record, conv_bn_call.h, above it).
using ConvBatchNormOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
ConvBatchNormOutputs call_conv_batch_norm_act(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
    const at::Tensor& weight, const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope);

// x, conv_weight and conv_bias in `dtype`, as autocast casts F.conv2d's operands (those already in it as they are).
std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>> cast_conv_operands(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    at::ScalarType dtype);

// For Python's decision: why each implementation cannot run this layer ("" when it can). Keys "kernel" (our forward
// kernel: NHWC), "graph_forward", "graph_backward" (cuDNN's refusal of the built plans; absent for an NHWC layer with
// an activation, whose backward is our kernel) and "legacy" (the legacy API's requirements and status). With
// `kernel_first`, a layer our kernel takes gets {"kernel": ""} alone: the graphs are asked (their plans built) only
// where one is about to run, as cudnn.benchmark's forward choice or a backward without an activation asks them. Asked
// to decide, they cost each BatchNorm shape one or two plan builds in a model's first step, also where neither ran
// (mobilenet_v2 at batch 256 without benchmark: 26 builds, 3.5 to 15 s on H100s; docs/benchmarks.md 2026-12-07h).
std::unordered_map<std::string, std::string> check_batch_norm_layer(const BatchNormProblem& problem, double eps,
                                                                    bool kernel_first = false);

}  // namespace tcf
