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
// The statistics are sums of x and x * x in double: each product is exact for float16, bfloat16 and float32, and the
// sums keep about 53 bits, so that neither a mean near zero (its error relative to itself) nor one far from it
// against the spread (E[x^2] - mean^2 cancels) loses what float32 statistics would. Two earlier forms in float32,
// tried on an H200 in the whole suite: sums of x - x[row 0] and its square (17 float32 model-zoo tests failed, with
// running means up to 50x further from float64 than eager's), then Welford's moments merged by Chan's formula (9
// still failed, by 2-6x, where the batch mean is zero up to rounding, as behind a BatchNorm with no activation).
// Three passes: per-block partial sums; their fixed-order sum per channel (deterministic, no atomics) into the
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

// One block a multiprocessor where kBlocksPerMultiprocessor would give each thread fewer than kFewRows rows: there a
// block's fixed costs (its block sum and partial sums, the finalize's parts, its share of the barriers) outweigh its
// rows. mobilenet_v2's layers at batch 256, bfloat16 (H100, batch_norm_forward_phases.py, 2026-12-07b), one block
// against two: 15.9 us against 18.4 at 64 channels and 14x14 (5.9 rows a thread), 19.5 against 21.2 at 96 and 14x14
// (9.0), 15.2 against 18.3 at 160 and 7x7 (4.0), 20.1 against 25.1 at 320 and 7x7 (7.9); 20.3 against 19.3 at 32
// and 28x28 (11.9), and up to 30 % slower on the large layers. With this rule in the kernel (2026-12-07c): 16.4, 20.3,
// 15.7 and 21.2 us on those four, against 19.6, 22.6, 20.0 and 26.6 at two blocks, the same y; the others unchanged.
constexpr int kFewRows = 10;

// The launch shape of the three passes (the partial sums' rows follow from it: batch_norm_act_forward_partial_rows).
inline nhwc::Launch forward_launch(int64_t rows, int64_t channels, int vector, int multiprocessors) {
  const auto shape = nhwc::row_launch(rows, channels, vector, multiprocessors, kBlocksPerMultiprocessor);
  if (rows >= kFewRows * static_cast<int64_t>(shape.grid.y) * shape.block.y) return shape;
  return nhwc::row_launch(rows, channels, vector, multiprocessors, 1);
}

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

// Floats of dynamic shared memory: the first pass's (two doubles per thread and channel) and the second's (32 lanes
// of 8 channels' two doubles); the one launch takes the larger.
constexpr size_t statistics_floats(int V, int threads) { return static_cast<size_t>(4 * V) * threads; }
constexpr int kFinalizeFloats = 32 * 8 * 2 * 2;

