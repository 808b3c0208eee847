// Depthwise convolutions (groups == in_channels == out_channels) in our NHWC CUDA kernels
// (kernels/depthwise_conv_kernel.h), and the one rule for when they run: every op and Python's decision ask
// depthwise_kernel_unmet.
#pragma once

#include <array>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/ATen.h>

#include "graphs/conv_graphs.h"
#include "kernels/depthwise_conv_kernel.h"

namespace tcf {

// The first condition our depthwise kernels need that a convolution does not meet; kNone: they take it.
enum class DepthwiseUnmet { kNone, kGroups, kKernelSize, kStride, kDilation, kLayout };
DepthwiseUnmet depthwise_kernel_check(int64_t in_channels, at::IntArrayRef w_size, at::IntArrayRef stride,
                                      at::IntArrayRef dilation, int64_t groups, bool channels_last);
// Whether they take it: comparisons only, for the ops to ask on every call.
bool depthwise_kernel_takes(const ConvProblem& p);
// "" when they take it (depthwise_kernel_steps says which steps run in them), else why not, naming the argument.
std::string depthwise_kernel_unmet(int64_t in_channels, at::IntArrayRef w_size, at::IntArrayRef stride,
                                   at::IntArrayRef dilation, int64_t groups, bool channels_last);
std::string depthwise_kernel_unmet(const ConvProblem& p);

// Which steps of a depthwise convolution our kernels run (where depthwise_kernel_unmet is empty), as measured against
// PyTorch's own (cuDNN's) depthwise kernels on the 18 depthwise layers of MobileNet v1 and v2 (H200, batch 256;
// benchmarks/bench_depthwise.py, benchmarks/results/depthwise_{bfloat16,float16}_h200_2026-11-26h, and a development
// harness for the float16 wgrad). The forward: with an epilogue to fuse (bias, residual or ReLU), which saves eager's
// passes over y; without one in bfloat16 and float16 where the channels fill 16-byte vectors (our walk, plain, took
// 0.70-0.90x of cuDNN's plain forward on each layer in bfloat16; with bias and ReLU 0.72-0.93x of it in float16); in
// float32 cuDNN's (at stride 2 0.97-1.05x its bytes' time, our walk 1.06-1.25x: a harness, H100, 2026-11-26), but at
// stride 1 on outputs of at most kDepthwiseSmallOutput rows and columns ours (the same walk, run as the stride-1 dgrad
// with the filter turned, took 0.83-0.95x of cuDNN's plain forward on the 14x14 and 7x7 layers, 1.13-1.18x their bytes'
// time against 1.20-1.41x, benchmarks/results/depthwise_float32_h100_2026-11-26x; on the 28x28 ones 0.96-0.97x, and
// 0.97-1.01x on the larger ones, left to cuDNN). dgrad: ours at stride 2; at stride 1 the walk over grad_z with the
// filter turned 180 degrees where the channels fill its vectors (0.37-0.52x of cuDNN's bfloat16 dgrad; in float16
// 0.56-0.99x of cuDNN's, a harness with and without cudnn.benchmark; in float32 0.74-0.99x of cuDNN's on the ten
// stride-1 layers, the H100 harness), else in bfloat16 PyTorch's (cuDNN's) forward so turned and in float16 and float32
// cuDNN's dgrad. wgrad in our kernels (the walk; on the 14 x 14 layers and the 28 x 28 ones at stride 2 the tile
// kernel, depthwise_conv_kernel.cu) where the channels fill 16-byte vectors, in bfloat16 and float16, and in float32 at
// stride 2 and on small outputs: in bfloat16 0.52-0.76x of cuDNN's time on each layer; in float16 0.69-0.93x of cuDNN's
// with torch.backends.cudnn.benchmark on at stride 1, and at stride 2 (cuDNN's until the walk's changes of 2026-11-26,
// when its float16 wgrad was 4% faster on v1's 64-channel 112x112 layer) 0.55-1.01x of cuDNN's on the eight layers,
// 1.03-1.37x their bytes' time against 1.07-2.50x (benchmarks/results/depthwise_float16_h100_2026-11-26t, H100); in
// float32 at stride 2 0.44-0.98x of cuDNN's (the H100 harness), at stride 1 where the output is at most
// kDepthwiseSmallOutput rows and columns (the 14x14 and 7x7 layers: ours 1.05-1.25x their bytes' time against cuDNN's
// 1.20-1.74x, 0.70-0.92x of cuDNN's time, benchmarks/results/depthwise_float32_h100_2026-11-26x), else cuDNN's (ours 5%
// slower on v2's 144-channel 56x56 layer, equal or at most 3% faster on the other larger ones). The rest runs PyTorch's
// kernels.
enum class DepthwiseDgrad {
  kPyTorch,        // PyTorch's (cuDNN's) dgrad
  kOurKernel,      // our dgrad kernel (at stride 1 the walk forward with the filter turned)
  kTurnedForward,  // PyTorch's forward of grad_z with the filter turned 180 degrees (depthwise_dgrad_as_forward)
};
struct DepthwiseSteps {
  bool forward = false;
  DepthwiseDgrad dgrad = DepthwiseDgrad::kPyTorch;
  bool wgrad = false;  // our wgrad kernel (else PyTorch's)
};
// For a convolution our kernels take (depthwise_kernel_takes); p's stride, padding, dtype and output size decide.
DepthwiseSteps depthwise_kernel_steps(const ConvProblem& p, bool has_epilogue);
// The same for an output of out_h x out_w (p's x_size unread), for Python's decision before the input is known.
DepthwiseSteps depthwise_kernel_steps(const ConvProblem& p, bool has_epilogue, int64_t out_h, int64_t out_w);
// The largest output rows and columns at which float32's stride-1 plain forward and wgrad run in our kernels
// (depthwise_kernel_steps).
constexpr int64_t kDepthwiseSmallOutput = 14;
// The stride-1 dgrad where our kernel cannot take the operands (channels that do not fill 16-byte vectors, or an
// operand off a 16-byte boundary): kTurnedForward in bfloat16, kPyTorch in float16 and float32.
DepthwiseDgrad depthwise_dgrad_without_vectors(at::ScalarType dtype);
// The same in words, for the layer's status.
std::string describe_depthwise_steps(const DepthwiseSteps& steps);

// Our kernels on dense channels_last tensors of one dtype (bias: [channels], or undefined; residual: y's shape, or
// undefined); activation: kActivationNone, kActivationRelu or kActivationRelu6 (kernels/element_type.h). They write
// the caller's output (y, dx: dense channels_last, of the shape's output and input sizes).
void depthwise_conv_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& residual, const ConvShape& shape, int activation, const at::Tensor& y);
// The dgrad returns false, dx unwritten, where the stride-1 operands are off a 16-byte boundary (the caller runs
// depthwise_dgrad_without_vectors's pick then).
bool depthwise_conv_dgrad(const at::Tensor& dz, const at::Tensor& weight, const ConvShape& shape,
                          const at::Tensor& dx);
