// BatchNorm's training backward with its activation's backward folded in, for dense NHWC tensors. With
// xc = x - mean (the saved batch mean), a = invstd * weight and M the rows (N*H*W):
//   g        = dy where the activation passed, else 0   (ReLU: v > 0; ReLU6: 0 < v < 6);
//              dy * silu'(v) or dy * hardswish'(v) after SiLU or Hardswish; dy where v > 0, else dy * slope, after
//              LeakyReLU
//   dbias    = sum of g over the rows;  dweight = invstd * sum of g * xc
//   dx       = a * (g - dbias / M - xc * invstd * dweight / M)
// v is the forward output y (read) when a residual was added before the activation, else the pre-activation
// xc * invstd * weight + bias recomputed here and rounded to the storage type, as the forward's output was: the
// mask then costs no read. Eager runs ReLU backward as one more pass over memory (threshold_backward reads dy and y,
// writes dz) before BatchNorm's backward reads dz twice: here the mask is applied as dy is read.
// Three passes: per-block partial sums of g and g * xc; their fixed-order sum (deterministic, no atomics) into
// dweight and dbias; dx, with its coefficients dbias / M and invstd * dweight / M taken from those two. With a
// residual, the first writes g (the residual's gradient) and the last reads it back instead of dy and y.
// They run in one cooperative launch with grid-wide barriers between them (batch_norm_act_backward_one_launch)
// where the device takes it, else as three launches with the same arithmetic and the same bits.
// The first and last pass run one wave: kBlocksPerMultiprocessor blocks per multiprocessor, all resident at once,
// so that their threads sweep the rows together, the first from the first row to the last, the last back from the
// last row: its first reads find in L2 what the first launch read last. Over MobileNet v1's 27 BatchNorm shapes
// (batch 256, bf16, H100, a scratch harness, 2026-11-24) the two took 4.50 ms together, against 4.69 with dx walking
// forward in one wave and 5.08 with 8 blocks per multiprocessor (four waves): the reduce alone 1.88 against 2.22 ms
// (a pure read of the same bytes: 1.75). docs/benchmarks.md has the rest.
#include "kernels/batch_norm_backward_kernel.h"

#include <cooperative_groups.h>

#include <algorithm>

#include "core/device.h"
#include "kernels/nhwc_rows.cuh"

namespace tcf {
namespace {

using nhwc::from_float;
using nhwc::Pack;
using nhwc::to_float;

// The per-channel values a thread keeps for its V channels.
template <int V>
struct Channels {
  float mean[V], invstd[V], weight[V], bias[V];

  __device__ void load(const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
                       const float* __restrict__ w, const float* __restrict__ b, int64_t column) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      mean[v] = save_mean[column + v];
      invstd[v] = save_invstd[column + v];
      weight[v] = w[column + v];
      bias[v] = b[column + v];
    }
  }
};

__device__ inline bool passes(float v, int activation) {
  return activation == kActivationRelu6 ? (v > 0.f && v < 6.f) : v > 0.f;
}

// What the kernels' g is taken from, a template argument so that each instantiation holds one's code: the ReLU or
// ReLU6 mask of the pre-activation, recomputed from x (kMaskOfPre), or of the forward output y, read where a residual
// was added before the activation (kMaskOfY); or SiLU's or Hardswish's derivative at the recomputed pre-activation
// (kDerivative; they never take a residual: their derivative needs the input, which is not kept); or LeakyReLU's
// gate at the recomputed pre-activation (kLeaky: dy where v > 0, else dy * negative_slope, as PyTorch's
// leaky_relu_backward computes it in float32), an instantiation of its own so that the others' code stays as it
// was. With the derivative in every instantiation (09e4f51..1576728) the bfloat16 one-launch kernel of 8-element
// vectors spilled 156 bytes (0 before) and took 6.10 ms of an H200's MobileNet v1 step against 3.50 (profile_by_kind,
// 2026-11-27s and -26k).
enum class Gate { kMaskOfPre, kMaskOfY, kDerivative, kLeaky };

