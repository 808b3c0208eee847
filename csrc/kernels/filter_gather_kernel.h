// Our CUDA kernel that gathers a small filter's elements by an index (see filter_gather_kernel.cu): a stem conv's
// filter into its space-to-depth form, and that form's gradient back (ops/stem_ops.h). Plain CUDA types only, so the
// .cu file compiles without torch's headers.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/element_type.h"

namespace tcf {

// in: [rows, c, h, w] of `in_type` with the given element strides (any layout); element e of a row is the one at
// e = (y * w + x) * c + k in channels_last order. out: dense [rows, columns] of `out_type`. Writes
//   out[r, j] = in[r, element index[j]] where index[j] < limit (= c * h * w), else 0.
// `index` (int64, `columns` values) is on the device. Asynchronous on `stream`.
struct FilterGatherShape {
  int64_t rows, columns;
  int64_t c, w, limit;
  int64_t stride_r, stride_c, stride_h, stride_w;
};
cudaError_t launch_filter_gather(ElementType in_type, ElementType out_type, const void* in, const int64_t* index,
                                 void* out, const FilterGatherShape& shape, cudaStream_t stream);

}  // namespace tcf
