#include "ops/stem_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "kernels/space_to_depth_kernel.h"
#include "ops/bn_ops.h"
#include "ops/conv_ops.h"
#include "ops/kernel_launch.h"
#include "ops/run_graph.h"
#include "ops/stem_form.h"
#include "ops/tensor_checks.h"

namespace tcf {

at::Tensor space_to_depth(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                          std::optional<at::ScalarType> dtype) {
  check_4d_cuda(x, "x");
  const int64_t channels = x.size(1);
  TORCH_CHECK(channels >= 1 && channels <= 4, "cudnn_fusion: space_to_depth takes x of 1 to 4 channels, got x of shape ",
              x.sizes());
  TORCH_CHECK(padding_pre.size() == 2 && padding_pre[0] >= 0 && padding_pre[1] >= 0,
              "cudnn_fusion: padding_pre must be two sizes >= 0 (height, width), got ", padding_pre);
  TORCH_CHECK(out_size.size() == 2 && out_size[0] >= 0 && out_size[1] >= 0,
              "cudnn_fusion: out_size must be two sizes >= 0 (height, width), got ", out_size);
  const at::ScalarType out_type = dtype.value_or(x.scalar_type());
  TORCH_CHECK(out_type == at::kHalf || out_type == at::kBFloat16,
              "cudnn_fusion: space_to_depth writes float16 or bfloat16, got dtype ", out_type);
  const int64_t out_channels = channels <= 2 ? 8 : 16;
  auto out = at::empty({x.size(0), out_channels, out_size[0], out_size[1]},
                       x.options().dtype(out_type).memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  poison_output(out);  // under the tests' poisoning: an element the kernel did not write shows
  SpaceToDepthShape shape{x.size(0),      channels,       x.size(2),      x.size(3),   x.stride(0),
                          x.stride(1),    x.stride(2),    x.stride(3),    padding_pre[0], padding_pre[1],
                          out_size[0],    out_size[1],    out_channels};
  c10::DeviceGuard guard(x.device());
  const auto status = launch_space_to_depth(element_type(x.scalar_type()), element_type(out_type), x.data_ptr(),
                                            out.data_ptr(), shape, current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the space-to-depth kernel failed to launch: ",
              cudaGetErrorString(status));
  return out;
}

namespace {

void check_stem_filter_arguments(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                                 at::IntArrayRef kernel, int64_t channels) {
  TORCH_CHECK(weight.dim() == 4, "cudnn_fusion: stem_filter takes a 4-d weight [O, C, kh, kw], got shape ",
              weight.sizes());
  TORCH_CHECK(kernel.size() == 2 && kernel[0] >= 1 && kernel[1] >= 1,
              "cudnn_fusion: stem_filter's kernel must be two sizes >= 1 (height, width), got ", kernel);
  TORCH_CHECK(channels == 8 || channels == 16, "cudnn_fusion: stem_filter's channels must be 8 or 16, got ", channels);
  const int64_t elements = weight.size(1) * weight.size(2) * weight.size(3);
  for (const auto& [t, name, size] : {std::tuple{&index, "index", kernel[0] * kernel[1] * channels},
                                      std::tuple{&inverse, "inverse", elements}}) {
    TORCH_CHECK(t->dim() == 1 && t->size(0) == size && t->scalar_type() == at::kLong && t->device() == weight.device(),
                "cudnn_fusion: stem_filter's ", name, " must be ", size, " int64 elements on ", weight.device(),
                " (from torch_cudnn_fusion.ops.stem.plan), got shape ", t->sizes(), " ", t->scalar_type(), " on ",
                t->device());
  }
}

}  // namespace

at::Tensor stem_filter(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                       at::IntArrayRef kernel, int64_t channels, std::optional<at::ScalarType> dtype) {
  check_stem_filter_arguments(weight, index, inverse, kernel, channels);
  const int64_t out_channels = weight.size(0);
  auto flat = weight.permute({0, 2, 3, 1}).reshape({out_channels, -1});  // a view of a channels_last weight
  if (dtype.has_value()) flat = flat.to(*dtype);
  // the column past the weight's elements is the zero that the form's other elements take
  auto form = at::constant_pad_nd(flat, {0, 1}, 0).index_select(1, index);
  return form.view({out_channels, kernel[0], kernel[1], channels}).permute({0, 3, 1, 2});
}

at::Tensor stem_conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, const at::Tensor& index,
                              const at::Tensor& inverse, at::IntArrayRef form, int64_t activation, int64_t policy) {
  const StemForm stem(index, inverse, form, weight.scalar_type());
  return call_conv_bias_act(stem.input(x), stem.filter(weight), bias, residual, kFormStride, kFormPadding,
                            kFormPadding, kFormStride, 1, activation, policy);
}

at::Tensor call_stem_conv_bias_act(const at::Tensor& x, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                                   const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form,
                                   int64_t activation, int64_t policy) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::stem_conv_bias_act", "")
                       .typed<decltype(stem_conv_bias_act)>();
  return op.call(x, weight, bias, residual, index, inverse, form, activation, policy);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> stem_conv_batch_norm_act(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form, const at::Tensor& weight,
    const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope) {
  const StemForm stem(index, inverse, form, conv_dtype.value_or(x.scalar_type()));
  return call_conv_batch_norm_act(stem.input(x), stem.filter(conv_weight), conv_bias, kFormStride, kFormPadding,
                                  kFormStride, 1, weight, bias, running_mean, running_var, num_batches_tracked,
                                  residual, momentum, eps, activation, implementation, conv_dtype, policy,
                                  negative_slope);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> call_stem_conv_batch_norm_act(
    const at::Tensor& x, const at::Tensor& conv_weight, const std::optional<at::Tensor>& conv_bias,
    const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form, const at::Tensor& weight,
    const at::Tensor& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& num_batches_tracked,
    const std::optional<at::Tensor>& residual, double momentum, double eps, int64_t activation,
    int64_t implementation, std::optional<at::ScalarType> conv_dtype, int64_t policy, double negative_slope) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::stem_conv_batch_norm_act", "")
                       .typed<decltype(stem_conv_batch_norm_act)>();
  return op.call(x, conv_weight, conv_bias, index, inverse, form, weight, bias, running_mean, running_var,
                 num_batches_tracked, residual, momentum, eps, activation, implementation, conv_dtype, policy,
                 negative_slope);
}

}  // namespace tcf

TORCH_LIBRARY_IMPL(cudnn_fusion, CompositeExplicitAutograd, m) { m.impl("stem_filter", &tcf::stem_filter); }