// SiLU's or Hardswish's derivative at v, its input (the BatchNorm output rounded to the storage type, as eager's
// activation reads it), computed as PyTorch's silu_backward and hardswish_backward compute it in float32.
// Explicit roundings, no contraction: the first and last pass must reach the same value bit for bit.
__device__ inline float derivative(float v, int activation) {
  if (activation == kActivationSilu) {
    const float sigmoid = __frcp_rn(__fadd_rn(1.f, expf(-v)));
    return __fmul_rn(sigmoid, __fadd_rn(1.f, __fmul_rn(v, __fsub_rn(1.f, sigmoid))));
  }
  // Hardswish: 0 at -3 and 1 at 3, as PyTorch's (half-precision outputs hit both)
  if (v <= -3.f) return 0.f;
  return v < 3.f ? __fadd_rn(__fdiv_rn(v, 3.f), 0.5f) : 1.f;
}

// g for one element: dy through the activation (ReLU, ReLU6: its mask; SiLU, Hardswish: dy times the derivative).
template <typename T, Gate G>
__device__ inline float masked_grad(float dy, float xc, float y, float invstd, float weight, float bias,
                                    int activation, float negative_slope) {
  const float v =
      G == Gate::kMaskOfY ? y : to_float(from_float<T>(__fadd_rn(__fmul_rn(__fmul_rn(xc, invstd), weight), bias)));
  if (G == Gate::kLeaky) return v > 0.f ? dy : __fmul_rn(dy, negative_slope);
  if (G != Gate::kDerivative) return passes(v, activation) ? dy : 0.f;
  return __fmul_rn(dy, derivative(v, activation));
}

// Blocks of the first and last launch per multiprocessor: their occupancy (at most 128 registers a thread), and
// their grid (one wave). Two blocks at least: more loads in flight than one block of the unrolled loop keeps.
constexpr int kBlocksPerMultiprocessor = 2;

// Pass 1: per-block partial sums of g (partial[0]) and g * xc (partial[1]); g written to dz when dz is not null.
// `shared` holds V * blockDim.y * blockDim.x floats.
template <typename T, int V, Gate G>
__device__ void reduce_rows(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                            const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
                            const float* __restrict__ weight, const float* __restrict__ bias, T* __restrict__ dz,
                            float* __restrict__ partial, int64_t rows, int64_t channels, int activation,
                            float negative_slope, float* shared) {
  constexpr bool kFromY = G == Gate::kMaskOfY;
  using P = Pack<T, V>;
  const int64_t groups = channels / V;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float sum_g[V], sum_gx[V];
#pragma unroll
  for (int v = 0; v < V; ++v) sum_g[v] = sum_gx[v] = 0.f;
  if (group < groups) {
    const int64_t column = group * V;
    Channels<V> ch;
    ch.load(save_mean, save_invstd, weight, bias, column);
    const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
    auto process = [&](const P& dy_p, const P& x_p, const P& y_p, int64_t offset) {
      P g_p;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        float xc = __fsub_rn(to_float(x_p.v[v]), ch.mean[v]);
        float g = masked_grad<T, G>(to_float(dy_p.v[v]), xc, kFromY ? to_float(y_p.v[v]) : 0.f, ch.invstd[v],
                                         ch.weight[v], ch.bias[v], activation, negative_slope);
        sum_g[v] += g;
        sum_gx[v] += g * xc;
        g_p.v[v] = from_float<T>(g);
      }
      if (dz != nullptr) *reinterpret_cast<P*>(dz + offset) = g_p;
    };
    int64_t row = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
    // Four rows a step, all loads issued before any use: more bytes in flight per thread.
    constexpr int kUnroll = 4;
    for (; row + (kUnroll - 1) * step < rows; row += kUnroll * step) {
      P dy_p[kUnroll], x_p[kUnroll], y_p[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t offset = (row + u * step) * channels + column;
        dy_p[u] = *reinterpret_cast<const P*>(dy + offset);
        x_p[u] = *reinterpret_cast<const P*>(x + offset);
        if (kFromY) y_p[u] = *reinterpret_cast<const P*>(y + offset);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) process(dy_p[u], x_p[u], y_p[u], (row + u * step) * channels + column);
    }
    for (; row < rows; row += step) {
      const int64_t offset = row * channels + column;
      P y_p;
      if (kFromY) y_p = *reinterpret_cast<const P*>(y + offset);
      process(*reinterpret_cast<const P*>(dy + offset), *reinterpret_cast<const P*>(x + offset), y_p, offset);
    }
  }
  nhwc::write_block_partial<V>(sum_g, shared, partial, group, groups, channels);
  nhwc::write_block_partial<V>(sum_gx, shared, partial + static_cast<int64_t>(gridDim.y) * channels, group, groups,
                               channels);
}

