// What an op needs to launch one of our CUDA kernels (csrc/kernels): the kernel's element type for a dtype, and the
// stream to launch on.
#pragma once

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>

#include "kernels/element_type.h"

namespace tcf {

ElementType element_type(at::ScalarType dtype);  // float16, bfloat16 or float32
// The current CUDA stream, which PyTorch's cuDNN handle is bound to: our kernels run in order with the graphs.
cudaStream_t current_stream();

}  // namespace tcf
