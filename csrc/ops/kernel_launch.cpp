#include "ops/kernel_launch.h"

#include <ATen/cudnn/Handle.h>

namespace tcf {

ElementType element_type(at::ScalarType dtype) {
  return dtype == at::kHalf ? ElementType::kHalf : dtype == at::kBFloat16 ? ElementType::kBFloat16 : ElementType::kFloat;
}

cudaStream_t current_stream() {
  cudaStream_t stream = nullptr;
  TORCH_CHECK(cudnnGetStream(at::native::getCudnnHandle(), &stream) == CUDNN_STATUS_SUCCESS,
              "cudnn_fusion: could not read the current CUDA stream");
  return stream;
}

}  // namespace tcf
