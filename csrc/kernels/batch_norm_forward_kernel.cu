// BatchNorm's training forward with batch statistics, its residual add and activation folded in, for dense NHWC
// tensors: what the cuDNN batchnorm graph (and for SiLU, Hardswish and LeakyReLU, an ATen kernel after it) and our
// running-statistics kernel did, in one launch whose host cost is a launch's. With M the rows (N*H*W):
//   mean     = the batch mean;  var = the biased batch variance;  invstd = 1 / sqrt(var + eps)
//   y        = activation(round(round((x - mean) * invstd * weight + bias) + residual))
//   running  = (1 - momentum) * running + momentum * (mean, var * M / (M - 1)); num_batches_tracked + 1
// round() is the storage type's rounding where eager rounds: BatchNorm's output, then the sum with the residual.
// (x - mean) * invstd * weight + bias is computed with explicit roundings, in the order the backward kernel
// (batch_norm_backward_kernel.cu, masked_grad) recomputes it from the saved statistics: its ReLU mask is then this
// forward's, bit for bit.
// The statistics are Welford's moments (count, mean, sum of squared deviations), merged in a fixed order by Chan et
// al.'s formula, as PyTorch's own BatchNorm kernels take them: no cancellation where the mean is large against the
// spread, and the mean's error stays relative to the mean where it is small. (A first form summed x - x[row 0] and
// its square: the sums drifted with the shift, and float32 model-zoo tests found running means up to 50x further
// from float64 than eager's.)
// Three passes: per-block partial moments; their fixed-order merge per channel (deterministic, no atomics) into the
// statistics; y. They run in one cooperative launch with grid-wide barriers between them where the device takes it,
// else as three launches with the same arithmetic and the same bits. As in the backward kernel, the first and last
// pass run one wave, the last walking the rows back from the last, so that its first reads find in L2 what the
// first pass read last.
#include "kernels/batch_norm_forward_kernel.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "kernels/nhwc_rows.cuh"