template <typename T, int V, Gate G>
__global__ void __launch_bounds__(nhwc::kThreads, kBlocksPerMultiprocessor)
    batch_norm_act_backward_reduce(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                                   const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
                                   const float* __restrict__ weight, const float* __restrict__ bias,
                                   T* __restrict__ dz, float* __restrict__ partial, int64_t rows, int64_t channels,
                                   int activation, float negative_slope) {
  extern __shared__ float shared[];  // [V][blockDim.y][blockDim.x]
  reduce_rows<T, V, G>(dy, x, y, save_mean, save_invstd, weight, bias, dz, partial, rows, channels, activation,
                            negative_slope, shared);
}

// Pass 2, one block per 32 channels: dbias and dweight.
__global__ void batch_norm_act_backward_finalize(const float* __restrict__ partial, int parts,
                                                 const float* __restrict__ save_invstd, float* __restrict__ dweight,
                                                 float* __restrict__ dbias, int64_t channels) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const float sum_g = nhwc::sum_partials(partial, parts, channels, c);
  const float sum_gx = nhwc::sum_partials(partial + static_cast<int64_t>(parts) * channels, parts, channels, c);
  if (threadIdx.y == 0 && c < channels) {
    dbias[c] = sum_g;
    dweight[c] = sum_gx * save_invstd[c];
  }
}

// Pass 3: dx. g is read back from dz when pass 1 wrote it, else recomputed from dy (and y) as pass 1 did. The
// coefficients from pass 2's sums: dbias / M and invstd * dweight / M (= invstd^2 * sum(g xc) / M), with 1 / M from
// the host (with a division per channel in each thread, v1's dx kernels took 2.718 ms a step against 2.669). Each
// thread takes pass 1's rows (row0, row0 + step, ...) from its last back to row0.
// dweight and dbias are read through L2 (__ldcg): in the one-launch kernel other blocks wrote them in this launch.
template <typename T, int V, Gate G>
__device__ void dx_rows(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                        const T* __restrict__ dz, const float* __restrict__ save_mean,
                        const float* __restrict__ save_invstd, const float* __restrict__ weight,
                        const float* __restrict__ bias, const float* dweight, const float* dbias, float inverse_rows,
                        T* __restrict__ dx, int64_t rows, int64_t channels, int activation, float negative_slope) {
  constexpr bool kFromY = G == Gate::kMaskOfY;
  using P = Pack<T, V>;
  const int64_t groups = channels / V;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (group >= groups) return;
  const int64_t column = group * V;
  Channels<V> ch;
  ch.load(save_mean, save_invstd, weight, bias, column);
  float mean_g[V], slope[V], scale[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    mean_g[v] = __ldcg(dbias + column + v) * inverse_rows;
    slope[v] = __ldcg(dweight + column + v) * ch.invstd[v] * inverse_rows;
    scale[v] = ch.invstd[v] * ch.weight[v];
  }
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  auto process = [&](const P& dy_p, const P& x_p, const P& y_p, int64_t offset) {
    P dx_p;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      float xc = __fsub_rn(to_float(x_p.v[v]), ch.mean[v]);
      float g = dz != nullptr ? to_float(dy_p.v[v])
                              : masked_grad<T, G>(to_float(dy_p.v[v]), xc, kFromY ? to_float(y_p.v[v]) : 0.f,
                                                       ch.invstd[v], ch.weight[v], ch.bias[v], activation,
                                                       negative_slope);
      dx_p.v[v] = from_float<T>(scale[v] * (g - mean_g[v] - xc * slope[v]));
    }
    *reinterpret_cast<P*>(dx + offset) = dx_p;
  };
  // With dz, g is read from it (passed as dy below) and y is not needed.
  const T* g_source = dz != nullptr ? dz : dy;
  const bool read_y = kFromY && dz == nullptr;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  if (row0 >= rows) return;
  int64_t k = (rows - 1 - row0) / step;  // the thread's rows are row0 + k * step, k from here down to 0
  constexpr int kUnroll = 4;
  for (; k >= kUnroll - 1; k -= kUnroll) {
    P dy_p[kUnroll], x_p[kUnroll], y_p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t offset = (row0 + (k - u) * step) * channels + column;
      dy_p[u] = *reinterpret_cast<const P*>(g_source + offset);
      x_p[u] = *reinterpret_cast<const P*>(x + offset);
      if (read_y) y_p[u] = *reinterpret_cast<const P*>(y + offset);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) process(dy_p[u], x_p[u], y_p[u], (row0 + (k - u) * step) * channels + column);
  }
  for (; k >= 0; --k) {
    const int64_t offset = (row0 + k * step) * channels + column;
    P y_p;
    if (read_y) y_p = *reinterpret_cast<const P*>(y + offset);
    process(*reinterpret_cast<const P*>(g_source + offset), *reinterpret_cast<const P*>(x + offset), y_p, offset);
  }
}

