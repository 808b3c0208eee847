// The input of a stem conv (stride 2, few input channels) in its space-to-depth form: each 2x2 block of pixels
// becomes one pixel of 4 * C channels, zero-padded to 8 or 16 channels and to the block rows and columns the
// rewritten conv (stride 1, no padding) reads. cuDNN runs a conv of 3 input channels at stride 2 far slower than the
// same sums as a stride-1 conv of 16 channels (the filter rearranged to match, in Python: ops/stem.py). One pass: it
// reads x in its own dtype and layout (often the float32 NCHW batch from the data loader) and writes the conv's dtype,
// so the rearrangement replaces the autocast cast eager runs on x anyway.
#include "kernels/space_to_depth_kernel.h"

#include "kernels/nhwc_rows.cuh"

namespace tcf {
namespace {

// One thread per output pixel: its values built in registers (kC input channels, 8 or 16 output channels), stored as
// 16-byte vectors.
template <typename In, typename Out, int kC>
__global__ void space_to_depth(const In* __restrict__ x, Out* __restrict__ out, SpaceToDepthShape s) {
  constexpr int kChannels = kC <= 2 ? 8 : 16;
  static_assert(kChannels * sizeof(Out) % 16 == 0, "whole 16-byte vectors per pixel");
  const int64_t pixels = s.n * s.out_h * s.out_w;
  for (int64_t pixel = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pixel < pixels;
       pixel += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = pixel % s.out_w;
    const int64_t row = (pixel / s.out_w) % s.out_h;
    const int64_t n = pixel / (s.out_w * s.out_h);
    union {
      Out v[kChannels];
      uint4 vectors[kChannels * sizeof(Out) / 16];
    } values;
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // q = a * 2 + b: the pixel's place in its 2x2 block
      const int64_t h = 2 * (row - s.pad_top) + q / 2;
      const int64_t w = 2 * (col - s.pad_left) + q % 2;
      const bool inside = h >= 0 && h < s.h && w >= 0 && w < s.w;
      const In* source = x + n * s.stride_n + h * s.stride_h + w * s.stride_w;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        values.v[q * kC + c] = nhwc::from_float<Out>(inside ? nhwc::to_float(source[c * s.stride_c]) : 0.f);
      }
    }
#pragma unroll
    for (int k = 4 * kC; k < kChannels; ++k) values.v[k] = nhwc::from_float<Out>(0.f);
    uint4* target = reinterpret_cast<uint4*>(out + pixel * kChannels);
#pragma unroll
    for (int i = 0; i < static_cast<int>(kChannels * sizeof(Out) / 16); ++i) target[i] = values.vectors[i];
  }
}

template <typename In, typename Out>
cudaError_t launch(const void* x, void* out, const SpaceToDepthShape& s, cudaStream_t stream) {
  const int64_t pixels = s.n * s.out_h * s.out_w;
  const int64_t blocks = pixels > 0 ? (pixels + nhwc::kThreads - 1) / nhwc::kThreads : 1;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride beyond
  const auto* in = static_cast<const In*>(x);
  auto* target = static_cast<Out*>(out);
  switch (s.c) {
    case 1:
      space_to_depth<In, Out, 1><<<grid, nhwc::kThreads, 0, stream>>>(in, target, s);
      break;
    case 2:
      space_to_depth<In, Out, 2><<<grid, nhwc::kThreads, 0, stream>>>(in, target, s);
      break;
    case 3:
      space_to_depth<In, Out, 3><<<grid, nhwc::kThreads, 0, stream>>>(in, target, s);
      break;
    case 4:
      space_to_depth<In, Out, 4><<<grid, nhwc::kThreads, 0, stream>>>(in, target, s);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename In>
cudaError_t launch_out(ElementType out_type, const void* x, void* out, const SpaceToDepthShape& s,
                       cudaStream_t stream) {
  switch (out_type) {
    case ElementType::kHalf:
      return launch<In, __half>(x, out, s, stream);
    case ElementType::kBFloat16:
      return launch<In, __nv_bfloat16>(x, out, s, stream);
    case ElementType::kFloat:
      break;  // the conv's dtype: half precision only
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_space_to_depth(ElementType in_type, ElementType out_type, const void* x, void* out,
                                  const SpaceToDepthShape& shape, cudaStream_t stream) {
  if (shape.c < 1 || shape.c > 4 || shape.out_channels != (shape.c <= 2 ? 8 : 16)) return cudaErrorInvalidValue;
  switch (in_type) {
    case ElementType::kHalf:
      return launch_out<__half>(out_type, x, out, shape, stream);
    case ElementType::kBFloat16:
      return launch_out<__nv_bfloat16>(out_type, x, out, shape, stream);
    case ElementType::kFloat:
      return launch_out<float>(out_type, x, out, shape, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tcf