namespace tcf {
namespace {

using nhwc::from_float;
using nhwc::Pack;
using nhwc::to_float;

constexpr int kBlocksPerMultiprocessor = 2;

// How the last pass applies the activation, a template argument: kClamp holds the value between two bounds (no
// activation: none; ReLU: 0 and none; ReLU6: 0 and 6), with no branch per element; kFunction computes SiLU,
// Hardswish or LeakyReLU. With one switch over all six per element, MobileNet v2's 19 BatchNorm shapes (batch 256,
// bfloat16, ReLU6 or none; H200, a scratch harness, one launch each) took 2313 us together, against 1733 so.
enum class Act { kClamp, kFunction };

// SiLU, Hardswish or LeakyReLU at s (BatchNorm's output rounded to the storage type), as PyTorch's kernels compute
// them in float32.
__device__ inline float activate(float s, int activation, float negative_slope) {
  if (activation == kActivationSilu) return s / (1.f + expf(-s));
  if (activation == kActivationHardswish) return s * fminf(fmaxf(s + 3.f, 0.f), 6.f) / 6.f;
  return s > 0.f ? s : s * negative_slope;
}

// Welford's moments of a set of rows for one channel: their count, their mean and the sum of squared deviations
// from it. merge() adds another set's (Chan et al.'s formula), in a fixed order wherever it is called: the same
// inputs give the same bits. A set of no rows leaves the moments as they are; merged into an empty one, it is copied.
__device__ inline void merge(float& n, float& mean, float& m2, float n_b, float mean_b, float m2_b) {
  if (n_b == 0.f) return;
  const float total = n + n_b;
  const float delta = mean_b - mean;
  const float share = n_b / total;
  mean += delta * share;
  m2 += m2_b + delta * delta * n * share;
  n = total;
}

// Floats of dynamic shared memory: the first pass's (a mean and an m2 per thread and channel, a count per thread) and
// the second's (32 lanes of 8 channels' three moments); the one launch takes the larger.
constexpr size_t statistics_floats(int V, int threads) { return static_cast<size_t>(2 * V + 1) * threads; }
constexpr int kFinalizeFloats = 32 * 8 * 3;

// Pass 1: per block, each channel's moments (Welford's update row by row in each thread, whose rows all share its
// count, then the block's rows merged pairwise) into the partial arrays: mean, m2 and count, each [parts][channels].
// `shared` holds statistics_floats(V, blockDim.x * blockDim.y) floats.
template <typename T, int V>
__device__ void statistics_rows(const T* __restrict__ x, float* __restrict__ partial, int64_t rows, int64_t channels,
                                float* shared) {
  using P = Pack<T, V>;
  const int64_t groups = channels / V;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float n = 0.f, mean[V], m2[V];
#pragma unroll
  for (int v = 0; v < V; ++v) mean[v] = m2[v] = 0.f;
  if (group < groups) {
    const int64_t column = group * V;
    auto add = [&](const P& p) {
      n += 1.f;
      const float inverse = 1.f / n;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const float value = to_float(p.v[v]);
        const float delta = value - mean[v];
        mean[v] += delta * inverse;
        m2[v] += delta * (value - mean[v]);
      }
    };
    const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
    int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
    constexpr int kUnroll = 4;  // four rows a step, all loads issued before any use
    for (; row + (kUnroll - 1) * step < rows; row += kUnroll * step) {
      P p[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) p[u] = *reinterpret_cast<const P*>(x + (row + u * step) * channels + column);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) add(p[u]);
    }
    for (; row < rows; row += step) add(*reinterpret_cast<const P*>(x + row * channels + column));
  }
  // The block's rows of threads merged pairwise (row r and row r + half, while more than one is left), every thread
  // taking part, not by one thread per column in turn over all blockDim.y rows (85 at 24 channels of bfloat16). With
  // sums in place of the moments, the serial form took 55.8 us against 49.7 on MobileNet v2's 24-channel layer at
  // 56x56, batch 256 (H200, a scratch harness).
  const int width = blockDim.x * V;
  float* my_mean = shared + threadIdx.y * width + threadIdx.x * V;
  float* my_m2 = my_mean + blockDim.y * width;
  float* my_n = shared + 2 * blockDim.y * width + threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    my_mean[v] = mean[v];
    my_m2[v] = m2[v];
  }
  *my_n = n;
  __syncthreads();
  for (int block_rows = blockDim.y; block_rows > 1;) {
    const int half = (block_rows + 1) / 2;
    if (static_cast<int>(threadIdx.y) + half < block_rows) {
      const float n_b = my_n[half * blockDim.x];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        float n_v = n;
        merge(n_v, mean[v], m2[v], n_b, my_mean[half * width + v], my_m2[half * width + v]);
        my_mean[v] = mean[v];
        my_m2[v] = m2[v];
      }
      n += n_b;
      *my_n = n;
    }
    __syncthreads();
    block_rows = half;
  }
  if (threadIdx.y == 0 && group < groups) {
    const int64_t parts = gridDim.y;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t at = static_cast<int64_t>(blockIdx.y) * channels + group * V + v;
      partial[at] = mean[v];
      partial[parts * channels + at] = m2[v];
      partial[2 * parts * channels + at] = n;
    }
  }
}

// Pass 2 for channel c, from its moments over all rows: the saved statistics, the running ones, the step count.
__device__ inline void finish_channel(const BatchNormActForwardArgs& a, int64_t c, float mean, float m2) {
  const double rows = static_cast<double>(a.rows);
  const float var = m2 * static_cast<float>(1.0 / rows);
  a.save_mean[c] = mean;
  a.save_invstd[c] = 1.f / sqrtf(var + a.eps);
  if (a.running_mean_in == nullptr) return;
  const float unbiased = m2 * static_cast<float>(1.0 / (rows - 1.0));
  a.running_mean_out[c] = a.momentum * mean + (1.f - a.momentum) * a.running_mean_in[c];
  a.running_var_out[c] = a.momentum * unbiased + (1.f - a.momentum) * a.running_var_in[c];
  if (c == 0 && a.num_batches_tracked != nullptr) *a.num_batches_tracked += 1;
}

