// The CUDA implementations of the cudnn_fusion ops. Each runs its cuDNN graph; where cuDNN refused the graph
// (Python checks first, so this happens only when a run differs from the checked configuration, e.g. in pointer
// alignment) it runs the equivalent ATen composition and counts a runtime fallback: never a crash, never a wrong
// result.
#pragma once

#include <array>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#include <ATen/ATen.h>

#include "graphs/conv_graphs.h"

namespace tcf {

// Every op takes `policy`, a registered engine policy's id (engine_policy.h; 0: the heuristic's choice).

// y = act(conv(x, weight) + bias + residual), act: `activation` 0 (identity), 1 (ReLU) or 2 (ReLU6).
at::Tensor conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                         at::IntArrayRef padding_pre, at::IntArrayRef padding_post, at::IntArrayRef dilation,
                         int64_t groups, int64_t activation, int64_t policy);

// grad_z = grad_out * (out > 0) (activation 2, ReLU6: (0 < out < 6)); grad_bias = sum of grad_z over N, H, W. Dense
// NHWC: our one-pass CUDA kernel (cuDNN's graph for it ran at half the memory bandwidth); otherwise, for ReLU, the
// cuDNN graph, or ATen where refused; for ReLU6, ATen.
std::tuple<at::Tensor, at::Tensor> relu_bias_backward(const at::Tensor& grad_out, const at::Tensor& out,
                                                      int64_t activation, int64_t policy);

// Where relu_bias_backward runs no cuDNN graph for this layer (our kernel, or for ReLU6 eager's composition): what
// runs instead; "" where it runs the graph.
std::string relu_bias_backward_without_graph(const ConvProblem& problem);

// grad_x of the convolution, given grad_z (the gradient at the conv output).
at::Tensor conv_dgrad(const at::Tensor& grad_z, const at::Tensor& weight, at::IntArrayRef x_size,
                      at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                      at::IntArrayRef dilation, int64_t groups, int64_t policy);

// conv_bias_act through the dispatcher (its autograd kernel and the stem form's op call it below autograd; the C++
// record, conv_call.h, above it).
at::Tensor call_conv_bias_act(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, at::IntArrayRef stride,
                              at::IntArrayRef padding_pre, at::IntArrayRef padding_post, at::IntArrayRef dilation,
                              int64_t groups, int64_t activation, int64_t policy);

// conv_dgrad through the dispatcher, for the autograd kernels (conv_autograd.cpp, and the conv + BatchNorm op's conv
// node): under torch.compile the backward then traces the op's fake kernel instead of reaching a fake tensor's data.
at::Tensor call_conv_dgrad(const at::Tensor& grad_z, const at::Tensor& weight, at::IntArrayRef x_size,
                           at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                           at::IntArrayRef dilation, int64_t groups, int64_t policy);

// conv_wgrad through the dispatcher, as call_conv_dgrad.
at::Tensor call_conv_wgrad(const at::Tensor& grad_z, const at::Tensor& x, at::IntArrayRef weight_size,
                           at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                           at::IntArrayRef dilation, int64_t groups, int64_t policy,
                           std::optional<at::ScalarType> out_dtype = std::nullopt);

// grad_weight of the convolution, given grad_z, in out_dtype: grad_z's dtype (nullopt) or float32, the dtype of a
// float32 weight used in half precision under autocast. Our depthwise wgrad writes float32 as it summed it; the other
// paths compute in grad_z's dtype and cast.
at::Tensor conv_wgrad(const at::Tensor& grad_z, const at::Tensor& x, at::IntArrayRef weight_size,
                      at::IntArrayRef stride, at::IntArrayRef padding_pre, at::IntArrayRef padding_post,
                      at::IntArrayRef dilation, int64_t groups, int64_t policy,
                      std::optional<at::ScalarType> out_dtype);


// For Python's fusion decision: the layer's verdict (core/requirements.h) and, where it meets every requirement,
// the plans it would use built (or found) from metadata alone; returns each graph's refusal ("" when cuDNN built
// it). Keys: "forward" (the unmet requirements, joined, where the verdict is not empty), and with `backward` also
// "relu_bias_backward" (with an activation), "dgrad", "wgrad"; "depthwise_kernel" (the steps our depthwise kernels
// run) for a depthwise layer they take; "note" where a fused layer runs part of it outside the graph (ReLU6).
std::unordered_map<std::string, std::string> check_conv_layer(const ConvProblem& problem, bool backward,
                                                              const std::array<int8_t, 4>& alignment);

}  // namespace tcf