template <typename T, int V, Gate G>
__global__ void __launch_bounds__(nhwc::kThreads, kBlocksPerMultiprocessor)
    batch_norm_act_backward_dx(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                               const T* __restrict__ dz, const float* __restrict__ save_mean,
                               const float* __restrict__ save_invstd, const float* __restrict__ weight,
                               const float* __restrict__ bias, const float* __restrict__ dweight,
                               const float* __restrict__ dbias, float inverse_rows, T* __restrict__ dx, int64_t rows,
                               int64_t channels, int activation, float negative_slope) {
  dx_rows<T, V, G>(dy, x, y, dz, save_mean, save_invstd, weight, bias, dweight, dbias, inverse_rows, dx, rows,
                        channels, activation, negative_slope);
}

// Pass 2 inside the one-launch kernel: the blocks share out tiles of 8 channels; in each, 32 lanes add the partial
// rows p = lane, lane + 32, ... and lane 0 adds the lanes' sums in order, as batch_norm_act_backward_finalize's
// nhwc::sum_partials does: the two give the same bits. Partial sums are read through L2 (other blocks wrote them in
// this launch). `shared` holds 32 * 16 floats.
__device__ void finalize_tiles(const float* partial, int parts, const float* __restrict__ save_invstd,
                               float* dweight, float* dbias, int64_t channels, float* shared) {
  constexpr int kTileChannels = 8, kLanes = 32, kPairs = kTileChannels * kLanes;
  const int threads = blockDim.x * blockDim.y;
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  const int64_t blocks = static_cast<int64_t>(gridDim.x) * gridDim.y;
  const int64_t block = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
  const float* partial_gx = partial + static_cast<int64_t>(parts) * channels;
  for (int64_t tile = block; tile * kTileChannels < channels; tile += blocks) {
    for (int pair = thread; pair < kPairs; pair += threads) {  // a block may have fewer than 256 threads
      const int lane = pair / kTileChannels, slot = pair % kTileChannels;
      const int64_t c = tile * kTileChannels + slot;
      float sum_g = 0.f, sum_gx = 0.f;
      if (c < channels) {
        for (int p = lane; p < parts; p += kLanes) {
          sum_g += __ldcg(partial + static_cast<int64_t>(p) * channels + c);
          sum_gx += __ldcg(partial_gx + static_cast<int64_t>(p) * channels + c);
        }
      }
      shared[lane * 2 * kTileChannels + slot] = sum_g;
      shared[lane * 2 * kTileChannels + kTileChannels + slot] = sum_gx;
    }
    __syncthreads();
    const int64_t c = tile * kTileChannels + thread;
    if (thread < kTileChannels && c < channels) {
      float sum_g = 0.f, sum_gx = 0.f;
      for (int r = 0; r < kLanes; ++r) {
        sum_g += shared[r * 2 * kTileChannels + thread];
        sum_gx += shared[r * 2 * kTileChannels + kTileChannels + thread];
      }
      dbias[c] = sum_g;
      dweight[c] = sum_gx * save_invstd[c];
    }
    __syncthreads();  // `shared` is rewritten for the next tile
  }
}