// Pass 2: the blocks share out tiles of 8 channels; in each, 32 lanes merge the parts p = lane, lane + 32, ... and
// one thread per channel merges the lanes' moments in order. The partial moments are read through L2 (in the one
// launch, other blocks wrote them in this launch). `shared` holds kFinalizeFloats floats.
__device__ void finalize_tiles(const BatchNormActForwardArgs& a, int parts, float* shared) {
  constexpr int kTileChannels = 8, kLanes = 32, kPairs = kTileChannels * kLanes;
  const int threads = blockDim.x * blockDim.y;
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t blocks = static_cast<int64_t>(gridDim.x) * gridDim.y;
  const int64_t block = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t stride = static_cast<int64_t>(parts) * a.channels;
  for (int64_t tile = block; tile * kTileChannels < a.channels; tile += blocks) {
    for (int pair = thread; pair < kPairs; pair += threads) {  // a block may have fewer than 256 threads
      const int lane = pair / kTileChannels, slot = pair % kTileChannels;
      const int64_t c = tile * kTileChannels + slot;
      float n = 0.f, mean = 0.f, m2 = 0.f;
      if (c < a.channels) {
        for (int p = lane; p < parts; p += kLanes) {
          const float* at = a.partial + static_cast<int64_t>(p) * a.channels + c;
          merge(n, mean, m2, __ldcg(at + 2 * stride), __ldcg(at), __ldcg(at + stride));
        }
      }
      float* mine = shared + (lane * kTileChannels + slot) * 3;
      mine[0] = n;
      mine[1] = mean;
      mine[2] = m2;
    }
    __syncthreads();
    const int64_t c = tile * kTileChannels + thread;
    if (thread < kTileChannels && c < a.channels) {
      float n = 0.f, mean = 0.f, m2 = 0.f;
      for (int lane = 0; lane < kLanes; ++lane) {
        const float* theirs = shared + (lane * kTileChannels + thread) * 3;
        merge(n, mean, m2, theirs[0], theirs[1], theirs[2]);
      }
      finish_channel(a, c, mean, m2);
    }
    __syncthreads();  // `shared` is rewritten for the next tile
  }
}

// Pass 2 as a launch of its own: one block of 256 threads per tile of 8 channels.
__global__ void batch_norm_act_forward_finalize(const BatchNormActForwardArgs a, int parts) {
  __shared__ float shared[kFinalizeFloats];
  finalize_tiles(a, parts, shared);
}

