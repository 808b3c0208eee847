// The element types and activation codes our CUDA kernels take, as plain C++ (the kernels' headers include no torch
// headers).
#pragma once

namespace tcf {

enum class ElementType : int { kHalf = 0, kBFloat16 = 1, kFloat = 2 };

// The activation codes of the ops (Activation in core/graph_key.h): 0 none, 1 ReLU, 2 ReLU6, 3 SiLU, 4 Hardswish,
// 5 LeakyReLU.
constexpr int kActivationNone = 0;
constexpr int kActivationRelu = 1;
constexpr int kActivationRelu6 = 2;
constexpr int kActivationSilu = 3;
constexpr int kActivationHardswish = 4;
constexpr int kActivationLeakyRelu = 5;

}  // namespace tcf