// Pass 1: per block, each channel's sum of x and of x * x in double (exact products for every storage type; the
// block's rows of threads added pairwise) into the partial sums: [2][parts][channels] doubles. `shared` holds
// statistics_floats(V, blockDim.x * blockDim.y) floats.
template <typename T, int V>
__device__ void statistics_rows(const T* __restrict__ x, double* __restrict__ partial, int64_t rows, int64_t channels,
                                float* shared_floats) {
  using P = Pack<T, V>;
  const int64_t groups = channels / V;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  double sum[V], sum_sq[V];
#pragma unroll
  for (int v = 0; v < V; ++v) sum[v] = sum_sq[v] = 0.0;
  if (group < groups) {
    const int64_t column = group * V;
    auto add = [&](const P& p) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const double value = to_float(p.v[v]);
        sum[v] += value;
        sum_sq[v] += value * value;
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
    if (row < rows) {  // the last rows, fewer than kUnroll: their loads issued together too, added in order
      P p[kUnroll - 1];
#pragma unroll
      for (int u = 0; u < kUnroll - 1; ++u) {
        if (row + u * step < rows) p[u] = *reinterpret_cast<const P*>(x + (row + u * step) * channels + column);
      }
#pragma unroll
      for (int u = 0; u < kUnroll - 1; ++u) {
        if (row + u * step < rows) add(p[u]);
      }
    }
  }
  // The block's rows of threads added pairwise (row r and row r + half, while more than one is left), every thread
  // taking part, not by one thread per column in turn over all blockDim.y rows (85 at 24 channels of bfloat16):
  // with float sums, MobileNet v2's 19 BatchNorm shapes (batch 256, H200, a scratch harness) took 1726 us together
  // with the serial sum against 1683 pairwise. Sum v of thread (x, y) sits at shared[v][y][x] (sums of squares
  // after the sums): a warp's threads touch consecutive doubles. Laid out [y][x][v] (a thread's V sums side by side,
  // 8 V bytes apart from its neighbour's), each half warp's 16 accesses fell on 2 banks' pairs, 8-way conflicts:
  // this pass then took 10.9 us of our kernel's 25.0 on mobilenet_v2's 64-channel 14x14 layer (H100, batch 256,
  // bfloat16, batch_norm_forward_phases.py, 2026-12-07), where a copy of x and y took 3.1; laid out so, with the
  // last rows' loads issued together, 4.0 of 18.4, the same bits (2026-12-07b).
  double* shared = reinterpret_cast<double*>(shared_floats);
  const int plane = blockDim.x * blockDim.y;
  double* my_sum = shared + threadIdx.y * blockDim.x + threadIdx.x;  // sum v at my_sum[v * plane]
  double* my_sum_sq = my_sum + V * plane;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    my_sum[v * plane] = sum[v];
    my_sum_sq[v * plane] = sum_sq[v];
  }
  __syncthreads();
  for (int block_rows = blockDim.y; block_rows > 1;) {
    const int half = (block_rows + 1) / 2;
    if (static_cast<int>(threadIdx.y) + half < block_rows) {
      const int below = half * blockDim.x;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        my_sum[v * plane] += my_sum[v * plane + below];
        my_sum_sq[v * plane] += my_sum_sq[v * plane + below];
      }
    }
    __syncthreads();
    block_rows = half;
  }
  if (threadIdx.y == 0 && group < groups) {
    const int64_t parts = gridDim.y;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t at = static_cast<int64_t>(blockIdx.y) * channels + group * V + v;
      partial[at] = my_sum[v * plane];
      partial[parts * channels + at] = my_sum_sq[v * plane];
    }
  }
}

// Pass 2 for channel c, from its sums over all rows: the saved statistics, the running ones (in double, rounded to
// float once), the step count.
__device__ inline void finish_channel(const BatchNormActForwardArgs& a, int64_t c, double sum, double sum_sq) {
  const double rows = static_cast<double>(a.rows);
  const double mean = sum / rows;
  const double var = fmax(sum_sq / rows - mean * mean, 0.0);
  a.save_mean[c] = static_cast<float>(mean);
  a.save_invstd[c] = static_cast<float>(1.0 / sqrt(var + static_cast<double>(a.eps)));
  if (a.running_mean_in == nullptr) return;
  const double momentum = a.momentum;
  a.running_mean_out[c] = static_cast<float>(momentum * mean + (1.0 - momentum) * a.running_mean_in[c]);
  a.running_var_out[c] =
      static_cast<float>(momentum * var * rows / (rows - 1.0) + (1.0 - momentum) * a.running_var_in[c]);
  if (c == 0 && a.num_batches_tracked != nullptr) *a.num_batches_tracked += 1;
}