// Pass 3: y. The statistics are read through L2 (__ldcg): in the one-launch kernel other blocks wrote them in this
// launch. Each thread takes pass 1's rows (row0, row0 + step, ...) from its last back to row0.
template <typename T, int V, bool kResidual, Act kAct>
__device__ void apply_rows(const BatchNormActForwardArgs& a) {
  using P = Pack<T, V>;
  const int64_t groups = a.channels / V;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (group >= groups) return;
  const int64_t column = group * V;
  float mean[V], invstd[V], weight[V], bias[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    mean[v] = __ldcg(a.save_mean + column + v);
    invstd[v] = __ldcg(a.save_invstd + column + v);
    weight[v] = a.weight[column + v];
    bias[v] = a.bias[column + v];
  }
  // the bounds of kClamp; NaN passes between them, as through PyTorch's ReLU and ReLU6
  const float low = a.activation == kActivationNone ? -INFINITY : 0.f;
  const float high = a.activation == kActivationRelu6 ? 6.f : INFINITY;
  const T* __restrict__ x = static_cast<const T*>(a.x);
  const T* __restrict__ residual = static_cast<const T*>(a.residual);
  T* __restrict__ y = static_cast<T*>(a.y);
  auto process = [&](const P& x_p, const P& r_p, int64_t offset) {
    P y_p;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float xc = __fsub_rn(to_float(x_p.v[v]), mean[v]);
      float s = to_float(from_float<T>(__fadd_rn(__fmul_rn(__fmul_rn(xc, invstd[v]), weight[v]), bias[v])));
      if (kResidual) s = to_float(from_float<T>(__fadd_rn(s, to_float(r_p.v[v]))));
      y_p.v[v] = from_float<T>(kAct == Act::kClamp ? (s <= low ? low : (s >= high ? high : s))
                                                   : activate(s, a.activation, a.negative_slope));
    }
    *reinterpret_cast<P*>(y + offset) = y_p;
  };
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  if (row0 >= a.rows) return;
  int64_t k = (a.rows - 1 - row0) / step;  // the thread's rows are row0 + k * step, k from here down to 0
  constexpr int kUnroll = 4;
  for (; k >= kUnroll - 1; k -= kUnroll) {
    P x_p[kUnroll], r_p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t offset = (row0 + (k - u) * step) * a.channels + column;
      x_p[u] = *reinterpret_cast<const P*>(x + offset);
      if (kResidual) r_p[u] = *reinterpret_cast<const P*>(residual + offset);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) process(x_p[u], r_p[u], (row0 + (k - u) * step) * a.channels + column);
  }
  for (; k >= 0; --k) {
    const int64_t offset = (row0 + k * step) * a.channels + column;
    P r_p;
    if (kResidual) r_p = *reinterpret_cast<const P*>(residual + offset);
    process(*reinterpret_cast<const P*>(x + offset), r_p, offset);
  }
}

template <typename T, int V>
__global__ void __launch_bounds__(nhwc::kThreads, kBlocksPerMultiprocessor)
    batch_norm_act_forward_statistics(const BatchNormActForwardArgs a) {
  extern __shared__ float shared[];  // statistics_floats(V, blockDim.x * blockDim.y)
  statistics_rows<T, V>(static_cast<const T*>(a.x), a.partial, a.rows, a.channels, shared);
}

template <typename T, int V, bool kResidual, Act kAct>
__global__ void __launch_bounds__(nhwc::kThreads, kBlocksPerMultiprocessor)
    batch_norm_act_forward_apply(const BatchNormActForwardArgs a) {
  apply_rows<T, V, kResidual, kAct>(a);
}

// The three passes in one cooperative launch: a grid-wide barrier after the partial sums and another after the
// statistics (as the backward kernel's one launch).
template <typename T, int V, bool kResidual, Act kAct>
__global__ void __launch_bounds__(nhwc::kThreads, kBlocksPerMultiprocessor)
    batch_norm_act_forward_one_launch(const BatchNormActForwardArgs a) {
  extern __shared__ float shared[];  // max(statistics_floats(V, blockDim.x * blockDim.y), kFinalizeFloats)
  auto grid = cooperative_groups::this_grid();
  statistics_rows<T, V>(static_cast<const T*>(a.x), a.partial, a.rows, a.channels, shared);
  grid.sync();
  finalize_tiles(a, static_cast<int>(gridDim.y), shared);
  grid.sync();
  apply_rows<T, V, kResidual, kAct>(a);
}

// Whether the one-launch kernel's grid fits on the current device at once (a cooperative launch's condition), from
// its occupancy at the largest shared memory a launch of this instantiation uses, asked once per device.
template <typename T, int V, bool kResidual, Act kAct>
bool one_launch_fits(const dim3& grid, int multiprocessors) {
  static PerDevice blocks_per_multiprocessor;
  const int blocks = blocks_per_multiprocessor.get_current([](int device) {  // 0: this launch falls back to three
    int cooperative = 0, blocks = 0;
    if (cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device) != cudaSuccess || !cooperative) {
      cudaGetLastError();
      return 0;
    }
    const size_t shared = std::max<size_t>(statistics_floats(V, nhwc::kThreads), kFinalizeFloats) * sizeof(float);
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, batch_norm_act_forward_one_launch<T, V, kResidual, kAct>,
                                                      nhwc::kThreads, shared) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return blocks;
  });
  return static_cast<int64_t>(grid.x) * grid.y * grid.z <= static_cast<int64_t>(blocks) * multiprocessors;
}

