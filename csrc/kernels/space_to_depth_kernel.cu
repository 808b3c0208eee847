// The input of a stem conv (stride 2, few input channels) in its space-to-depth form: each 2x2 block of pixels
// becomes one pixel of 4 * C channels, zero-padded to 8 or 16 channels and to the block rows and columns the
// rewritten conv (stride 1, no padding) reads. cuDNN runs a conv of 3 input channels at stride 2 far slower than the
// same sums as a stride-1 conv of 16 channels (the filter rearranged to match, in Python: ops/stem.py). One pass: it
// reads x in its own dtype and layout (often the float32 NCHW batch from the data loader) and writes the conv's dtype,
// so the rearrangement replaces the autocast cast eager runs on x anyway; under autograd the same pass also writes
// that cast, which backward rearranges again (what eager's conv keeps, rather than the larger form).
#include "kernels/space_to_depth_kernel.h"

#include "kernels/nhwc_rows.cuh"

namespace tcf {
namespace {

// The grid of 2x2 blocks a launch walks, in out's coordinates: out's pixels and, with a cast, every block that holds
// a pixel of x (x's last rows and columns may lie past what the conv reads, so past out).
struct Blocks {
  int64_t rows, cols;
};

inline Blocks blocks_of(const SpaceToDepthShape& s, bool cast) {
  if (!cast) return {s.out_h, s.out_w};
  const int64_t rows = s.pad_top + (s.h + 1) / 2, cols = s.pad_left + (s.w + 1) / 2;
  return {rows > s.out_h ? rows : s.out_h, cols > s.out_w ? cols : s.out_w};
}

// One thread per block: its pixel of out built in registers (kC input channels, 8 or 16 output channels), stored as
// 16-byte vectors; with a cast, also the (up to) 4 pixels of x it read, converted.
template <typename In, typename Out, int kC>
__global__ void space_to_depth(const In* __restrict__ x, Out* __restrict__ out, Out* __restrict__ cast,
                               SpaceToDepthShape s, Blocks b) {
  constexpr int kChannels = kC <= 2 ? 8 : 16;
  static_assert(kChannels * sizeof(Out) % 16 == 0, "whole 16-byte vectors per pixel");
  const int64_t pixels = s.n * b.rows * b.cols;
  for (int64_t pixel = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; pixel < pixels;
       pixel += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = pixel % b.cols;
    const int64_t row = (pixel / b.cols) % b.rows;
    const int64_t n = pixel / (b.cols * b.rows);
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
        if (cast != nullptr && inside) {
          cast[n * s.cast_stride_n + c * s.cast_stride_c + h * s.cast_stride_h + w * s.cast_stride_w] =
              values.v[q * kC + c];
        }
      }
    }
    if (row >= s.out_h || col >= s.out_w) continue;  // a block only the cast needed
#pragma unroll
    for (int k = 4 * kC; k < kChannels; ++k) values.v[k] = nhwc::from_float<Out>(0.f);
    uint4* target = reinterpret_cast<uint4*>(out + (n * s.out_h + row) * s.out_w * kChannels + col * kChannels);
#pragma unroll
    for (int i = 0; i < static_cast<int>(kChannels * sizeof(Out) / 16); ++i) target[i] = values.vectors[i];
  }
}

template <typename In, typename Out>
cudaError_t launch(const void* x, void* out, void* cast, const SpaceToDepthShape& s, cudaStream_t stream) {
  const Blocks b = blocks_of(s, cast != nullptr);
  const int64_t pixels = s.n * b.rows * b.cols;
  const int64_t blocks = pixels > 0 ? (pixels + nhwc::kThreads - 1) / nhwc::kThreads : 1;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride beyond
  const auto* in = static_cast<const In*>(x);
  auto* target = static_cast<Out*>(out);
  auto* cast_target = static_cast<Out*>(cast);
  switch (s.c) {
    case 1:
      space_to_depth<In, Out, 1><<<grid, nhwc::kThreads, 0, stream>>>(in, target, cast_target, s, b);
      break;
    case 2:
      space_to_depth<In, Out, 2><<<grid, nhwc::kThreads, 0, stream>>>(in, target, cast_target, s, b);
      break;
    case 3:
      space_to_depth<In, Out, 3><<<grid, nhwc::kThreads, 0, stream>>>(in, target, cast_target, s, b);
      break;
    case 4:
      space_to_depth<In, Out, 4><<<grid, nhwc::kThreads, 0, stream>>>(in, target, cast_target, s, b);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename In>
cudaError_t launch_out(ElementType out_type, const void* x, void* out, void* cast, const SpaceToDepthShape& s,
                       cudaStream_t stream) {
  switch (out_type) {
    case ElementType::kHalf:
      return launch<In, __half>(x, out, cast, s, stream);
    case ElementType::kBFloat16:
      return launch<In, __nv_bfloat16>(x, out, cast, s, stream);
    case ElementType::kFloat:
      break;  // the conv's dtype: half precision only
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_space_to_depth(ElementType in_type, ElementType out_type, const void* x, void* out, void* cast,
                                  const SpaceToDepthShape& shape, cudaStream_t stream) {
  if (shape.c < 1 || shape.c > 4 || shape.out_channels != (shape.c <= 2 ? 8 : 16)) return cudaErrorInvalidValue;
  switch (in_type) {
    case ElementType::kHalf:
      return launch_out<__half>(out_type, x, out, cast, shape, stream);
    case ElementType::kBFloat16:
      return launch_out<__nv_bfloat16>(out_type, x, out, cast, shape, stream);
    case ElementType::kFloat:
      return launch_out<float>(out_type, x, out, cast, shape, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tcf