// The three passes (or, without dx, the first two) in one cooperative launch: a grid-wide barrier after the partial
// sums and another after dweight and dbias. Each barrier costs about what the launch gap it replaces does (about
// 1.5 us against 1.7 on H100): MobileNet v1's 27 shapes back to back took 4.84 ms against 4.88 as three launches (a
// scratch harness, docs/benchmarks.md), and a step issues 54 launches fewer. The launch shape and the walks over the
// rows are the separate kernels', so the L2 reuse between the first and last pass stays.
template <typename T, int V, Gate G>
__global__ void __launch_bounds__(nhwc::kThreads, kBlocksPerMultiprocessor)
    batch_norm_act_backward_one_launch(const T* __restrict__ dy, const T* __restrict__ x, const T* __restrict__ y,
                                       const float* __restrict__ save_mean, const float* __restrict__ save_invstd,
                                       const float* __restrict__ weight, const float* __restrict__ bias,
                                       T* __restrict__ dz, float* partial, float* dweight, float* dbias,
                                       float inverse_rows, T* __restrict__ dx, int64_t rows, int64_t channels,
                                       int activation, float negative_slope, bool with_dx) {
  extern __shared__ float shared[];  // max(blockDim.y * blockDim.x * V, 32 * 16) floats
  auto grid = cooperative_groups::this_grid();
  reduce_rows<T, V, G>(dy, x, y, save_mean, save_invstd, weight, bias, dz, partial, rows, channels, activation,
                            negative_slope, shared);
  grid.sync();
  finalize_tiles(partial, static_cast<int>(gridDim.y), save_invstd, dweight, dbias, channels, shared);
  if (!with_dx) return;
  grid.sync();
  dx_rows<T, V, G>(dy, x, y, dz, save_mean, save_invstd, weight, bias, dweight, dbias, inverse_rows, dx, rows,
                        channels, activation, negative_slope);
}

constexpr int kFinalizeSharedFloats = 32 * 16;

