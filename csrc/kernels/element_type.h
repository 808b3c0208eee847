// The element types our CUDA kernels take, as plain C++ (the kernels' headers include no torch headers).
#pragma once

namespace tcf {

enum class ElementType : int { kHalf = 0, kBFloat16 = 1, kFloat = 2 };

}  // namespace tcf
