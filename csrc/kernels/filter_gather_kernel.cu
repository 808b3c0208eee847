// A filter's elements gathered by an index, with a cast, in one launch: the stem conv's filter into its space-to-depth
// form (each element lands once, the rest are zeros) and the form's gradient back by the inverse index. In ATen ops
// (a permute, a pad, index_select, a cast) the forward cost 55 us of host time a call and the gradient 36-40 on an
// H200 host (30a), as much as the conv's own graph; the filters are a few thousand elements, so the GPU time is the
// launch's.
#include "kernels/filter_gather_kernel.h"

#include "kernels/nhwc_rows.cuh"

namespace tcf {
namespace {

template <typename In, typename Out>
__global__ void filter_gather(const In* __restrict__ in, const int64_t* __restrict__ index, Out* __restrict__ out,
                              FilterGatherShape s) {
  const int64_t total = s.rows * s.columns;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / s.columns;
    const int64_t element = index[i % s.columns];
    float value = 0.f;
    if (element >= 0 && element < s.limit) {
      const int64_t k = element % s.c;
      const int64_t x = (element / s.c) % s.w;
      const int64_t y = element / (s.c * s.w);
      value = nhwc::to_float(in[row * s.stride_r + k * s.stride_c + y * s.stride_h + x * s.stride_w]);
    }
    out[i] = nhwc::from_float<Out>(value);
  }
}

template <typename In, typename Out>
cudaError_t launch(const void* in, const int64_t* index, void* out, const FilterGatherShape& s, cudaStream_t stream) {
  const int64_t total = s.rows * s.columns;
  const int64_t blocks = total > 0 ? (total + nhwc::kThreads - 1) / nhwc::kThreads : 1;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);  // grid-stride beyond
  filter_gather<In, Out><<<grid, nhwc::kThreads, 0, stream>>>(static_cast<const In*>(in), index,
                                                               static_cast<Out*>(out), s);
  return cudaGetLastError();
}

template <typename In>
cudaError_t launch_out(ElementType out_type, const void* in, const int64_t* index, void* out,
                       const FilterGatherShape& s, cudaStream_t stream) {
  switch (out_type) {
    case ElementType::kHalf:
      return launch<In, __half>(in, index, out, s, stream);
    case ElementType::kBFloat16:
      return launch<In, __nv_bfloat16>(in, index, out, s, stream);
    case ElementType::kFloat:
      return launch<In, float>(in, index, out, s, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_filter_gather(ElementType in_type, ElementType out_type, const void* in, const int64_t* index,
                                 void* out, const FilterGatherShape& shape, cudaStream_t stream) {
  if (shape.c < 1 || shape.w < 1 || shape.rows < 0 || shape.columns < 0) return cudaErrorInvalidValue;
  switch (in_type) {
    case ElementType::kHalf:
      return launch_out<__half>(out_type, in, index, out, shape, stream);
    case ElementType::kBFloat16:
      return launch_out<__nv_bfloat16>(out_type, in, index, out, shape, stream);
    case ElementType::kFloat:
      return launch_out<float>(out_type, in, index, out, shape, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tcf
