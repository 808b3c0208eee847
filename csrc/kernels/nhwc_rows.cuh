// What our NHWC kernels share: float conversions of the storage types, 16-byte channel vectors, and the launch
// shape of a kernel that walks the rows (N*H*W) of a [rows, channels] view with per-channel partial sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/device.h"
#include "kernels/element_type.h"

namespace tcf {
namespace nhwc {

constexpr int kThreads = 256;

template <typename T>
struct Vec {
  static constexpr int kSize = 16 / sizeof(T);  // elements per 16-byte access
};

// V consecutive channels, loaded and stored as one access (16 bytes when V is Vec<T>::kSize).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__half v) { return __half2float(v); }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) { return v; }
template <>
__device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

struct Launch {
  dim3 grid;
  dim3 block;
};

// Block (bx, by): threadIdx.x walks groups of `vector` channels of a row, threadIdx.y walks rows; blockIdx.y picks
// a share of the rows. About blocks_per_multiprocessor blocks per multiprocessor, no more: each block row of partial
// sums costs a row of memory and a step of the final sum. A kernel whose blocks all fit at once (its occupancy) runs
// in one wave: its threads then sweep the rows from first to last together (see batch_norm_backward_kernel.cu).
// Beyond 64 groups the groups are shared out evenly over the block columns (576 channels of bfloat16, 72 groups: two
// columns of 36, where 64 + 8 left 56 of the second column's 64 threads idle; our BatchNorm forward kernel on
// MobileNet v2's 576-channel layer at 14x14, batch 256: 87 us against 119, H200, a scratch harness).
inline Launch row_launch(int64_t rows, int64_t channels, int vector, int multiprocessors,
                         int blocks_per_multiprocessor = 8) {
  const int64_t groups = channels / vector;
  const int64_t columns = (groups + 63) / 64;
  const int bx = static_cast<int>((groups + columns - 1) / columns);
  const int by = kThreads / bx;
  const int64_t grid_x = (groups + bx - 1) / bx;
  const int64_t blocks = static_cast<int64_t>(multiprocessors) * blocks_per_multiprocessor;
  const int64_t wanted = std::max<int64_t>(1, blocks / grid_x);
  const int64_t grid_y = std::max<int64_t>(1, std::min<int64_t>(wanted, (rows + by - 1) / by));
  return {dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), dim3(bx, by)};
}

// Rows of partial sums (each `channels` long) that a kernel launched in row_launch's shape writes where it keeps two
// sums a channel (BatchNorm's backward; the forward's follow from its own shape, batch_norm_act_forward_partial_rows):
// two a block row. `vectors`: 16-byte accesses of element_bytes elements (row_launch's `vector` is then
// 16 / element_bytes), else one element at a time.
inline int64_t two_sum_partial_rows(int64_t rows, int64_t channels, bool vectors, int element_bytes,
                                    int multiprocessors, int blocks_per_multiprocessor) {
  return 2 * row_launch(rows, channels, vectors ? 16 / element_bytes : 1, multiprocessors, blocks_per_multiprocessor)
                 .grid.y;
}

// Adds the block's rows of per-thread sums (`sums`, V per thread) in a fixed order (row 0 first) and writes one
// partial sum per channel to partial[blockIdx.y][channel]. `shared` holds V * blockDim.y * blockDim.x floats, laid
// out [v][y][x] so that a warp's stores and loads touch consecutive words, and the V channels of a column are added
// by V rows of threads side by side (v = y, y + blockDim.y, ...). Laid out [y][x][v], with row 0 adding all V in
// turn, a warp's 32 accesses fell on 32 / V banks (8-way conflicts for bfloat16's V 8) and the V sums ran one after
// another. Each channel's rows are added in the same order as then: the same bits.
template <int V>
__device__ inline void write_block_partial(const float (&sums)[V], float* shared, float* __restrict__ partial,
                                           int64_t group, int64_t groups, int64_t channels) {
  const int plane = blockDim.y * blockDim.x;
  const int at = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int v = 0; v < V; ++v) shared[v * plane + at] = sums[v];
  __syncthreads();
  if (group < groups) {
    for (int v = threadIdx.y; v < V; v += blockDim.y) {
      const float* column = shared + v * plane + threadIdx.x;
      float total = 0.f;
      for (int r = 0; r < static_cast<int>(blockDim.y); ++r) total += column[r * blockDim.x];
      partial[static_cast<int64_t>(blockIdx.y) * channels + group * V + v] = total;
    }
  }
  __syncthreads();  // `shared` may be reused by the caller
}

// The fixed-order column sum of `parts` rows of partial sums for the channel of thread x of a (32, 32) block with
// one block per 32 channels: 32 threads down the rows, then one thread adds their 32 results. Valid in thread y 0.
__device__ inline float sum_partials(const float* __restrict__ partial, int parts, int64_t channels, int64_t c) {
  __shared__ float shared[32][33];
  __syncthreads();  // an earlier call's readers are done with `shared`
  float total = 0.f;
  if (c < channels) {
    for (int p = threadIdx.y; p < parts; p += 32) total += partial[static_cast<int64_t>(p) * channels + c];
  }
  shared[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  float sum = 0.f;
  if (threadIdx.y == 0) {
    for (int r = 0; r < 32; ++r) sum += shared[r][threadIdx.x];
  }
  return sum;
}

// f(T{}) with T the storage type `type` names (__half, __nv_bfloat16 or float): a kernel's launch for its element
// type.
template <typename F>
cudaError_t by_element_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kHalf:
      return f(__half{});
    case ElementType::kBFloat16:
      return f(__nv_bfloat16{});
    case ElementType::kFloat:
      return f(float{});
  }
  return cudaErrorInvalidValue;
}

// Whether `grid` fits on the current device at once, a cooperative launch's condition: `kernel`'s occupancy at
// kThreads threads and `shared_bytes` of dynamic shared memory a block (the largest a launch of it uses), asked once
// per device through `occupancy` (one static per kernel). False where the device takes no cooperative launch.
template <typename Kernel>
bool cooperative_grid_fits(Kernel kernel, size_t shared_bytes, const dim3& grid, int multiprocessors,
                           PerDevice& occupancy) {
  const int blocks = occupancy.get_current([&](int device) {  // 0: the caller launches its passes apart
    int cooperative = 0, blocks = 0;
    if (cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) != cudaSuccess || !cooperative) {
      cudaGetLastError();
      return 0;
    }
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, shared_bytes) != cudaSuccess) {
      cudaGetLastError();  // clear it
      return 0;
    }
    return blocks;
  });
  return static_cast<int64_t>(grid.x) * grid.y * grid.z <= static_cast<int64_t>(blocks) * multiprocessors;
}

// `kernel` launched cooperatively (its blocks may meet at grid-wide barriers) in `shape` on `stream`. Returns
// cudaErrorCooperativeLaunchTooLarge, the error cleared, where the device runs fewer blocks at once than its
// occupancy said (MPS): the caller then launches its passes apart.
template <typename... Params, typename... Args>
cudaError_t launch_cooperative(void (*kernel)(Params...), const Launch& shape, size_t shared_bytes,
                               cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute cooperative;
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  config.attrs = &cooperative;
  config.numAttrs = 1;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status == cudaErrorCooperativeLaunchTooLarge) cudaGetLastError();
  return status;
}

}  // namespace nhwc
}  // namespace tcf