// The weight gradient [channels, 1, 3, 3] in dw_dtype, dz's or float32 (dz, x: dense channels_last), summed in float in
// a fixed order and rounded once, by the kernels' plan `plan` (0 or 1, kernels/depthwise_conv_kernel.h); undefined
// where the tensors are not on 16-byte boundaries (the caller runs PyTorch's then).
at::Tensor depthwise_conv_wgrad(const at::Tensor& dz, const at::Tensor& x, const ConvShape& shape,
                                at::ScalarType dw_dtype, int plan);
// Which wgrad runs where depthwise_kernel_steps gives it to our kernels: plan 0, 1, 2, or -1 for PyTorch's (`pytorch`
// runs it). Plan 0 unless torch.backends.cudnn.benchmark is on and deterministic algorithms are not asked for: then
// the first call of each device, shape and dtypes outside a CUDA graph capture times our plans (plan 2 where it has a
// kernel of its own for the shape) and PyTorch's (medians of 5 CUDA-event timings after a warm-up, on the call's own
// tensors) and the fastest runs from then on, as cuDNN's algorithms are chosen under benchmark. No plan is the faster
// on every GPU (depthwise_conv_kernel.cu, wgrad_walk_plan_for), and on an H200 PyTorch's float16 wgrad beat the first
// two on v2's 192-channel 28x28 layer.
int depthwise_wgrad_choice(const at::Tensor& dz, const at::Tensor& x, const ConvShape& shape, at::ScalarType dw_dtype,
                           const std::function<void()>& pytorch);
struct DepthwiseWgradChoice {
  std::array<int64_t, 4> x_size{};  // N, C, H, W
  int64_t stride = 0;
  std::array<int64_t, 2> padding{};
  at::ScalarType dtype = at::kFloat, dw_dtype = at::kFloat;
  int choice = 0;                                    // 0, 1 or 2: our plan; -1: PyTorch's
  std::array<float, kDepthwiseWgradPlans + 1> ms{};  // plans 0, 1, 2, PyTorch's; negative: did not run
};
// Every choice timed so far (for diagnostics), and forgetting them (torch_cudnn_fusion.clear_plan_cache).
std::vector<DepthwiseWgradChoice> depthwise_wgrad_choices();
void clear_depthwise_wgrad_choices();
// Test aid: every depthwise wgrad our kernels take runs plan `plan` (0, 1 or 2; PyTorch's where plan 2 has no kernel
// for the shape), untimed; -1: off.
void set_depthwise_wgrad_plan_for_tests(int plan);
// dx of a stride-1 depthwise convolution as PyTorch's forward of dz with the filter turned 180 degrees and padding
// kernel - 1 - padding (DepthwiseDgrad::kTurnedForward: symmetric padding below the kernel size), channels_last.
at::Tensor depthwise_dgrad_as_forward(const at::Tensor& dz, const at::Tensor& weight, const ConvShape& shape);

}  // namespace tcf
