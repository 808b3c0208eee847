#include "ops/depthwise_ops.h"

#include <atomic>
#include <sstream>
#include <tuple>

#include <ATen/Context.h>
#include <c10/core/DeviceGuard.h>

#include "core/device.h"
#include "graphs/timing.h"
#include "kernels/depthwise_conv_kernel.h"
#include "ops/kernel_launch.h"
#include "ops/run_graph.h"
#include "ops/tensor_checks.h"

namespace tcf {

namespace {

DepthwiseShape shape_of(const ConvShape& p) {
  auto y = p.y_size();
  return {p.x_size[0], p.x_size[2], p.x_size[3], p.x_size[1], y[2], y[3], static_cast<int>(p.w_size[2]),
          static_cast<int>(p.stride[0]), static_cast<int>(p.pad_pre[0]), static_cast<int>(p.pad_pre[1])};
}

// 16-byte accesses: the channels fill them and every NHWC operand and the weight (undefined ones aside) start on 16
// bytes.
bool vectors(int64_t channels, std::initializer_list<const at::Tensor*> operands) {
  const int element_bytes = static_cast<int>(operands.begin()[0]->element_size());
  if (!depthwise_vectors_fit(channels, element_bytes)) return false;
  for (const auto* t : operands) {
    if (t->defined() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  }
  return true;
}

void check_launch(cudaError_t status, const char* what) {
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the depthwise ", what, " kernel failed to launch: ",
              cudaGetErrorString(status));
}

}  // namespace

DepthwiseUnmet depthwise_kernel_check(int64_t in_channels, at::IntArrayRef w_size, at::IntArrayRef stride,
                                      at::IntArrayRef dilation, int64_t groups, bool channels_last) {
  if (groups == 1 || groups != in_channels || w_size.size() != 4 || w_size[0] != groups) return DepthwiseUnmet::kGroups;
  if (w_size[2] != w_size[3] || !depthwise_kernel_size_supported(w_size[2])) return DepthwiseUnmet::kKernelSize;
  if (stride.size() != 2 || stride[0] != stride[1] || !depthwise_stride_supported(stride[0])) {
    return DepthwiseUnmet::kStride;
  }
  if (dilation.size() != 2 || dilation[0] != 1 || dilation[1] != 1) return DepthwiseUnmet::kDilation;
  if (!channels_last) return DepthwiseUnmet::kLayout;
  return DepthwiseUnmet::kNone;
}

bool depthwise_kernel_takes(const ConvProblem& p) {
  return depthwise_kernel_check(p.x_size[1], p.w_size, p.stride, p.dilation, p.groups, p.channels_last) ==
         DepthwiseUnmet::kNone;
}

std::string depthwise_kernel_unmet(int64_t in_channels, at::IntArrayRef w_size, at::IntArrayRef stride,
                                   at::IntArrayRef dilation, int64_t groups, bool channels_last) {
  std::ostringstream out;
  switch (depthwise_kernel_check(in_channels, w_size, stride, dilation, groups, channels_last)) {
    case DepthwiseUnmet::kNone:
      break;
    case DepthwiseUnmet::kGroups:
      out << "groups=" << groups << " with " << in_channels << " input and " << (w_size.empty() ? 0 : w_size[0])
          << " output channels: our depthwise kernels take groups == in_channels == out_channels";
      break;
    case DepthwiseUnmet::kKernelSize:
      out << "kernel_size=(" << w_size[2] << ", " << w_size[3]
          << "): our depthwise kernels are built for 3x3 (5x5 ones ran slower than PyTorch's)";
      break;
    case DepthwiseUnmet::kStride:
      out << "stride=" << stride << ": our depthwise kernels are built for stride 1 and 2, equal in H and W";
      break;
    case DepthwiseUnmet::kDilation:
      out << "dilation=" << dilation << ": our depthwise kernels are built for dilation 1";
      break;
    case DepthwiseUnmet::kLayout:
      out << "layout NCHW: our depthwise kernels are NHWC (x.to(memory_format=torch.channels_last))";
      break;
  }
  return out.str();
}

DepthwiseSteps depthwise_kernel_steps(const ConvProblem& p, bool has_epilogue) {
  const auto y = p.y_size();
  return depthwise_kernel_steps(p, has_epilogue, y[2], y[3]);
}

DepthwiseSteps depthwise_kernel_steps(const ConvProblem& p, bool has_epilogue, int64_t out_h, int64_t out_w) {
  DepthwiseSteps steps;
  const int element_bytes = static_cast<int>(c10::elementSize(p.dtype));
  const bool vectors_fit = depthwise_vectors_fit(p.w_size[0], element_bytes);
  const bool half_precision = p.dtype == at::kBFloat16 || p.dtype == at::kHalf;
  const bool small = out_h <= kDepthwiseSmallOutput && out_w <= kDepthwiseSmallOutput;
  steps.forward = has_epilogue || (vectors_fit && (half_precision || (p.stride[0] == 1 && small)));
  if (p.stride[0] == 2) {
    steps.dgrad = DepthwiseDgrad::kOurKernel;
  } else if (p.stride[0] == 1 && (half_precision || vectors_fit) && p.pad_pre == p.pad_post &&
             p.pad_pre[0] < p.w_size[2] && p.pad_pre[1] < p.w_size[3]) {
    steps.dgrad = vectors_fit ? DepthwiseDgrad::kOurKernel : depthwise_dgrad_without_vectors(p.dtype);
  }
  steps.wgrad = vectors_fit && (half_precision || p.stride[0] == 2 || small);
  return steps;
}

// In bfloat16 cuDNN's forward turned (its bfloat16 dgrad is slow), in float16 its dgrad.
DepthwiseDgrad depthwise_dgrad_without_vectors(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? DepthwiseDgrad::kTurnedForward : DepthwiseDgrad::kPyTorch;
}

std::string describe_depthwise_steps(const DepthwiseSteps& steps) {
  std::string out = steps.forward ? "depthwise: forward in our kernel" : "depthwise: forward in PyTorch's kernel";
  switch (steps.dgrad) {
    case DepthwiseDgrad::kOurKernel:
      out += ", dgrad in our kernel";
      break;
    case DepthwiseDgrad::kTurnedForward:
      out += ", dgrad as PyTorch's forward kernel with the filter turned 180 degrees";
      break;
    case DepthwiseDgrad::kPyTorch:
      out += ", dgrad in PyTorch's kernel";
      break;
  }
  return out + (steps.wgrad ? ", wgrad in our kernel" : ", wgrad in PyTorch's kernel");
}

std::string depthwise_kernel_unmet(const ConvProblem& p) {
  return depthwise_kernel_unmet(p.x_size[1], p.w_size, p.stride, p.dilation, p.groups, p.channels_last);
}

void depthwise_conv_forward(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& residual, const ConvShape& shape, int activation, const at::Tensor& y) {
  if (y.numel() == 0) return;
  c10::DeviceGuard guard(x.device());
  poison_output(y);
  auto w = weight.contiguous();
  auto b = bias.defined() ? bias.contiguous() : bias;
  check_launch(launch_depthwise_conv_forward(element_type(x.scalar_type()), shape_of(shape), x.data_ptr(),
                                             w.data_ptr(), b.defined() ? b.data_ptr() : nullptr,
                                             residual.defined() ? residual.data_ptr() : nullptr, y.data_ptr(),
                                             activation, vectors(shape.x_size[1], {&x, &y, &residual, &w}),
                                             current_stream()),
               "forward");
}

bool depthwise_conv_dgrad(const at::Tensor& dz, const at::Tensor& weight, const ConvShape& shape,
                          const at::Tensor& dx) {
  if (dx.numel() == 0) return true;
  auto w = weight.contiguous();
  const bool vectored = vectors(shape.x_size[1], {&dz, &dx, &w});
  if (shape.stride[0] == 1 && !vectored) return false;  // our stride-1 dgrad takes vectors only
  c10::DeviceGuard guard(dz.device());
  poison_output(dx);
  check_launch(launch_depthwise_conv_dgrad(element_type(dz.scalar_type()), shape_of(shape), dz.data_ptr(),
                                           w.data_ptr(), dx.data_ptr(), vectored, current_stream()),
               "dgrad");
  return true;
}

at::Tensor depthwise_conv_wgrad(const at::Tensor& dz, const at::Tensor& x, const ConvShape& shape,
                                at::ScalarType dw_dtype, int plan) {
  TORCH_CHECK(dw_dtype == dz.scalar_type() || dw_dtype == at::kFloat,
              "cudnn_fusion: the depthwise weight gradient is written in grad_z's dtype or float32, got ", dw_dtype);
  if (!vectors(shape.x_size[1], {&x, &dz})) return at::Tensor();
  c10::DeviceGuard guard(dz.device());
  const auto type = element_type(dz.scalar_type());
  const auto s = shape_of(shape);
  const int multiprocessors = multiprocessor_count(dz.get_device());
  const bool dependent_sum = compute_capability(dz.get_device()).major >= 9;
  const int64_t parts = depthwise_wgrad_parts(type, s, multiprocessors, plan);
  if (parts <= 0) return at::Tensor();
  auto partial = at::empty({parts, 9, shape.x_size[1]}, dz.options().dtype(at::kFloat));
  poison_output(partial);  // a partial sum no block wrote shows in dw as NaN
  auto dw = at::empty(at::IntArrayRef(shape.w_size),
                      dz.options().dtype(dw_dtype).memory_format(at::MemoryFormat::ChannelsLast));
  poison_output(dw);
  check_launch(launch_depthwise_conv_wgrad(type, s, x.data_ptr(), dz.data_ptr(), dw.data_ptr(),
                                           dw_dtype != dz.scalar_type(), partial.data_ptr<float>(), parts,
                                           multiprocessors, plan, dependent_sum, current_stream()),
               "wgrad");
  return dw;
}

namespace {

// The wgrad choices made under torch.backends.cudnn.benchmark, per device, shape and dtypes.
using WgradKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int, int>;  // device, x's n h w c, out h w, stride, padding, dz's and dw's dtype
TimedChoices<WgradKey, DepthwiseWgradChoice> wgrad_choices;
std::atomic<int> wgrad_plan_for_tests{-1};
// Each timed wgrad waits behind a spin (kTimingSleepCycles, graphs/timing.h), longer than the host takes to
// issue it, so that the host's gaps between our op's launches (its allocations and plan) are not timed as GPU time.
// Timed without that wait (H200s, 2026-11-26, benchmarks/results: depthwise_*_cudnn_benchmark_h200_2026-11-26ac_no_spin
// against plan 0 alone in depthwise_*_h200_2026-11-26ab, another machine) the choice ran slower than plan 0 on
// small layers: float16 v2 576@14/2 0.0299 against 0.0256 ms, bfloat16 v1 1024@7 0.0275 against 0.0255 and 512@14/2
// 0.0243 against 0.0221. With the wait (-26ad, one H200, with and without benchmark): plan 0 on every 7 x 7 and 14 x 14
// layer, the wgrads' sum 1.262 -> 1.215 ms in bfloat16 and 1.281 -> 1.227 in float16.

}  // namespace

int depthwise_wgrad_choice(const at::Tensor& dz, const at::Tensor& x, const ConvShape& shape, at::ScalarType dw_dtype,
                           const std::function<void()>& pytorch) {
  const int forced = wgrad_plan_for_tests.load(std::memory_order_relaxed);
  if (forced >= 0) return forced;
  auto& context = at::globalContext();
  if (!context.benchmarkCuDNN() || context.deterministicAlgorithms()) return 0;
  const auto y = shape.y_size();
  const WgradKey key{dz.get_device(), shape.x_size[0], shape.x_size[2], shape.x_size[3], shape.x_size[1], y[2], y[3],
                     shape.stride[0], shape.pad_pre[0], shape.pad_pre[1], shape.pad_post[0],
                     static_cast<int>(dz.scalar_type()), static_cast<int>(dw_dtype)};
  if (const auto found = wgrad_choices.find(key)) return found->choice;
  const cudaStream_t stream = if_not_capturing(current_stream());
  if (stream == nullptr) return 0;  // nothing is timed inside a capture: a later call outside one chooses
  DepthwiseWgradChoice made;
  made.x_size = {shape.x_size[0], shape.x_size[1], shape.x_size[2], shape.x_size[3]};
  made.stride = shape.stride[0];
  made.padding = {shape.pad_pre[0], shape.pad_pre[1]};
  made.dtype = dz.scalar_type();
  made.dw_dtype = dw_dtype;
  float best = -1.0f;
  for (int plan = 0; plan < kDepthwiseWgradPlans; ++plan) {
    made.ms[plan] = median_event_ms([&]() { return depthwise_conv_wgrad(dz, x, shape, dw_dtype, plan).defined(); },
                                    stream, 5, kTimingSleepCycles);
    if (made.ms[plan] >= 0 && (best < 0 || made.ms[plan] < best)) {
      best = made.ms[plan];
      made.choice = plan;
    }
  }
  made.ms[kDepthwiseWgradPlans] =
      median_event_ms([&]() { pytorch(); return true; }, stream, 5, kTimingSleepCycles);
  if (made.ms[kDepthwiseWgradPlans] >= 0 && (best < 0 || made.ms[kDepthwiseWgradPlans] < best)) made.choice = -1;
  return wgrad_choices.keep(key, made).choice;
}

std::vector<DepthwiseWgradChoice> depthwise_wgrad_choices() { return wgrad_choices.all(); }

void clear_depthwise_wgrad_choices() { wgrad_choices.clear(); }

void set_depthwise_wgrad_plan_for_tests(int plan) {
  TORCH_CHECK_VALUE(plan >= -1 && plan < kDepthwiseWgradPlans, "cudnn_fusion: plan must be -1 (off) or 0..",
                    kDepthwiseWgradPlans - 1, ", got ", plan);
  wgrad_plan_for_tests.store(plan, std::memory_order_relaxed);
}

at::Tensor depthwise_dgrad_as_forward(const at::Tensor& dz, const at::Tensor& weight, const ConvShape& shape) {
  std::array<int64_t, 2> padding{shape.w_size[2] - 1 - shape.pad_pre[0], shape.w_size[3] - 1 - shape.pad_pre[1]};
  auto dx = at::convolution(dz, weight.flip({2, 3}), std::nullopt, {1, 1}, padding, {1, 1}, false, {0, 0},
                            shape.groups);
  return dx.contiguous(at::MemoryFormat::ChannelsLast);
}

}  // namespace tcf