template <typename T, int V, bool kResidual, Act kAct>
cudaError_t launch_passes(const BatchNormActForwardArgs& a, int multiprocessors, cudaStream_t stream) {
  const auto shape = nhwc::row_launch(a.rows, a.channels, V, multiprocessors, kBlocksPerMultiprocessor);
  if (one_launch_fits<T, V, kResidual, kAct>(shape.grid, multiprocessors)) {
    cudaLaunchConfig_t config = {};
    config.gridDim = shape.grid;
    config.blockDim = shape.block;
    config.dynamicSmemBytes =
        std::max<size_t>(statistics_floats(V, shape.block.x * shape.block.y), kFinalizeFloats) * sizeof(float);
    config.stream = stream;
    cudaLaunchAttribute cooperative;
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    config.attrs = &cooperative;
    config.numAttrs = 1;
    cudaError_t status = cudaLaunchKernelEx(&config, batch_norm_act_forward_one_launch<T, V, kResidual, kAct>, a);
    if (status != cudaErrorCooperativeLaunchTooLarge) return status;
    cudaGetLastError();  // the device runs fewer blocks at once than its occupancy said (MPS): three launches
  }
  const size_t shared_bytes = statistics_floats(V, shape.block.x * shape.block.y) * sizeof(float);
  batch_norm_act_forward_statistics<T, V><<<shape.grid, shape.block, shared_bytes, stream>>>(a);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  batch_norm_act_forward_finalize<<<static_cast<unsigned>((a.channels + 7) / 8), nhwc::kThreads, 0, stream>>>(
      a, static_cast<int>(shape.grid.y));
  status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  batch_norm_act_forward_apply<T, V, kResidual, kAct><<<shape.grid, shape.block, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T, int V>
cudaError_t launch_vectors(const BatchNormActForwardArgs& a, int multiprocessors, cudaStream_t stream) {
  if (a.activation > kActivationRelu6) return launch_passes<T, V, false, Act::kFunction>(a, multiprocessors, stream);
  return a.residual != nullptr ? launch_passes<T, V, true, Act::kClamp>(a, multiprocessors, stream)
                               : launch_passes<T, V, false, Act::kClamp>(a, multiprocessors, stream);
}

template <typename T>
cudaError_t launch_typed(const BatchNormActForwardArgs& a, bool vectors, int multiprocessors, cudaStream_t stream) {
  return vectors ? launch_vectors<T, nhwc::Vec<T>::kSize>(a, multiprocessors, stream)
                 : launch_vectors<T, 1>(a, multiprocessors, stream);
}

}  // namespace

int64_t batch_norm_act_forward_partial_rows(int64_t rows, int64_t channels, bool vectors, int element_bytes,
                                            int multiprocessors) {
  return 3 * nhwc::row_launch(rows, channels, vectors ? 16 / element_bytes : 1, multiprocessors,
                              kBlocksPerMultiprocessor).grid.y;
}

cudaError_t launch_batch_norm_act_forward_nhwc(ElementType type, const BatchNormActForwardArgs& args, bool vectors,
                                               int multiprocessors, cudaStream_t stream) {
  // SiLU, Hardswish and LeakyReLU take no residual (their backward reads the sum before the activation, not kept)
  if (args.activation < kActivationNone || args.activation > kActivationLeakyRelu || args.rows < 2 ||
      (args.residual != nullptr && args.activation > kActivationRelu6)) {
    return cudaErrorInvalidValue;
  }
  switch (type) {
    case ElementType::kHalf:
      return launch_typed<__half>(args, vectors, multiprocessors, stream);
    case ElementType::kBFloat16:
      return launch_typed<__nv_bfloat16>(args, vectors, multiprocessors, stream);
    case ElementType::kFloat:
      return launch_typed<float>(args, vectors, multiprocessors, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace tcf
