#include "ops/stem_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "kernels/filter_gather_kernel.h"
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
  TORCH_CHECK(weight.is_cuda(), "cudnn_fusion: stem_filter takes a CUDA weight, got one on ", weight.device());
  check_supported_dtype(weight.scalar_type(), "stem_filter's weight");
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

// One launch of our gather kernel: out [rows, columns] (dense) from `in` [rows, c, h, w] by `index`.
void gather_filter(const at::Tensor& in, const at::Tensor& index, const at::Tensor& out, const char* what) {
  if (out.numel() == 0) return;
  poison_output(out);  // under the tests' poisoning: an element the kernel did not write shows
  FilterGatherShape shape{in.size(0),   out.numel() / in.size(0),
                          in.size(1),   in.size(3),
                          in.size(1) * in.size(2) * in.size(3),
                          in.stride(0), in.stride(1),
                          in.stride(2), in.stride(3)};
  c10::DeviceGuard guard(in.device());
  const auto status = launch_filter_gather(element_type(in.scalar_type()), element_type(out.scalar_type()),
                                           in.data_ptr(), index.data_ptr<int64_t>(), out.data_ptr(), shape,
                                           current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the ", what, " kernel failed to launch: ",
              cudaGetErrorString(status));
}

}  // namespace

at::Tensor stem_filter(const at::Tensor& weight, const at::Tensor& index, const at::Tensor& inverse,
                       at::IntArrayRef kernel, int64_t channels, std::optional<at::ScalarType> dtype) {
  check_stem_filter_arguments(weight, index, inverse, kernel, channels);
  const at::ScalarType out_type = dtype.value_or(weight.scalar_type());
  check_supported_dtype(out_type, "stem_filter's dtype");
  // channels_last: dense [O, kernel[0], kernel[1], channels], element by element as the index lists them
  auto form = at::empty({weight.size(0), channels, kernel[0], kernel[1]},
                        weight.options().dtype(out_type).memory_format(at::MemoryFormat::ChannelsLast));
  gather_filter(weight, index, form, "stem filter");
  return form;
}

at::Tensor stem_filter_backward(const at::Tensor& grad, const at::Tensor& inverse, at::IntArrayRef weight_size,
                                at::ScalarType weight_dtype) {
  check_4d_cuda(grad, "grad");
  TORCH_CHECK(weight_size.size() == 4 && weight_size[0] == grad.size(0) && weight_size[1] >= 1 &&
                  weight_size[2] >= 1 && weight_size[3] >= 1,
              "cudnn_fusion: stem_filter_backward's weight_size must be 4 sizes >= 1, the first grad's ",
              grad.size(0), ", got ", weight_size);
  const int64_t elements = weight_size[1] * weight_size[2] * weight_size[3];
  TORCH_CHECK(inverse.dim() == 1 && inverse.size(0) == elements && inverse.scalar_type() == at::kLong &&
                  inverse.device() == grad.device(),
              "cudnn_fusion: stem_filter_backward's inverse must be ", elements, " int64 elements on ", grad.device(),
              " (from torch_cudnn_fusion.ops.stem.plan), got shape ", inverse.sizes(), " ", inverse.scalar_type(),
              " on ", inverse.device());
  check_supported_dtype(weight_dtype, "stem_filter_backward's weight_dtype");
  // channels_last, as the gradient autograd gives through the gather in ATen ops
  auto grad_weight = at::empty(weight_size,
                               grad.options().dtype(weight_dtype).memory_format(at::MemoryFormat::ChannelsLast));
  gather_filter(grad, inverse, grad_weight, "stem filter gradient");
  return grad_weight;
}

at::Tensor stem_conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, const at::Tensor& index,
                              const at::Tensor& inverse, at::IntArrayRef form, int64_t activation, int64_t policy,
                              std::optional<at::ScalarType> conv_dtype) {
  const StemForm stem(index, inverse, form, conv_dtype.value_or(weight.scalar_type()));
  return call_conv_bias_act(stem.input(x), stem.filter(weight), bias, residual, kFormStride, kFormPadding,
                            kFormPadding, kFormStride, 1, activation, policy);
}

at::Tensor call_stem_conv_bias_act(const at::Tensor& x, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& residual,
                                   const at::Tensor& index, const at::Tensor& inverse, at::IntArrayRef form,
                                   int64_t activation, int64_t policy, std::optional<at::ScalarType> conv_dtype) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("cudnn_fusion::stem_conv_bias_act", "")
                       .typed<decltype(stem_conv_bias_act)>();
  return op.call(x, weight, bias, residual, index, inverse, form, activation, policy, conv_dtype);
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