template <typename T, int V, Gate G>
cudaError_t launch_passes(const BatchNormActBackwardArgs& a, int multiprocessors, cudaStream_t stream) {
  auto shape = nhwc::row_launch(a.rows, a.channels, V, multiprocessors, kBlocksPerMultiprocessor);
  const T* dy = static_cast<const T*>(a.dy);
  const T* x = static_cast<const T*>(a.x);
  const T* y = static_cast<const T*>(a.y);
  T* dz = static_cast<T*>(a.dz);
  const float inverse_rows = 1.0f / static_cast<float>(a.rows);
  // Not where dx reads back a dz that the first pass wrote in this launch: dz may be dy itself, whose first reads
  // this multiprocessor's L1 may still hold.
  const bool one_launch = a.passes == kBackwardReduce || (a.passes == kBackwardAllPasses && a.dz == nullptr);
  // the occupancy at the largest shared memory a launch of this instantiation uses, once per device
  static PerDevice occupancy;
  const auto shared_floats = [](size_t threads) { return std::max<size_t>(threads * V, kFinalizeSharedFloats); };
  const auto kernel = batch_norm_act_backward_one_launch<T, V, G>;
  if (one_launch && nhwc::cooperative_grid_fits(kernel, shared_floats(nhwc::kThreads) * sizeof(float), shape.grid,
                                                multiprocessors, occupancy)) {
    const cudaError_t status = nhwc::launch_cooperative(
        kernel, shape, shared_floats(shape.block.x * shape.block.y) * sizeof(float), stream, dy, x, y, a.save_mean,
        a.save_invstd, a.weight, a.bias, dz, a.partial, a.dweight, a.dbias, inverse_rows, static_cast<T*>(a.dx),
        a.rows, a.channels, a.activation, a.negative_slope, a.passes == kBackwardAllPasses);
    if (status != cudaErrorCooperativeLaunchTooLarge) return status;  // else three launches
  }
  if (a.passes != kBackwardDx) {
    size_t shared_bytes = static_cast<size_t>(shape.block.x) * V * shape.block.y * sizeof(float);
    batch_norm_act_backward_reduce<T, V, G><<<shape.grid, shape.block, shared_bytes, stream>>>(
        dy, x, y, a.save_mean, a.save_invstd, a.weight, a.bias, dz, a.partial, a.rows, a.channels, a.activation,
        a.negative_slope);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    batch_norm_act_backward_finalize<<<static_cast<unsigned>((a.channels + 31) / 32), dim3(32, 32), 0, stream>>>(
        a.partial, static_cast<int>(shape.grid.y), a.save_invstd, a.dweight, a.dbias, a.channels);
    status = cudaGetLastError();
    if (status != cudaSuccess || a.passes == kBackwardReduce) return status;
  }
  batch_norm_act_backward_dx<T, V, G><<<shape.grid, shape.block, 0, stream>>>(
      dy, x, y, dz, a.save_mean, a.save_invstd, a.weight, a.bias, a.dweight, a.dbias, inverse_rows,
      static_cast<T*>(a.dx), a.rows, a.channels, a.activation, a.negative_slope);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const BatchNormActBackwardArgs& a, bool vectors, int multiprocessors,
                         cudaStream_t stream) {
  constexpr int kVec = nhwc::Vec<T>::kSize;
  const auto by_vectors = [&](auto gate) {
    return vectors ? launch_passes<T, kVec, decltype(gate)::value>(a, multiprocessors, stream)
                   : launch_passes<T, 1, decltype(gate)::value>(a, multiprocessors, stream);
  };
  if (a.y != nullptr) return by_vectors(std::integral_constant<Gate, Gate::kMaskOfY>{});
  if (a.activation == kActivationRelu || a.activation == kActivationRelu6) {
    return by_vectors(std::integral_constant<Gate, Gate::kMaskOfPre>{});
  }
  if (a.activation == kActivationLeakyRelu) return by_vectors(std::integral_constant<Gate, Gate::kLeaky>{});
  return by_vectors(std::integral_constant<Gate, Gate::kDerivative>{});
}

}  // namespace

int64_t batch_norm_act_backward_partial_rows(int64_t rows, int64_t channels, bool vectors, int element_bytes,
                                             int multiprocessors) {
  return nhwc::two_sum_partial_rows(rows, channels, vectors, element_bytes, multiprocessors, kBlocksPerMultiprocessor);
}

cudaError_t launch_batch_norm_act_backward_nhwc(ElementType type, const BatchNormActBackwardArgs& args, bool vectors,
                                                int multiprocessors, cudaStream_t stream) {
  // masked_grad takes any code but ReLU's, ReLU6's and LeakyReLU's for SiLU or Hardswish: no activation has no kernel
  // here (the ops run BatchNorm's backward alone for it)
  if (args.activation < kActivationRelu || args.activation > kActivationLeakyRelu) return cudaErrorInvalidValue;
  // y (a residual added before the activation) with ReLU or ReLU6 only: the others' gate is taken at the
  // pre-activation, which y is not (the ops refuse a residual with them)
  const bool mask = args.activation == kActivationRelu || args.activation == kActivationRelu6;
  if (args.y != nullptr && !mask) return cudaErrorInvalidValue;
  return nhwc::by_element_type(type, [&](auto element) {
    return launch_typed<decltype(element)>(args, vectors, multiprocessors, stream);
  });
}

}  // namespace tcf