// Pass 2: the blocks share out tiles of 8 channels; in each, 32 lanes add the parts p = lane, lane + 32, ... and one
// thread per channel adds the lanes' sums in order. The partial sums are read through L2 (in the one launch, other
// blocks wrote them in this launch). `shared` holds kFinalizeFloats floats.
__device__ void finalize_tiles(const BatchNormActForwardArgs& a, int parts, float* shared_floats) {
  constexpr int kTileChannels = 8, kLanes = 32, kPairs = kTileChannels * kLanes;
  double* shared = reinterpret_cast<double*>(shared_floats);
  const int threads = blockDim.x * blockDim.y;
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t blocks = static_cast<int64_t>(gridDim.x) * gridDim.y;
  const int64_t block = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t stride = static_cast<int64_t>(parts) * a.channels;
  for (int64_t tile = block; tile * kTileChannels < a.channels; tile += blocks) {
    for (int pair = thread; pair < kPairs; pair += threads) {  // a block may have fewer than 256 threads
      const int lane = pair / kTileChannels, slot = pair % kTileChannels;
      const int64_t c = tile * kTileChannels + slot;
      double sum = 0.0, sum_sq = 0.0;
      if (c < a.channels) {
        for (int p = lane; p < parts; p += kLanes) {
          const double* at = a.partial + static_cast<int64_t>(p) * a.channels + c;
          sum += __ldcg(at);
          sum_sq += __ldcg(at + stride);
        }
      }
      shared[(lane * kTileChannels + slot) * 2] = sum;
      shared[(lane * kTileChannels + slot) * 2 + 1] = sum_sq;
    }
    __syncthreads();
    const int64_t c = tile * kTileChannels + thread;
    if (thread < kTileChannels && c < a.channels) {
      double sum = 0.0, sum_sq = 0.0;
      for (int lane = 0; lane < kLanes; ++lane) {
        sum += shared[(lane * kTileChannels + thread) * 2];
        sum_sq += shared[(lane * kTileChannels + thread) * 2 + 1];
      }
      finish_channel(a, c, sum, sum_sq);
    }
    __syncthreads();  // `shared` is rewritten for the next tile
  }
}

// Pass 2 as a launch of its own: one block of 256 threads per tile of 8 channels.
__global__ void batch_norm_act_forward_finalize(const BatchNormActForwardArgs a, int parts) {
  __shared__ double shared[kFinalizeFloats / 2];  // doubles: their alignment
  finalize_tiles(a, parts, reinterpret_cast<float*>(shared));
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
  extern __shared__ __align__(16) float shared[];  // statistics_floats(V, blockDim.x * blockDim.y)
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
  // max(statistics_floats(V, blockDim.x * blockDim.y), kFinalizeFloats)
  extern __shared__ __align__(16) float shared[];
  auto grid = cooperative_groups::this_grid();
  statistics_rows<T, V>(static_cast<const T*>(a.x), a.partial, a.rows, a.channels, shared);
  grid.sync();
  finalize_tiles(a, static_cast<int>(gridDim.y), shared);
  grid.sync();
  apply_rows<T, V, kResidual, kAct>(a);
}

template <typename T, int V, bool kResidual, Act kAct>
cudaError_t launch_passes(const BatchNormActForwardArgs& a, int multiprocessors, cudaStream_t stream) {
  const auto shape = forward_launch(a.rows, a.channels, V, multiprocessors);
  // the occupancy at the largest shared memory a launch of this instantiation uses, once per device
  static PerDevice occupancy;
  const auto shared_floats = [](int threads) {
    return std::max<size_t>(statistics_floats(V, threads), kFinalizeFloats);
  };
  const auto kernel = batch_norm_act_forward_one_launch<T, V, kResidual, kAct>;
  if (nhwc::cooperative_grid_fits(kernel, shared_floats(nhwc::kThreads) * sizeof(float), shape.grid, multiprocessors,
                                  occupancy)) {
    const cudaError_t status = nhwc::launch_cooperative(
        kernel, shape, shared_floats(shape.block.x * shape.block.y) * sizeof(float), stream, a);
    if (status != cudaErrorCooperativeLaunchTooLarge) return status;  // else three launches
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
  const int vector = vectors ? 16 / element_bytes : 1;
  return 2 * static_cast<int64_t>(forward_launch(rows, channels, vector, multiprocessors).grid.y);
}

cudaError_t launch_batch_norm_act_forward_nhwc(ElementType type, const BatchNormActForwardArgs& args, bool vectors,
                                               int multiprocessors, cudaStream_t stream) {
  // SiLU, Hardswish and LeakyReLU take no residual (their backward reads the sum before the activation, not kept)
  if (args.activation < kActivationNone || args.activation > kActivationLeakyRelu || args.rows < 2 ||
      (args.residual != nullptr && args.activation > kActivationRelu6)) {
    return cudaErrorInvalidValue;
  }
  return nhwc::by_element_type(type, [&](auto element) {
    return launch_typed<decltype(element)>(args, vectors, multiprocessors, stream);
  });
}

}  // namespace tcf
