// Depthwise convolution (one filter per channel, K x K (K = 3 instantiated), stride S, dilation 1) on dense NHWC
// tensors.
//
// Each thread takes V consecutive channels (one 16-byte access, or one element) of a strip of kStrip outputs along W:
// it loads each input column of a kernel row once and adds it to every output of the strip that reads it, so the
// strip shares its overlapping windows in registers; neighbouring strips and rows share theirs through L1. The
// block's filters are staged in shared memory as float ([K*K][channels of the block]).
//   forward: y[n, oh, ow, c] = act(sum_{kh,kw} x[n, oh*S - pad_h + kh, ow*S - pad_w + kw, c] * w[c, kh, kw]
//                                  + bias[c] + residual[n, oh, ow, c]), summed in float, rounded once.
//   dgrad:   dx[n, ih, iw, c] = sum over the (oh, kh) with oh*S + kh = ih + pad_h (and the same along W) of
//            dy[n, oh, ow, c] * w[c, kh, kw]. With ih + pad_h = th*S + rh, the taps are kh = rh + S*dh at oh = th - dh:
//            a block takes one class (rh, rw) (blockIdx.z), so that which taps a thread uses is the same across the
//            block and the strip's columns share their loads as in the forward.
// With 16-byte vectors the forward, and the stride-1 dgrad as that forward with the filter turned, walk down columns
// instead (depthwise_conv_forward_walk): a thread walks a band of output rows, each input row copied into shared
// memory of its own 2 rows ahead of its use; the stride-2 dgrad walks the same way down dy's rows, writing two dx rows
// a step (depthwise_conv_dgrad_walk). The strip kernels above stay for one element at a time, filters or bias not on
// a vector boundary and images too large for 32-bit sizes. Before the walks, the stride-2 forward and dgrad staged a
// tile of their input in shared memory per block (1.13-1.81x and 2.10-2.83x their bytes' time, against 1.06-1.58x
// and 1.11-1.51x for the walks on the same layers).
// wgrad (depthwise_conv_wgrad_walk) walks as the forward does, with a dy row beside each step's input rows, and keeps
// each channel's 9 taps' sums in registers across a thread's bands; they are added in a fixed order across threads,
// blocks and parts: deterministic. On small images (the 14 x 14 layers at stride 1, and the 28 x 28 ones at stride 2)
// depthwise_conv_wgrad_tile runs instead: tensor copies of whole bands into shared memory by one thread, read by warps
// of output rows; on 7 x 7 images at stride 1 and 14 x 14 ones at stride 2, depthwise_conv_wgrad_plane: a thread
// walks an image's rows of a few channels in registers (the wgrad's plans 1 and 2, timed under cudnn.benchmark, run a
// walk shaped as before and the small-image kernel plan 0 passes over: wgrad_walk_plan_for). Before the tile, a
// stride-2 kernel with tiles of dy and x staged in shared memory (1.56-2.37x its bytes' time), a stride-1 kernel with
// the three input rows in registers (255 of them, no prefetch: 1.55-2.69x) and two that read global memory directly
// (per-thread sums of a strip's taps; a thread per channel vector walking an output row with the 3x3 window in
// registers, 2026-11-23 and -24, 1.2-26x slower than PyTorch's) were not kept.
#include "kernels/depthwise_conv_kernel.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "core/device.h"
#include "kernels/nhwc_rows.cuh"

namespace tcf {
namespace {

using nhwc::from_float;
using nhwc::Pack;
using nhwc::to_float;

constexpr int kStrip = 4;  // outputs along W per thread

template <typename T>
constexpr int vector_size() {
  return 16 / static_cast<int>(sizeof(T));
}

// A pack's elements as float. A bfloat16 is a float's high half: each 32-bit word of the pack gives its even element
// by a shift and its odd one by a mask, one instruction each (the conversion intrinsic takes two for the odd one).
template <typename T, int V>
__device__ inline void unpack(const Pack<T, V> pack, float (&out)[V]) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value && V % 2 == 0) {
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      unsigned word;
      memcpy(&word, &pack.v[2 * k], sizeof(word));
      out[2 * k] = __uint_as_float(word << 16);
      out[2 * k + 1] = __uint_as_float(word & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = to_float(pack.v[v]);
  }
}

template <typename T, int V>
__device__ inline void load(const T* __restrict__ p, float (&out)[V]) {
  unpack<T, V>(*reinterpret_cast<const Pack<T, V>*>(p), out);
}

// V elements from p as float, or zeros where p is null (an absent bias or residual).
template <typename T, int V>
__device__ inline void load_or_zero(const T* __restrict__ p, float (&out)[V]) {
  if (p != nullptr) {
    load<T, V>(p, out);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = 0.f;
  }
}

template <int N, int V>
__device__ inline void zero(float (&values)[N][V]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int v = 0; v < V; ++v) values[i][v] = 0.f;
}

__device__ inline float activate(float v, int activation) {
  // comparisons rather than fmaxf, so that NaN passes as through F.relu
  if (activation == kActivationRelu) return v < 0.f ? 0.f : v;
  if (activation == kActivationRelu6) return v < 0.f ? 0.f : (v > 6.f ? 6.f : v);
  return v;
}

// The forward's epilogue for one output vector: y[offset ...] = act(acc + bias + residual[offset ...]), rounded once
// (`residual` may be null).
template <typename T, int V>
__device__ inline void store_forward(const float (&acc)[V], const float (&bias)[V], const T* __restrict__ residual,
                                     T* __restrict__ y, int64_t offset, int activation) {
  float r[V];
  load_or_zero<T, V>(residual != nullptr ? residual + offset : nullptr, r);
  Pack<T, V> out;
#pragma unroll
  for (int v = 0; v < V; ++v) out.v[v] = from_float<T>(activate(acc[v] + bias[v] + r[v], activation));
  *reinterpret_cast<Pack<T, V>*>(y + offset) = out;
}

// The forward's epilogue for a thread's strip: y at row offset `base` (the strip's row, channel c), columns ow0 ...
// ow0 + kStrip - 1 below out_w.
template <typename T, int V>
__device__ inline void store_forward_strip(const float (&acc)[kStrip][V], const T* __restrict__ bias,
                                           const T* __restrict__ residual, T* __restrict__ y, int64_t base, int64_t c,
                                           int ow0, int64_t out_w, int64_t channels, int activation) {
  float b[V];
#pragma unroll
  for (int v = 0; v < V; ++v) b[v] = bias != nullptr ? to_float(bias[c + v]) : 0.f;
#pragma unroll
  for (int i = 0; i < kStrip; ++i) {
    const int ow = ow0 + i;
    if (ow >= out_w) break;
    store_forward<T, V>(acc[i], b, residual, y, base + static_cast<int64_t>(ow) * channels, activation);
  }
}

// The block's filters ([channels, K*K] in memory) as float in shared memory, [K*K][width], width = blockDim.x * V.
template <typename T, int K>
__device__ inline void stage_filters(const T* __restrict__ w, float* w_s, int64_t c0, int width, int64_t channels) {
  const int threads = blockDim.x * blockDim.y;
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < K * K * width; i += threads) {
    const int local = i / (K * K);
    const int tap = i - local * (K * K);
    const int64_t c = c0 + local;
    w_s[tap * width + local] = c < channels ? to_float(w[c * K * K + tap]) : 0.f;
  }
  __syncthreads();
}

// A thread's strip: image n, row `row` (< rows: else no work), first column `column0` (a multiple of kStrip).
struct Strip {
  int64_t n;
  int row;
  int column0;
};

// Position p of p < n * ceil(rows / band) * strips * band, ordered so that `band` consecutive positions are the rows
// of one band at one strip column: a block's threads (consecutive positions) cover a tile of band rows x
// blockDim.y / band strips, whose overlapping input windows, across rows as along them, meet in L1.
__device__ inline Strip strip_at(int64_t p, int rows, int64_t strips, int band) {
  const int r = static_cast<int>(p % band);
  p /= band;
  const int64_t strip = p % strips;
  p /= strips;
  const int64_t bands = (rows + band - 1) / band;
  return {p / bands, static_cast<int>(p % bands) * band + r, static_cast<int>(strip) * kStrip};
}

inline __host__ __device__ int64_t strip_positions(int64_t n, int64_t rows, int64_t strips, int band) {
  return n * ((rows + band - 1) / band) * band * strips;
}

template <typename T, int V, int K, int S>
__global__ void __launch_bounds__(nhwc::kThreads) depthwise_conv_forward(
    const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, const T* __restrict__ residual,
    T* __restrict__ y, DepthwiseShape s, int activation, int band) {
  extern __shared__ float w_s[];
  const int width = blockDim.x * V;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * width;
  stage_filters<T, K>(w, w_s, c0, width, s.channels);
  const int64_t c = c0 + threadIdx.x * V;
  const int64_t strips = (s.out_w + kStrip - 1) / kStrip;
  const Strip at = strip_at(static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y, s.out_h, strips, band);
  if (c >= s.channels || at.n >= s.n || at.row >= s.out_h) return;
  const int64_t n = at.n;
  const int oh = at.row;
  const int ow0 = at.column0;
  const int64_t row = n * s.out_h + oh;
  const int iw0 = ow0 * S - s.pad_w;
  const float* filters = w_s + threadIdx.x * V;

  float acc[kStrip][V];
  zero(acc);
#pragma unroll
  for (int kh = 0; kh < K; ++kh) {
    const int ih = oh * S - s.pad_h + kh;
    if (ih < 0 || ih >= s.h) continue;
    float wr[K][V];
#pragma unroll
    for (int kw = 0; kw < K; ++kw)
#pragma unroll
      for (int v = 0; v < V; ++v) wr[kw][v] = filters[(kh * K + kw) * width + v];
    const T* in = x + ((n * s.h + ih) * s.w) * s.channels + c;
    constexpr int kColumns = (kStrip - 1) * S + K;
#pragma unroll
    for (int e = 0; e < kColumns; ++e) {
      const int iw = iw0 + e;
      if (iw < 0 || iw >= s.w) continue;
      float xv[V];
      load<T, V>(in + static_cast<int64_t>(iw) * s.channels, xv);
#pragma unroll
      for (int i = 0; i < kStrip; ++i) {
        const int kw = e - i * S;
        if (kw >= 0 && kw < K) {
#pragma unroll
          for (int v = 0; v < V; ++v) acc[i][v] = fmaf(xv[v], wr[kw][v], acc[i][v]);
        }
      }
    }
  }
  store_forward_strip<T, V>(acc, bias, residual, y, row * s.out_w * s.channels + c, c, ow0, s.out_w, s.channels,
                            activation);
}

// The 3x3 forward at stride S (1 or 2) for vectors of kWalkVector channels ("walk"): a thread takes kWalkVector
// channels of kWalkColumns output columns and walks a band of output rows of one image, one input row a step. Each
// step it adds the row's S * kWalkColumns + 3 - S vectors, converted to float once, to the output rows that read it:
// at stride 1 to three (accumulators that rotate: kh = 0 to the newest, 1, then 2 to the oldest, which is then
// complete and stored), at stride 2 an even row to two (kh = 2 to the previous output row, then stored, kh = 0 to the
// current one) and an odd row to one (kh = 1). Each output adds its taps row by row, kw within a row, as
// depthwise_conv_forward does: the two give the same numbers.
// Its input rows are copied kWalkAhead rows ahead of their use into slots of shared memory of its own with
// asynchronous copies (zeros outside the image); a thread reads back only what it copied, so no barrier is needed,
// and many more bytes are in flight per multiprocessor than registers could hold. With the filter turned 180 degrees
// (Turned) it is the stride-1 dgrad: dx is the forward of dy, padded kernel - 1 - padding.
// Why this shape (a scratch harness, H200, batch 256, bf16, the ten stride-1 layers of MobileNet v1 and v2, 2026-11-26;
// Nsight Compute on v1's 32- and 128-channel layers): the ring kernel it replaced (input rows staged per block, one
// barrier per row, each row converted three times) ran 1.95-2.9x its bytes' time, bound by L2 (85%) at 43% of DRAM's
// bandwidth; the rows kernel (8 output rows in registers, no prefetch) by latency at 29%; cuDNN's plain forward was at
// 47%. The same walk with loads into registers one or two rows ahead reached 37-40% of DRAM, with 4 to 6 rows in
// shared memory 55%, and with 7 and fewer instructions (ReLU as one max, no branches around the row adds, pointers
// advanced a row a step, 32-bit sizes) 1.2-1.3x its bytes' time on the three largest layers. Of the shapes tried,
// 4 columns x 4 channels beat 2 x 4, 2 x 8 and 1 x 8; with 4 blocks a multiprocessor (at most 128 registers, no
// spills) the ten layers' forwards took 0.698 ms against 0.723 with 3 and 0.752 with bands of 16 rows, and cuDNN's
// plain forwards 0.893. Copying 6 rows ahead rather than 7, so that no slot is refilled the step after it was read,
// took 0.689 against 0.695 ms in one later run. In another, 4 slots 2 rows ahead took 0.667 ms against 0.691 with 8
// slots 6 ahead, less on each of the ten layers (a guess at why: 24 rather than 48 KB of shared memory a block leave
// more of each multiprocessor's 256 KB to L1, where neighbouring strips meet); 7 columns a thread (3 blocks a
// multiprocessor) 0.660, faster on the 14 x 14 and 7 x 7 layers but slower on v1's 256-channel 28 x 28 one (0.0752
// against 0.0635 ms: 1.3 waves of blocks), and bands of 16 rows 0.664. At stride 2 (the eight stride-2 layers of v1
// and v2, 2026-11-26): 0.588 ms for the plain forwards, 1.06-1.58x their bytes' time, against 0.743 for the tiled
// kernel it replaced (the same bits) and 0.786 for cuDNN's; bands of 8 rows 0.583, of 32 0.600.
// On the small layers the walk is bound by instructions, not bytes (Nsight Compute, 2026-11-26, v1's 1024-channel
// 7 x 7 layer): 0.69 instructions issued a cycle of each scheduler's 1, 3.5 warps resident (registers), 25% of DRAM's
// bandwidth; about 400 instructions a step, of which 144 are the taps' FMAs. Since then a row's copies step one
// pointer and test one predicate a column (copy_row_async; the address select went), a bfloat16 pair unpacks in two
// instructions, not three, the residual is tested once a row, padding rows are neither copied nor read (a padding
// row's output starts from zeros), and the bands are chosen per shape (forward_walk_band): the same values, and on the
// 18 layers of bench_depthwise (bf16, results *_2026-11-26i and -k) 1.02-1.68x the bytes' time for the forward with
// bias and ReLU, against 1.09-2.17x before (14 x 14 and 7 x 7: 1.33-1.68x against 1.42-2.17x). A tile of a whole
// image (or band of rows) per block, copied at once and then walked from shared memory (a scratch harness, the ten
// layers up to 28 x 28 output), was slower on every one: 1.96-3.14x the bytes' time at its best split, against
// 1.15-2.12x for the walk then. A barrier stands between its copies and its compute, and a thread's filter loads and
// start spread over fewer rows.
// Not kept either (H100, bf16, 2026-11-28, each against this walk in the same device call; the patches and tables in
// benchmarks/results/depthwise_walk_variants_*2026-11-28u*): 7 columns a thread on the 7- and 14-wide outputs (3
// blocks a multiprocessor) took v1's 1024-channel 7 x 7 forward from 1.21 to 1.30x the bytes' time and moved the
// other such layers by -0.02 to +0.03; blocks of 16 channel vectors by several strips, so that neighbouring strips'
// input columns meet in L1, were 0.02-0.25 slower on every layer (L1's hit rate 37-44% -> 32-39%); the stride-1 walk
// unrolled whole with its band of 7 compiled in and no adds into rows outside the band issued 5-11% fewer
// instructions in about the same time on the small layers, and took v1's 32-channel 112 x 112 forward from 1.07 to
// 1.21 and v2's 144-channel 56 x 56 one from 1.10 to 1.27. On the H100 (Nsight Compute) this walk's 7 x 7 and 14 x 14
// forwards run at 47-66% of DRAM's bandwidth and 70-77% of L2's throughput, with 61-66% of issue slots used by about
// 14 resident warps of 64. More warps with less work a thread were slower (H100, bf16, 2026-11-28, the same bits;
// benchmarks/results/depthwise_walk_occupancy_*): 2 columns x 4 channels at 5 blocks a multiprocessor (95 registers),
// 4 x 2 at 6 and 2 x 2 at 8 took v1's 1024-channel 7 x 7 forward from 1.21 to 1.43, 1.48 and 1.62x the bytes' time
// and each stride-1 forward, plain forward and dgrad up by 0.03-0.42 (not profiled; a guess at why: more copies and
// index arithmetic a byte, and fewer input columns shared in registers).
constexpr int kWalkVector = 4;    // channels a thread: 8 bytes in 16-bit types, 16 in float
constexpr int kWalkColumns = 4;   // output columns a thread
constexpr int kWalkSlots = 4;     // input rows a thread holds in shared memory: the one in use and up to 2 in flight
constexpr int kWalkAhead = 2;     // a slot is refilled two steps after it was read, never the step after
constexpr int kWalkThreads = 128;   // 4 blocks a multiprocessor (__launch_bounds__)

template <int Bytes>
__device__ inline void copy_async_or_zero(void* shared, const void* global, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(address), "l"(global), "n"(Bytes),
               "r"(valid ? Bytes : 0));
#else
  struct alignas(Bytes) Chunk { unsigned char b[Bytes]; };
  *reinterpret_cast<Chunk*>(shared) = valid ? *reinterpret_cast<const Chunk*>(global) : Chunk{};
#endif
}

// Copies N columns of a row (column j at src + j * C) into a thread's slot (column j at slot + j * kWalkThreads), zeros
// where not (row_inside and column_inside[j]). A copy left out reads nothing (its source size is 0), so src + j * C may
// lie outside the tensor there, as the source of CUTLASS's zero-filling copies for a convolution's padding does.
// compute-sanitizer's memcheck (2026-11-26, H100, PyTorch's caching allocator off so that each tensor is an
// allocation of its own) found no access outside a tensor in the four depthwise ops on one- to three-image shapes
// with padding 0-3 at both strides, in the three types; synccheck found no hazard.
template <int N, typename P, typename T>
__device__ inline void copy_row_async(P* slot, const T* src, int C, bool row_inside, const bool (&column_inside)[N]) {
#pragma unroll
  for (int j = 0; j < N; ++j, src += C) {
    copy_async_or_zero<sizeof(P)>(slot + j * kWalkThreads, src, row_inside && column_inside[j]);
  }
}

// Closes the thread's commit group: the copies issued since the last one.
__device__ inline void commit_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until the thread's copies have landed but for the newest Pending commit groups.
template <int Pending>
__device__ inline void wait_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
#endif
}

// Programmatic dependent launch (compute capability 9.0 and above; no-ops below, and where the next kernel was not
// launched as a dependent): a grid lets its dependent start launching (its blocks may then be scheduled while this
// grid finishes), and the dependent waits until the grid before it has completed, its writes visible, before it reads
// them.
__device__ inline void let_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ inline void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// The N columns of a thread's slot (column j at slot[j * kWalkThreads]) as float.
template <int N, typename P, int V>
__device__ inline void unpack_slot(const P* slot, float (&out)[N][V]) {
#pragma unroll
  for (int j = 0; j < N; ++j) unpack(slot[j * kWalkThreads], out[j]);
}

// The activation as one NaN-propagating max (and min): NaN passes as through F.relu, and -0 becomes +0 as there.
template <int Activation>
__device__ inline float activate_fast(float v) {
  if constexpr (Activation == kActivationNone) {
    return v;
  } else {
    float r;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(v));
    if constexpr (Activation == kActivationRelu6) asm("min.NaN.f32 %0, %0, 0f40C00000;" : "+f"(r));
    return r;
  }
}

// acc[j] (+)= the taps (kh, 0 ... 2) of input row xv read by output column j: columns j * S + kw (from 0 where first).
template <int S, int CW, int COLS, int V>
__device__ inline void add_walk_row(const float (&xv)[COLS][V], const float (&wr)[9][V], int kh, float (&acc)[CW][V],
                                    bool first) {
#pragma unroll
  for (int j = 0; j < CW; ++j)
#pragma unroll
    for (int kw = 0; kw < 3; ++kw)
#pragma unroll
      for (int v = 0; v < V; ++v)
        acc[j][v] = fmaf(xv[j * S + kw][v], wr[kh * 3 + kw][v], first && kw == 0 ? 0.f : acc[j][v]);
}

// The V filters of channels c ... c + V - 1 (9 * V consecutive elements from w + c * 9) as float, tap k of the filter
// at wr[Turned ? 8 - k : k]: read as 9 vectors of V (c * 9 elements is a multiple of a vector's bytes, and the caller
// checks that w starts on 16 bytes), each element converted on its own.
// 9 vector loads rather than 36 element loads (a scratch harness, H100, bf16, batch 256, 2026-11-26; x the bytes'
// time): the forward with bias and ReLU 1.30-1.31 -> 1.20-1.23 on v1's 1024-channel 7 x 7 layer, 1.36-1.38 ->
// 1.26-1.27 on v2's 960-channel one and 1.35 -> 1.30 on v2's 384-channel 14 x 14 one (five runs each); the
// stride-1 dgrads 0.02-0.08 less on those three and the others within 0.01 (one run of the 18 layers), but v2's
// 576-channel 14 x 14 layer, 0.01 slower. Each element converted on its own: unpacked as pairs (unpack), the walk
// took 128 registers, not 122, and on that 576-channel layer issued 22.1 rather than 21.2 million instructions and
// ran 1.35 against 1.30x. The stride-2 dgrad walk the same way (three runs, bf16 twice and fp16): 1.29 -> 1.22-1.23
// on v2's 576-channel 14 x 14 layer, 1.24-1.26 -> 1.20 on v1's 512-channel one, 1.22-1.24 -> 1.19-1.20 on v2's
// 192-channel 28 x 28 one, the others within 0.02.
template <bool Turned, typename T, int V>
__device__ inline void load_filters(const T* __restrict__ w, int c, float (&wr)[9][V]) {
#pragma unroll
  for (int m = 0; m < 9; ++m) {
    const Pack<T, V> filters = reinterpret_cast<const Pack<T, V>*>(w + c * 9)[m];
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int k = m * V + q;
      wr[Turned ? 8 - k % 9 : k % 9][k / 9] = to_float(filters.v[q]);
    }
  }
}

// Input columns a walk step reads for CW outputs at stride S (the forward's and the wgrad's walks).
template <int S, int CW = kWalkColumns>
__host__ __device__ constexpr int walk_columns() {
  return S * CW + 3 - S;
}

template <typename T, int S, int Activation, bool Bias, bool Turned>
__global__ void __launch_bounds__(kWalkThreads, 4) depthwise_conv_forward_walk(
    const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ bias, const T* __restrict__ residual,
    T* __restrict__ y, DepthwiseShape s, int band, int64_t threads) {
  constexpr int V = kWalkVector, CW = kWalkColumns, COLS = walk_columns<S>(), SLOTS = kWalkSlots;
  static_assert((SLOTS & (SLOTS - 1)) == 0, "slots: a power of two");
  static_assert(kWalkAhead + 2 <= SLOTS, "a slot is refilled no sooner than two steps after it was read");
  static_assert(S == 1 || !Turned, "the turned filter is the stride-1 dgrad");
  using P = Pack<T, V>;
  extern __shared__ __align__(16) unsigned char shared[];
  P* mine = reinterpret_cast<P*>(shared) + threadIdx.x;  // slot k, column j: mine[(k * COLS + j) * kWalkThreads]
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWalkThreads + threadIdx.x;
  if (i >= threads) return;
  // 32-bit sizes within an image (the launch checks that an image's elements fit): fewer instructions a step
  const int C = static_cast<int>(s.channels), H = static_cast<int>(s.h), W = static_cast<int>(s.w);
  const int out_h = static_cast<int>(s.out_h), out_w = static_cast<int>(s.out_w);
  const int groups = C / V, strips = (out_w + CW - 1) / CW, bands = (out_h + band - 1) / band;
  const int c = static_cast<int>(i % groups) * V;
  int64_t t = i / groups;
  const int ow0 = static_cast<int>(t % strips) * CW;
  t /= strips;
  const int oh0 = static_cast<int>(t % bands) * band;
  const int64_t n = t / bands;
  const int rows = min(band, out_h - oh0);
  const int steps = S * rows + 3 - S;  // input rows oh0 * S - pad_h ... (+ steps - 1)
  const int iw0 = ow0 * S - s.pad_w;
  bool column_inside[COLS];
#pragma unroll
  for (int j = 0; j < COLS; ++j) column_inside[j] = iw0 + j >= 0 && iw0 + j < W;
  const int in_row = W * C, out_row = out_w * C;
  // row e of the walk at src + e * in_row, column j at + j * C (outside the tensor where not inside)
  const T* src = x + ((n * H + oh0 * S - s.pad_h) * W + iw0) * static_cast<int64_t>(C) + c;
  T* dst = y + ((n * out_h + oh0) * out_w + ow0) * static_cast<int64_t>(C) + c;
  const T* res = residual != nullptr ? residual + (dst - y) : nullptr;
  // input rows e_lo ... e_hi - 1 of the walk are inside the image; the others are padding, never copied or read
  const int e_lo = max(0, s.pad_h - oh0 * S), e_hi = min(steps, H - (oh0 * S - s.pad_h));
  int issued = 0;
  auto issue = [&]() {  // the next row into its slot; one commit group each, empty for padding and past the last row
    if (issued >= e_lo && issued < e_hi) {
      copy_row_async(mine + (issued & (SLOTS - 1)) * COLS * kWalkThreads, src, C, true, column_inside);
    }
    src += in_row;
    ++issued;
    commit_copies();
  };
#pragma unroll
  for (int e = 0; e < kWalkAhead; ++e) issue();
  // the V filters; turned: tap k of the filter is tap 8 - k here
  float wr[9][V], b[V];
  load_filters<Turned>(w, c, wr);
#pragma unroll
  for (int v = 0; v < V; ++v) b[v] = Bias ? to_float(bias[c + v]) : 0.f;

  // issues the next row; input row e of the walk as float once it has landed, or false for padding (xv not set)
  auto row = [&](int e, float (&xv)[COLS][V]) -> bool {
    issue();
    if (e < e_lo || e >= e_hi) return false;
    wait_copies<kWalkAhead>();  // row e has landed
    unpack_slot(mine + (e & (SLOTS - 1)) * COLS * kWalkThreads, xv);
    return true;
  };
  auto store = [&](const float (&acc)[CW][V]) {  // the next output row: act(acc + bias + residual)
    auto columns = [&](auto with_residual) {  // the residual tested once a row, not once a column
      T* out = dst;
      const T* r_in = res;
#pragma unroll
      for (int j = 0; j < CW; ++j, out += C) {
        if (ow0 + j < out_w) {
          float sum[V];
#pragma unroll
          for (int v = 0; v < V; ++v) sum[v] = Bias ? acc[j][v] + b[v] : acc[j][v];
          if constexpr (decltype(with_residual)::value) {  // added after the bias, as depthwise_conv_forward adds it
            float r[V];
            load<T, V>(r_in + j * C, r);
#pragma unroll
            for (int v = 0; v < V; ++v) sum[v] += r[v];
          }
          P packed;
#pragma unroll
          for (int v = 0; v < V; ++v) packed.v[v] = from_float<T>(activate_fast<Activation>(sum[v]));
          *reinterpret_cast<P*>(out) = packed;
        }
      }
    };
    if (res != nullptr) {
      columns(std::true_type{});
      res += out_row;
    } else {
      columns(std::false_type{});
    }
    dst += out_row;
  };

  float a0[CW][V], a1[CW][V], a2[CW][V];
  if constexpr (S == 1) {
    // step e: input row e adds kh = 0 to output row e (newest), 1 to row e - 1, 2 to row e - 2 (oldest, then
    // stored); the first two and the last two steps also add into rows outside the band, never stored. A padding
    // row adds nothing: the output row it would start starts from zeros.
    auto step = [&](int e, float (&oldest)[CW][V], float (&middle)[CW][V], float (&newest)[CW][V]) {
      float xv[COLS][V];
      if (row(e, xv)) {
        add_walk_row<S, CW, COLS, V>(xv, wr, 0, newest, true);
        add_walk_row<S, CW, COLS, V>(xv, wr, 1, middle, false);
        add_walk_row<S, CW, COLS, V>(xv, wr, 2, oldest, false);
      } else {
        zero(newest);
      }
      if (e >= 2) store(oldest);
    };
    for (int e = 0; e < steps; e += 3) {
      step(e, a1, a2, a0);
      if (e + 1 < steps) step(e + 1, a2, a0, a1);
      if (e + 2 < steps) step(e + 2, a0, a1, a2);
    }
  } else {
    // steps e (even) and e + 1: input row e adds kh = 2 to output row e / 2 - 1 (previous, then stored) and kh = 0
    // to output row e / 2 (current), input row e + 1 kh = 1 to the current one; the first step's previous row and
    // the last step's current one are outside the band, never stored. A padding row adds nothing: the output row it
    // would start starts from zeros.
    auto pair = [&](int e, float (&previous)[CW][V], float (&current)[CW][V]) {
      float xv[COLS][V];
      if (row(e, xv)) {
        add_walk_row<S, CW, COLS, V>(xv, wr, 2, previous, false);
        if (e >= 2) store(previous);
        add_walk_row<S, CW, COLS, V>(xv, wr, 0, current, true);
      } else {
        if (e >= 2) store(previous);
        zero(current);
      }
      if (e + 1 < steps && row(e + 1, xv)) add_walk_row<S, CW, COLS, V>(xv, wr, 1, current, false);
    };
    for (int e = 0; e < steps; e += 4) {
      pair(e, a1, a0);
      if (e + 2 < steps) pair(e + 2, a0, a1);
    }
  }
}

// dgrad at stride 2 as a walk, for vectors of kWalkVector channels: a thread takes kWalkVector channels of
// kDgradWalkColumns dx columns and walks a band of dy rows of one image, one dy row a step. In the padded
// coordinates a = ih + pad_h (b = iw + pad_w along W), dy row oh reaches dx rows 2 oh (tap kh = 0), 2 oh + 1 (kh = 1)
// and 2 oh + 2 (kh = 2): so at dy row oh the thread writes dx rows 2 oh, from this row and the one before (kept in
// registers, as float), and 2 oh + 1, from this row alone. Its columns start at an even b0 = 2 m and read the dy
// columns m - 1 ... m + kDgradWalkColumns / 2 - 1 (dx column b = 2 (m + q) from dy columns m + q (kw = 0) and
// m + q - 1 (kw = 2); b + 1 from dy column m + q (kw = 1)). Each output adds its taps kh, then kw, ascending, from 0.
// The dy rows are copied as the forward walk's input rows are, kDgradWalkAhead rows ahead into slots of shared memory
// of the thread's own.
// Why this shape (a scratch harness, H200, batch 256, bf16, the eight stride-2 layers of MobileNet v1 and v2 with v1's
// 512-channel layer counted five times, 2026-11-26): the kernel it replaced (a dx tile of 8 x 16 positions a block,
// its dy tile staged in shared memory, then a strip of 4 dx columns a thread) took 1.422 ms, 2.10-2.83x its bytes'
// time, and cuDNN's 3.050; this walk with 4 columns and bands of 8 dy rows 0.691 (1.11-1.51x), with 8 columns or
// bands of 16 or 32 rows 0.715-0.777. It gave the replaced kernel's bits on every layer (the same taps in the same
// order).
constexpr int kDgradWalkColumns = 4;  // dx columns a thread, even
constexpr int kDgradWalkBand = 8;     // dy rows a thread writes from at most (two dx rows each): see dgrad_walk_band
constexpr int kDgradWalkSlots = 8;    // dy rows a thread holds in shared memory (4, 2 ahead: 0.714 against 0.706 ms)
constexpr int kDgradWalkAhead = 6;

template <typename T, int CX>
__global__ void __launch_bounds__(kWalkThreads, 4) depthwise_conv_dgrad_walk(
    const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx, DepthwiseShape s, int band, int first_row,
    int rows, int64_t threads) {
  constexpr int V = kWalkVector, DC = CX / 2 + 1, SLOTS = kDgradWalkSlots;
  static_assert(CX % 2 == 0, "dx columns a thread: even");
  static_assert((SLOTS & (SLOTS - 1)) == 0, "slots: a power of two");
  static_assert(kDgradWalkAhead + 2 <= SLOTS, "a slot is refilled no sooner than two steps after it was read");
  using P = Pack<T, V>;
  extern __shared__ __align__(16) unsigned char shared[];
  P* mine = reinterpret_cast<P*>(shared) + threadIdx.x;  // slot k, column j: mine[(k * DC + j) * kWalkThreads]
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWalkThreads + threadIdx.x;
  if (i >= threads) return;
  const int C = static_cast<int>(s.channels), H = static_cast<int>(s.h), W = static_cast<int>(s.w);
  const int out_h = static_cast<int>(s.out_h), out_w = static_cast<int>(s.out_w);
  const int groups = C / V, strips = (W + s.pad_w + CX - 1) / CX, bands = (rows + band - 1) / band;
  const int c = static_cast<int>(i % groups) * V;
  int64_t t = i / groups;
  const int b0 = static_cast<int>(t % strips) * CX;
  t /= strips;
  const int band_index = static_cast<int>(t % bands);
  const int64_t n = t / bands;
  const int o0 = first_row + band_index * band;  // the first dy row whose dx rows the thread writes
  const int steps = min(band, rows - band_index * band) + 1;  // dy rows o0 - 1 ... o0 + steps - 2
  const int m = b0 / 2;
  bool column_inside[DC];
#pragma unroll
  for (int j = 0; j < DC; ++j) column_inside[j] = m - 1 + j >= 0 && m - 1 + j < out_w;
  const T* src = dy + ((n * out_h + o0 - 1) * out_w + m - 1) * static_cast<int64_t>(C) + c;
  int oh = o0 - 1, issued = 0;
  auto issue = [&]() {  // the next dy row into its slot; one commit group each, empty past the last row
    if (issued < steps) {
      copy_row_async(mine + (issued & (SLOTS - 1)) * DC * kWalkThreads, src, C, oh >= 0 && oh < out_h, column_inside);
      src += out_w * C;
      ++oh;
      ++issued;
    }
    commit_copies();
  };
#pragma unroll
  for (int e = 0; e < kDgradWalkAhead; ++e) issue();
  float wr[9][V];
  load_filters<false>(w, c, wr);
  // dx columns: b0 + jj - pad_w, written where inside the image
  const int iw0 = b0 - s.pad_w;
  bool store_column[CX];
#pragma unroll
  for (int jj = 0; jj < CX; ++jj) store_column[jj] = iw0 + jj >= 0 && iw0 + jj < W;
  int ih = 2 * o0 - s.pad_h;  // the even dx row of the step's dy row
  T* dst = dx + ((n * H + ih) * W + iw0) * static_cast<int64_t>(C) + c;
  auto store_row = [&](T* row, bool inside, const float (&acc)[CX][V]) {
    if (!inside) return;
#pragma unroll
    for (int jj = 0; jj < CX; ++jj) {
      if (store_column[jj]) {
        P out;
#pragma unroll
        for (int v = 0; v < V; ++v) out.v[v] = from_float<T>(acc[jj][v]);
        *reinterpret_cast<P*>(row + jj * C) = out;
      }
    }
  };
  float d0[DC][V], d1[DC][V];
  // step e: dy row o0 - 1 + e into `current`; from the second step on, dx rows 2 oh and 2 oh + 1
  auto step = [&](int e, const float (&previous)[DC][V], float (&current)[DC][V]) {
    issue();
    wait_copies<kDgradWalkAhead>();  // row e has landed
    unpack_slot(mine + (e & (SLOTS - 1)) * DC * kWalkThreads, current);
    if (e == 0) return;
    float even[CX][V], odd[CX][V];
#pragma unroll
    for (int q = 0; q < CX / 2; ++q)
#pragma unroll
      for (int v = 0; v < V; ++v) {
        // dy column m + q is current[q + 1], m + q - 1 is current[q]
        float a = current[q + 1][v] * wr[0][v];        // kh 0, kw 0
        a = fmaf(current[q][v], wr[2][v], a);          // kh 0, kw 2
        a = fmaf(previous[q + 1][v], wr[6][v], a);     // kh 2, kw 0
        even[2 * q][v] = fmaf(previous[q][v], wr[8][v], a);  // kh 2, kw 2
        even[2 * q + 1][v] = fmaf(previous[q + 1][v], wr[7][v], current[q + 1][v] * wr[1][v]);  // kh 0 kw 1, kh 2 kw 1
        float b = current[q + 1][v] * wr[3][v];        // kh 1, kw 0
        odd[2 * q][v] = fmaf(current[q][v], wr[5][v], b);    // kh 1, kw 2
        odd[2 * q + 1][v] = current[q + 1][v] * wr[4][v];    // kh 1, kw 1
      }
    store_row(dst, ih >= 0 && ih < H, even);
    store_row(dst + W * C, ih + 1 >= 0 && ih + 1 < H, odd);
    dst += 2 * W * C;
    ih += 2;
  };
  for (int e = 0; e < steps; e += 2) {
    step(e, d1, d0);
    if (e + 1 < steps) step(e + 1, d0, d1);
  }
}

template <typename T, int V, int K, int S>
__global__ void __launch_bounds__(nhwc::kThreads) depthwise_conv_dgrad(const T* __restrict__ dy,
                                                                       const T* __restrict__ w, T* __restrict__ dx,
                                                                       DepthwiseShape s, int band) {
  extern __shared__ float w_s[];
  constexpr int kTaps = (K + S - 1) / S;  // taps of one class along one axis, at most
  const int width = blockDim.x * V;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * width;
  stage_filters<T, K>(w, w_s, c0, width, s.channels);
  const int rh = blockIdx.z / S;
  const int rw = blockIdx.z % S;
  // th and tw run over [lo, lo + count): every dx row and column of every class (some, for some classes, outside).
  const int th_lo = s.pad_h / S;
  const int tw_lo = s.pad_w / S;
  const int64_t rows_t = (s.h - 1 + s.pad_h) / S - th_lo + 1;
  const int64_t columns_t = (s.w - 1 + s.pad_w) / S - tw_lo + 1;
  const int64_t strips = (columns_t + kStrip - 1) / kStrip;
  const int64_t c = c0 + threadIdx.x * V;
  const Strip at = strip_at(static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y, rows_t, strips, band);
  if (c >= s.channels || at.n >= s.n || at.row >= rows_t) return;
  const int64_t n = at.n;
  const int tw0 = tw_lo + at.column0;
  const int th = th_lo + at.row;
  const int ih = th * S + rh - s.pad_h;
  if (ih < 0 || ih >= s.h) return;
  const int taps_w = (K - 1 - rw) / S + 1;  // kw = rw + S*d for d < taps_w
  const float* filters = w_s + threadIdx.x * V;

  float acc[kStrip][V];
  zero(acc);
#pragma unroll
  for (int dh = 0; dh < kTaps; ++dh) {
    const int kh = rh + S * dh;
    const int oh = th - dh;
    if (kh >= K || oh < 0 || oh >= s.out_h) continue;
    float wr[kTaps][V];
#pragma unroll
    for (int d = 0; d < kTaps; ++d) {
      const int kw = rw + S * d;
#pragma unroll
      for (int v = 0; v < V; ++v) wr[d][v] = kw < K ? filters[(kh * K + kw) * width + v] : 0.f;
    }
    const T* g = dy + ((n * s.out_h + oh) * s.out_w) * s.channels + c;
    // dx column tw0 + i reads dy column tw0 + i - d with tap d: dy columns tw0 - (kTaps - 1) ... tw0 + kStrip - 1
#pragma unroll
    for (int j = 0; j < kStrip + kTaps - 1; ++j) {
      const int e = j - (kTaps - 1);
      const int ow = tw0 + e;
      if (ow < 0 || ow >= s.out_w) continue;
      float gv[V];
      load<T, V>(g + static_cast<int64_t>(ow) * s.channels, gv);
#pragma unroll
      for (int i = 0; i < kStrip; ++i) {
        const int d = i - e;
        if (d >= 0 && d < kTaps && d < taps_w) {
#pragma unroll
          for (int v = 0; v < V; ++v) acc[i][v] = fmaf(gv[v], wr[d][v], acc[i][v]);
        }
      }
    }
  }
  const int64_t base = (n * s.h + ih) * s.w * s.channels + c;
#pragma unroll
  for (int i = 0; i < kStrip; ++i) {
    const int iw = (tw0 + i) * S + rw - s.pad_w;
    if (iw < 0 || iw >= s.w) continue;
    Pack<T, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.v[v] = from_float<T>(acc[i][v]);
    *reinterpret_cast<Pack<T, V>*>(dx + base + static_cast<int64_t>(iw) * s.channels) = out;
  }
}

// dw[c, tap] = the sum of partial[p, tap, c] over p, rounded once to dw's type O (the element type, or float for a
// float32 weight's gradient): block (channels / 32, tap); threads: 32 channels x kWgradSumGroups, group j adding
// parts j, j + kWgradSumGroups, ..., then the groups added in order.
constexpr int kWgradSumGroups = 32;

template <typename O>
__global__ void __launch_bounds__(32 * kWgradSumGroups) depthwise_conv_wgrad_sum(const float* __restrict__ partial,
                                                                                int64_t parts, O* __restrict__ dw,
                                                                                int64_t channels) {
  __shared__ float sums[kWgradSumGroups][33];
  wait_for_previous_grid();  // launched as the wgrad walk's dependent: its partial sums written
  const int lane = threadIdx.x % 32;
  const int group = threadIdx.x / 32;
  const int tap = blockIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float sum = 0.f;
  if (c < channels) {
    for (int64_t p = group; p < parts; p += kWgradSumGroups) sum += partial[(p * 9 + tap) * channels + c];
  }
  sums[group][lane] = sum;
  __syncthreads();
  if (group != 0 || c >= channels) return;
  float total = 0.f;
  for (int j = 0; j < kWgradSumGroups; ++j) total += sums[j][lane];
  dw[c * 9 + tap] = from_float<O>(total);
}

// The same sums with a thread per tap and channel, each adding the parts in order: for launches of at most
// kWgradSumFlatParts parts, where the grouped sum's blocks of 1024 threads cost more than their reads (a scratch
// harness, H200, 2026-11-27: after the plane kernel's 8, 16 and 32 parts on 1024 channels, bf16 and fp16, 1.5-2.3 us
// against 4.2-4.9 for the grouped sum, both launched as its dependent). dw is written as the grouped sum writes it.
constexpr int kWgradSumFlatParts = 32;
constexpr int kWgradSumFlatThreads = 256;

template <typename O>
__global__ void __launch_bounds__(kWgradSumFlatThreads) depthwise_conv_wgrad_sum_flat(
    const float* __restrict__ partial, int64_t parts, O* __restrict__ dw, int64_t channels) {
  wait_for_previous_grid();  // launched as the wgrad kernel's dependent: its partial sums written
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= 9 * channels) return;
  const int64_t c = i % channels;
  const int tap = static_cast<int>(i / channels);
  float total = 0.f;
  for (int64_t p = 0; p < parts; ++p) total += partial[(p * 9 + tap) * channels + c];
  dw[c * 9 + tap] = from_float<O>(total);
}

// wgrad as a walk (3x3, stride S = 1 or 2): a thread takes kWalkVector channels of CW output columns and
// walks a band of output rows of one image, then the next band its block gives it (position p, p + gridDim.x *
// blockDim.y, ...), without a break between bands. Each step converts S input rows (S * CW + 3 - S vectors
// each) and one dy row to float once and adds their products to the taps:
// - stride 1, step e of a band: input row e meets dy rows e (kh = 0), e - 1 (kh = 1) and e - 2 (kh = 2), the last
//   three dy rows held in registers that rotate as the forward walk's accumulators do (rows + 2 steps);
// - stride 2, step e: input rows 2e and 2e + 1 meet dy row e (kh = 0 and 1), input row 2e also dy row e - 1 (kh = 2),
//   the last two dy rows in registers (rows + 1 steps; the last has input row 2e alone).
// The rows arrive by asynchronous copies into slots of shared memory of the thread's own, Ahead steps before their
// use (zeros outside the image and past out_w); a thread reads back only what it copied, so no barrier is needed. A
// slot is refilled Slots - Ahead steps after it was read, never the step after. The 9 taps' sums stay in registers
// across the thread's bands; at the end the block adds them across blockDim.y in order and writes one partial sum
// per tap and channel, for depthwise_conv_wgrad_sum: the same inputs give the same bits. Threads: blockDim.x vectors
// of channels (fastest), blockDim.y positions.
// Why these numbers (a scratch harness, H200, batch 256, bf16, 2026-11-26). Stride 1, the ten stride-1 layers of
// MobileNet v1 and v2 with v1's 512-channel layer counted five times: 8 slots, 5 steps ahead and 2 blocks a
// multiprocessor (80 KB of shared memory each, 156 registers) took 0.908 ms; 6 ahead 0.931; 6 slots, 4 ahead and
// 3 blocks 0.971; 4 blocks (5 or 4 slots, spilling at 128 registers) 1.29-1.52; the kernel with the input rows in
// registers before it 1.079, and PyTorch's (cuDNN's) wgrad 1.474. Stride 2, the eight stride-2 layers: 4 slots,
// 2 ahead and 2 blocks (88 KB each) 0.606 ms (1.03-1.82x the bytes' time); 6 slots, 4 ahead, 1 block 0.659; 5 slots,
// 3 ahead, 2 blocks and 3 slots, 1 ahead, 3 blocks 0.747; the tiled kernel before it 1.006, PyTorch's 1.031.
// Since then (the same harness, H100, 2026-11-26, all 18 layers, each twice): in 16-bit types a thread takes 7
// columns, not 4, and a multiprocessor holds 1 block, not 2 (128 and 148 KB of shared memory, 202 and 198 registers).
// Stride 1 went from 1.07-1.82x the bytes' time to 1.05-1.69x, faster on each of the ten layers (v1 1024@7 1.70 ->
// 1.58, v2 960@7 1.82 -> 1.68, v2 384@14 1.43 -> 1.35); stride 2 from 1.05-1.53x to 1.03-1.41x, faster on each of the
// eight (v2 576@14 1.52 -> 1.41). 7 columns at 2 blocks (4, 5 or 6 slots) were slower than 4 on v2's 56 x 56 and
// 14 x 14 layers, 6 and 8 columns slower than 7, and 3 slots 1 ahead slower at stride 2 (up to 1.9x). Fewer
// threads, each with more columns, issue fewer instructions an output (a row's copies, its slot reads, the loop),
// where the small layers were bound by instructions (see the forward walk). Then at stride 1, 4 steps ahead rather
// than 5 (three runs): up to 0.04 less on the 7 x 7 and 14 x 14 layers (v1 1024@7 1.58-1.61 -> 1.55-1.59), the
// others within 0.01; 6 ahead, 10 or 12 slots (7 or 8 ahead), and 5 or 8 columns were slower on the small layers.
// What holds the 7 x 7 layers above 1.3x (the same harness, H100, bf16, 2026-11-26q; walk and sum, x the bytes'
// time): v1 1024@7 took 1.50, without its sum 1.39, with no FMAs (the copies, slot reads and conversions kept) 1.41
// and with no copies 1.10; v2 960@7 1.60, 1.49, 1.49 and 1.16: without a single FMA they stay above 1.3x, and the
// FMAs alone take nearly the bytes' time. Not kept, all slower or unchanged: skipping the products of padding rows and
// of dy rows past the band (fewer instructions; 219 registers, up to 0.31 slower at stride 1); a pair of threads
// copying 16 bytes each for both (up to 0.7 slower); the blocks of a channel group as one cluster of 2, 4 or 8
// adding their sums in distributed shared memory with no sum kernel (fewer blocks fit: up to 3.2x slower); the sum's
// launch let at the walk's start; blocks of up to 64 or 128 channel vectors (up to 0.6 slower, but v2 144@56 1.20
// -> 1.11); 6 slots at 2 blocks a multiprocessor (up to 0.21 slower).
// Nor a kernel whose arithmetic runs on tensor cores (the same harness, H100, 2026-11-26aa, 16-bit types; the code is
// benchmarks/results/wgrad_tensor_cores_2026-11-26aa.patch): tensor copies of 64 channels' stages by one thread, and
// per 16 positions five mma.m16n8k16 of two taps' x by dy, whose diagonals are the taps' sums. With no bank conflicts
// it took v1 1024@7 1.54-1.56 against the walk's 1.50-1.52 (960@7 1.63-1.65 against 1.59-1.61), and the tile's time
// at best on the 14 x 14 inputs (4 stages at stride 1, 3 at stride 2). Its copies alone, no arithmetic, took
// 1.34-1.36 with the sum and 1.23-1.25 without it on the 7 x 7 layers: its copies and the sum alone take more than
// 1.3x there (docs/benchmarks.md, "The depthwise wgrad on tensor cores").
// By stride (1, 2): slots and steps ahead.
constexpr int kWgradWalkSlots[3] = {0, 8, 4};
constexpr int kWgradWalkAhead[3] = {0, 4, 2};

// Blocks a multiprocessor and output columns a thread: 1 and 7 in 16-bit types, 2 and kWalkColumns in float (whose
// 16-byte vectors would take 256 and 296 KB of shared memory a block with 7 columns).
template <typename T>
constexpr int wgrad_walk_blocks() {
  return sizeof(T) == 2 ? 1 : 2;
}
template <typename T>
constexpr int wgrad_walk_thread_columns() {
  return sizeof(T) == 2 ? 7 : kWalkColumns;
}

struct WgradWalkShape {
  int band, bands, strips;  // output rows a band (the last may have fewer), bands across out_h, strips across out_w
  int64_t positions;        // n * bands * strips
};

template <typename T, int S, int Slots, int CW>
constexpr int wgrad_walk_shared_bytes() {
  return Slots * (S * walk_columns<S, CW>() + CW) * kWalkThreads *
         static_cast<int>(sizeof(Pack<T, kWalkVector>));
}

template <int CW, int COLS, int V>
__device__ inline void add_wgrad_row(const float (&xv)[COLS][V], const float (&d)[CW][V], int kh, int stride,
                                     float (&acc)[9][V]) {
#pragma unroll
  for (int kw = 0; kw < 3; ++kw)
#pragma unroll
    for (int j = 0; j < CW; ++j)
#pragma unroll
      for (int v = 0; v < V; ++v) acc[kh * 3 + kw][v] = fmaf(xv[j * stride + kw][v], d[j][v], acc[kh * 3 + kw][v]);
}

template <typename T, int S, int Slots, int Ahead, int Blocks, int CW>
__global__ void __launch_bounds__(kWalkThreads, Blocks) depthwise_conv_wgrad_walk(const T* __restrict__ x,
                                                                                  const T* __restrict__ dy,
                                                                                  float* __restrict__ partial,
                                                                                  DepthwiseShape s, WgradWalkShape r) {
  constexpr int V = kWalkVector, COLS = walk_columns<S, CW>();
  static_assert(Ahead + 2 <= Slots, "a slot is refilled no sooner than two steps after it was read");
  using P = Pack<T, V>;
  extern __shared__ __align__(16) unsigned char shared[];
  const int thread = threadIdx.y * blockDim.x + threadIdx.x;
  // slot k, input row i of the step, column j: x_slots[((k * S + i) * COLS + j) * kWalkThreads]
  P* x_slots = reinterpret_cast<P*>(shared) + thread;
  P* dy_slots = x_slots + Slots * S * COLS * kWalkThreads;  // slot k, column j: dy_slots[(k * CW + j) * kWalkThreads]
  const int C = static_cast<int>(s.channels), H = static_cast<int>(s.h), W = static_cast<int>(s.w);
  const int out_h = static_cast<int>(s.out_h), out_w = static_cast<int>(s.out_w);
  const int width = blockDim.x * V;
  const int c0 = blockIdx.y * width;
  const int c = c0 + threadIdx.x * V;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.y;
  const int64_t positions = c < C ? r.positions : 0;  // a thread past the last channel walks nothing
  const int in_row = W * C, out_row = out_w * C;

  // the issuing side: position ip, step is of its steps (rows + 3 - S)
  int64_t ip = first;
  int is = 0, i_rows = 0, ih = 0;
  const T* xs = x;
  const T* ds = dy;
  bool x_inside[COLS], dy_inside[CW];
  auto begin = [&]() {  // the issuing side's state for position ip
    const int strip = static_cast<int>(ip % r.strips);
    const int64_t rest = ip / r.strips;
    const int oh0 = static_cast<int>(rest % r.bands) * r.band;
    const int64_t n = rest / r.bands;
    const int ow0 = strip * CW, iw0 = ow0 * S - s.pad_w;
    i_rows = min(r.band, out_h - oh0);
    ih = oh0 * S - s.pad_h;
#pragma unroll
    for (int j = 0; j < COLS; ++j) x_inside[j] = iw0 + j >= 0 && iw0 + j < W;
#pragma unroll
    for (int j = 0; j < CW; ++j) dy_inside[j] = ow0 + j < out_w;
    xs = x + ((n * H + ih) * W + iw0) * static_cast<int64_t>(C) + c;
    ds = dy + ((n * out_h + oh0) * out_w + ow0) * static_cast<int64_t>(C) + c;
  };
  if (ip < positions) begin();
  int issue_slot = 0;
  auto issue = [&]() {  // the next step's input rows and dy row into their slots; one commit group each
    if (ip < positions) {
      const bool last = is == i_rows;  // stride 2: input row 2e alone, no dy row
#pragma unroll
      for (int i = 0; i < S; ++i) {
        if (i == 0 || !last) {
          copy_row_async(x_slots + (issue_slot * S + i) * COLS * kWalkThreads, xs + i * in_row, C,
                         ih + i >= 0 && ih + i < H, x_inside);
        }
      }
      if (is < i_rows) {
        copy_row_async(dy_slots + issue_slot * CW * kWalkThreads, ds, C, true, dy_inside);
        ds += out_row;
      }
      xs += S * in_row;
      ih += S;
      if (++is == i_rows + 3 - S) {
        is = 0;
        ip += stride;
        if (ip < positions) begin();
      }
    }
    issue_slot = issue_slot + 1 == Slots ? 0 : issue_slot + 1;
    commit_copies();
  };
#pragma unroll
  for (int e = 0; e < Ahead; ++e) issue();

  float acc[9][V];
  zero(acc);
  float d0[CW][V], d1[CW][V], d2[CW][V];
  int slot = 0;
  auto input_row = [&](int i, float (&xv)[COLS][V]) {  // the step's input row i as float
    unpack_slot(x_slots + (slot * S + i) * COLS * kWalkThreads, xv);
  };
  auto dy_row = [&](int e, int rows, float (&d)[CW][V]) {  // the step's dy row as float, zeros past the band's last
    if (e < rows) {
      unpack_slot(dy_slots + slot * CW * kWalkThreads, d);
    } else {
      zero(d);
    }
  };
  auto wait = [&]() {
    issue();
    wait_copies<Ahead>();  // this step's rows have landed
  };
  auto next_slot = [&]() { slot = slot + 1 == Slots ? 0 : slot + 1; };
  for (int64_t p = first; p < positions; p += stride) {
    const int oh0 = static_cast<int>((p / r.strips) % r.bands) * r.band;
    const int rows = min(r.band, out_h - oh0);
    if constexpr (S == 1) {
      // step e: input row e meets dy row e (newest, read now), e - 1 (middle) and e - 2 (oldest)
      auto step = [&](int e, const float (&oldest)[CW][V], const float (&middle)[CW][V], float (&newest)[CW][V]) {
        wait();
        float xv[COLS][V];
        input_row(0, xv);
        dy_row(e, rows, newest);
        next_slot();
        add_wgrad_row<CW, COLS, V>(xv, newest, 0, 1, acc);
        add_wgrad_row<CW, COLS, V>(xv, middle, 1, 1, acc);
        add_wgrad_row<CW, COLS, V>(xv, oldest, 2, 1, acc);
      };
      zero(d1);
      zero(d2);
      for (int e = 0; e < rows + 2; e += 3) {
        step(e, d1, d2, d0);
        if (e + 1 < rows + 2) step(e + 1, d2, d0, d1);
        if (e + 2 < rows + 2) step(e + 2, d0, d1, d2);
      }
    } else {
      // step e: input rows 2e and 2e + 1 meet dy row e (current, read now), input row 2e also dy row e - 1 (previous)
      auto step = [&](int e, const float (&previous)[CW][V], float (&current)[CW][V]) {
        wait();
        float xv[COLS][V];
        dy_row(e, rows, current);
        input_row(0, xv);
        add_wgrad_row<CW, COLS, V>(xv, current, 0, 2, acc);
        add_wgrad_row<CW, COLS, V>(xv, previous, 2, 2, acc);
        if (e < rows) {
          input_row(1, xv);
          add_wgrad_row<CW, COLS, V>(xv, current, 1, 2, acc);
        }
        next_slot();
      };
      zero(d1);
      for (int e = 0; e < rows + 1; e += 2) {
        step(e, d1, d0);
        if (e + 1 < rows + 1) step(e + 1, d0, d1);
      }
    }
  }

  // the block's sum per tap and channel: its rows of threads' sums in order, in the slots' memory once every copy is
  // done
  wait_copies<0>();
  let_dependent_launch();  // depthwise_conv_wgrad_sum, which waits for this grid to complete before it reads
  __syncthreads();
  float* sums = reinterpret_cast<float*>(shared);  // [9][blockDim.y][width]
  const int rows_of_threads = blockDim.y;
#pragma unroll
  for (int tap = 0; tap < 9; ++tap)
#pragma unroll
    for (int v = 0; v < V; ++v) sums[(tap * rows_of_threads + threadIdx.y) * width + threadIdx.x * V + v] = acc[tap][v];
  __syncthreads();
  const int threads = blockDim.x * blockDim.y;
  for (int i = thread; i < 9 * width; i += threads) {
    const int tap = i / width, lane = i % width;
    if (c0 + lane >= C) continue;
    float total = 0.f;
    for (int y = 0; y < rows_of_threads; ++y) total += sums[(tap * rows_of_threads + y) * width + lane];
    partial[(static_cast<int64_t>(blockIdx.x) * 9 + tap) * C + c0 + lane] = total;
  }
}

// wgrad of small images (7 x 7 at stride 1, 14 x 14 at stride 2; padding 1), a whole image plane or half of it a
// thread: a thread takes plane_lane_channels (4 bytes) of one image at a time and walks the output rows of the image
// (or of one of its two bands of rows), loading each dy row and the input rows it first needs into registers just
// before its use, and adds the products that lie inside the image to the 9 taps' sums (the loops unrolled at
// compile-time sizes: the padding columns cost no instruction). A warp takes 32 lanes' channels (128 bytes a pixel), a
// block kPlaneWarps items (an image, or a band of one) at a time, stepping by the parts' items. At the end the block
// adds its warps' sums in order and writes one partial sum per tap and channel, for the sum kernel, as the walk does:
// the same inputs give the same bits.
// Why (scratch harnesses, H200, batch 256, 2026-11-27, CUDA-graph replay with the sum; bf16 unless named, GPU us, the
// kernels before it from bench_depthwise on another H200): v1 1024@7 13.5 (the walk 25.4); v1 512@14 29.2 (the tile
// 33.9), v2 384@14 24.5 (26.4), v2 576@14 39.3 (39.1), v1 512@14/2 20.0 (23.7), v2 576@14/2 24.4 (27.1); float32
// 512@14 50.2 (55.0) and 512@14/2 33.4 (36.4). The rows loaded 1 or 2 output rows ahead of their use took the same on
// 7 x 7 and 14 x 14 / 2 and spilled on 14 x 14 (29.2 -> 34.9 and 43.7 us); the whole plane loaded first 14.6 us on
// 1024@7. 8 warps at 2 blocks a multiprocessor (at most 128 registers) against 8 at 1 and 4 at 3: 13.5 against 15.5
// and 16.4 us on 1024@7, 29.2 against 32.1 and 33.9 on 512@14; 4 at 3 was faster on 576@14 (37.5) and 576@14/2 (23.1),
// whose 9 channel groups leave blocks of 8 images short of the multiprocessors: there the plan takes two bands of rows
// an image (wgrad_plane_plan; the bands were measured in bench_depthwise only, not in the harness).
// Plan 0 keeps the tile on 14 x 14 images at stride 1 (plan 2, timed under cudnn.benchmark, runs the plane kernel
// there): on an H100 (bench_depthwise on bba6bba, bf16, x the bytes' time) the plane kernel took v1 512@14 1.53, v2
// 384@14 1.69 and 576@14 1.31, where the tile had taken 1.20, 1.28 and 1.18-1.20 (26aa); at 7 x 7 it took 1.31 and
// 1.33 against the walk's 1.50 and 1.60, at 14 x 14 / 2 1.31 and 1.30 against the tile's 1.33 and 1.30-1.32. On an
// H200 in bf16 (27s, one run, GPU ms) it took 512@14 0.0446 against the tile's 0.0344, 512@14/2 0.0223 against 0.0242;
// in float32 0.0540 against 0.0551 and 0.0373 against 0.0374.
constexpr int kPlaneWarps = 8;   // items a block takes at a time
constexpr int kPlaneBlocks = 2;  // blocks a multiprocessor (__launch_bounds__: at most 128 registers a thread)

template <typename T>
__host__ __device__ constexpr int plane_lane_channels() {
  return 4 / static_cast<int>(sizeof(T));
}

// A 4-byte word of a plane kernel's thread (plane_lane_channels elements) as float.
template <typename T, int E = plane_lane_channels<T>()>
__device__ inline void unpack_word(unsigned word, float (&out)[E]) {
  if constexpr (sizeof(T) == 4) {
    out[0] = __uint_as_float(word);
  } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    out[0] = __uint_as_float(word << 16);
    out[1] = __uint_as_float(word & 0xffff0000u);
  } else {
    __half2 pair;
    memcpy(&pair, &word, sizeof(word));
    const float2 both = __half22float2(pair);
    out[0] = both.x;
    out[1] = both.y;
  }
}

// Output rows First ... Last - 1 of one image's plane (side x side input, stride S, padding 1) added to the taps' sums;
// xs and ds: the image's first pixel of the thread's channels as 4-byte words, `pixel` words from one pixel to the
// next.
template <typename T, int S, int Side, int First, int Last, int E = plane_lane_channels<T>()>
__device__ inline void add_plane_rows(const unsigned* __restrict__ xs, const unsigned* __restrict__ ds, int pixel,
                                      float (&acc)[9][E]) {
  constexpr int H = Side, W = Side, OW = (W - 1) / S + 1;
  unsigned xr[H][W], dr[OW];
#pragma unroll
  for (int oh = First; oh < Last; ++oh) {
#pragma unroll
    for (int ow = 0; ow < OW; ++ow) dr[ow] = __ldg(ds + (oh * OW + ow) * pixel);
    // the input rows that output row oh reads first: all three at First, else those below output row oh - 1's
    const int low = oh == First ? oh * S - 1 : (oh - 1) * S + 2;
#pragma unroll
    for (int r = low < 0 ? 0 : low; r <= oh * S + 1 && r < H; ++r)
#pragma unroll
      for (int iw = 0; iw < W; ++iw) xr[r][iw] = __ldg(xs + (r * W + iw) * pixel);
#pragma unroll
    for (int ow = 0; ow < OW; ++ow) {
      float d[E];
      unpack_word<T>(dr[ow], d);
#pragma unroll
      for (int kh = 0; kh < 3; ++kh)
#pragma unroll
        for (int kw = 0; kw < 3; ++kw) {
          const int ih = oh * S + kh - 1, iw = ow * S + kw - 1;
          if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
          float xv[E];
          unpack_word<T>(xr[ih][iw], xv);
#pragma unroll
          for (int e = 0; e < E; ++e) acc[kh * 3 + kw][e] = fmaf(xv[e], d[e], acc[kh * 3 + kw][e]);
        }
    }
  }
}

// Items: n * bands (bands 1 or 2: an image's output rows, or its first and second half of them, the first the larger).
template <typename T, int S, int Side>
__global__ void __launch_bounds__(32 * kPlaneWarps, kPlaneBlocks) depthwise_conv_wgrad_plane(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ partial, int64_t n, int channels,
    int bands) {
  constexpr int E = plane_lane_channels<T>(), CG = 32 * E, OH = (Side - 1) / S + 1, OW = OH, Half = (OH + 1) / 2;
  __shared__ float sums[9][kPlaneWarps][CG];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int c0 = blockIdx.y * CG;
  const int c = c0 + lane * E;
  float acc[9][E];
  zero(acc);
  if (c < channels) {
    const int pixel = channels / E;  // words from one pixel to the next
    for (int64_t item = static_cast<int64_t>(blockIdx.x) * kPlaneWarps + warp; item < n * bands;
         item += static_cast<int64_t>(gridDim.x) * kPlaneWarps) {
      const int64_t image = item / bands;
      const unsigned* xs = reinterpret_cast<const unsigned*>(x + image * Side * Side * channels + c);
      const unsigned* ds = reinterpret_cast<const unsigned*>(dy + image * OH * OW * channels + c);
      if (bands == 1) {
        add_plane_rows<T, S, Side, 0, OH>(xs, ds, pixel, acc);
      } else if (item % 2 == 0) {
        add_plane_rows<T, S, Side, 0, Half>(xs, ds, pixel, acc);
      } else {
        add_plane_rows<T, S, Side, Half, OH>(xs, ds, pixel, acc);
      }
    }
  }
  let_dependent_launch();  // the sum, which waits for this grid to complete before it reads
#pragma unroll
  for (int tap = 0; tap < 9; ++tap)
#pragma unroll
    for (int e = 0; e < E; ++e) sums[tap][warp][lane * E + e] = acc[tap][e];
  __syncthreads();
  for (int i = threadIdx.x; i < 9 * CG; i += blockDim.x) {
    const int tap = i / CG, k = i % CG;
    if (c0 + k >= channels) continue;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kPlaneWarps; ++w) total += sums[tap][w][k];
    partial[(static_cast<int64_t>(blockIdx.x) * 9 + tap) * channels + c0 + k] = total;
  }
}

// wgrad of small images as tiles (3x3, stride S = 1 or 2, compute capability 9.0): a block takes a group of
// tile_channels channels (256 bytes a pixel) and walks bands of output rows, one image's band a stage. One thread of
// the last warp (the producer) copies each stage's dy rows and the input rows they read into shared memory, two
// tensor copies ([rows][columns][channels] boxes of the NHWC tensors, zeros outside them: the padding rows and
// channels past the last) completing on the stage's barrier (full); the other warps (one per output row and column
// chunk of kTileColumns of the band) wait for it, add their row's products to the 9 taps' sums in registers, and
// release the stage (empty) for the producer to refill. The copies take no instruction of the warps that compute,
// and a multiprocessor holds several warps a scheduler. At the end the block adds the warps' sums in order and writes
// one partial sum per tap and channel, for depthwise_conv_wgrad_sum, as the walk does: the same inputs give the same
// bits. It runs where the input is at least kTileMinWidth and the output at most kTileMaxOutW columns wide (the 14 x 14
// layers at both strides, the 28 x 28 ones at stride 2); the walk the rest.
// Why (a scratch harness, H100, batch 256, 2026-11-26v, with the sum, x the bytes' time, the walk -> the tile; bf16
// two repetitions, fp16 and fp32 one): v1 512@14 1.23 -> 1.21 in bf16 (fp16 1.24 -> 1.21, fp32 1.08 -> 1.06), v2
// 384@14 1.32 -> 1.30 (1.34 -> 1.29, 1.13 -> 1.10), 576@14 1.27 -> 1.21 (1.29 -> 1.20, 1.10 -> 1.06), 576@14/2 1.36 ->
// 1.31 (1.37 -> 1.31, 1.15 -> 1.11), 512@14/2 1.34 both (1.35 -> 1.34, 1.15 -> 1.11). On the 7 x 7 layers (v1 1024@7,
// v2 960@7) the tile was no faster than the walk: 1.50-1.59 against 1.48-1.51 on v1 1024@7 in bf16 with 2, 3 or 4
// stages (Nsight Compute, 4 stages: 40% of issue slots used, 2 warps a scheduler; each input element is converted from
// bfloat16 three times, once per output row that reads it), and a variant whose consumers walk the band's rows from
// the stage as the walk does (groups of warps taking turns at the items) took 1.56 at best. Not kept either: 3 or 4
// stages (v1 512@14 1.26 and 1.25 against 1.21 with 2); a bulk copy a pixel rather than a tensor copy a box (2.7-4.2x:
// the copy engine's rate of small copies); checks of the padding columns in the consumers rather than zeros copied
// into the tile (v1 512@14 1.28, v2 576@14/2 1.44); stride-2 bands of at most 3, 4 or 5 rows rather than 7 (v1
// 512@14/2 1.36-1.41 against 1.32, v2 192@28/2 1.20-1.23 against 1.23, three repetitions).
constexpr int kTileColumns = 7;       // output columns a consumer warp takes of a row
// Output rows a consumer warp takes of a band: 1. With 2 or 3 each input row is converted from bfloat16 once for
// more of them (2 rows: 4 or 5 input rows for 2 outputs rather than 6), but fewer warps share a stage and the
// registers run out: v1 512@14 1.25 and 1.58 against 1.20, v2 576@14/2 1.33 and 1.51 against 1.30 (the scratch
// harness, H100, bf16, 2026-11-26v, three repetitions).
constexpr int kTileRows = 1;
constexpr int kTileMaxWarps = 16;     // consumers and the producer
constexpr int kTileHeader = 128;      // the stages' barriers (at most 8 stages), before the tiles
constexpr int kTileLanes = 32;

template <typename T>
__host__ __device__ constexpr int tile_lane_channels() {
  return 8 / static_cast<int>(sizeof(T));  // 8 bytes a lane: a warp's 256 bytes read without bank conflicts
}
template <typename T>
__host__ __device__ constexpr int tile_channels() {
  return kTileLanes * tile_lane_channels<T>();
}

struct WgradTileShape {
  int band, bands, chunks;  // output rows a band (the last may have fewer), bands across out_h, column chunks
  int x_rows, x_pitch;      // input rows and columns a stage: (band - 1) * S + 3, padding included
  int dy_pitch;             // dy columns a stage: chunks * kTileColumns
  int stages;
  int64_t items;  // n * bands
};

__device__ inline unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ inline void barrier_wait(uint64_t* barrier, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n .reg .pred done;\n"
      "wait_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n @!done bra wait_%=;\n}\n" ::"r"(
          shared_address(barrier)),
      "r"(parity)
      : "memory");
#endif
}

// The box of `map` at (channel, column, row, image) into shared memory at dst, completing on `barrier`.
__device__ inline void copy_box(void* dst, const CUtensorMap& map, int channel, int column, int row, int image,
                                uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(channel), "r"(column), "r"(row), "r"(image),
      "r"(shared_address(barrier))
      : "memory");
#endif
}

template <typename T, int S, int R = kTileRows>
__global__ void __launch_bounds__(kTileMaxWarps * 32)
    depthwise_conv_wgrad_tile(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap dy_map,
                              float* __restrict__ partial, DepthwiseShape s, WgradTileShape r) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int L = tile_lane_channels<T>(), CG = tile_channels<T>(), CW = kTileColumns, COLS = S * CW + 3 - S;
  using P = Pack<T, L>;
  extern __shared__ __align__(16) unsigned char shared[];
  uint64_t* full = reinterpret_cast<uint64_t*>(shared);
  uint64_t* empty = full + r.stages;
  T* tiles = reinterpret_cast<T*>(shared + kTileHeader);
  const int x_tile = r.x_rows * r.x_pitch * CG, stage = x_tile + r.band * r.dy_pitch * CG;  // elements
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int units = blockDim.x / 32 - 1;  // consumer warps; the last warp produces
  const int c0 = blockIdx.y * CG;
  if (threadIdx.x == 0) {
    for (int k = 0; k < r.stages; ++k) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(full + k)) : "memory");
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(empty + k)), "r"(units)
                   : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  float acc[9][L];
  zero(acc);
  if (warp == units) {
    // the producer: the block's items (image n, band b) t = 0, 1, ... into slot t % stages
    if (lane == 0) {
      const unsigned bytes = static_cast<unsigned>(stage * sizeof(T));
      int t = 0;
      for (int64_t item = blockIdx.x; item < r.items; item += gridDim.x, ++t) {
        const int k = t % r.stages;
        if (t >= r.stages) barrier_wait(empty + k, (t / r.stages - 1) & 1);
        const int n = static_cast<int>(item / r.bands), oh0 = static_cast<int>(item % r.bands) * r.band;
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(full + k)),
                     "r"(bytes)
                     : "memory");
        T* dst = tiles + static_cast<int64_t>(k) * stage;
        copy_box(dst, x_map, c0, -s.pad_w, oh0 * S - s.pad_h, n, full + k);
        copy_box(dst + x_tile, dy_map, c0, 0, oh0, n, full + k);
      }
    }
  } else {
    // a consumer: output rows row0 ... row0 + R - 1 of each band, columns chunk * CW ... chunk * CW + CW - 1; each
    // input row they read (tile rows row0 * S ... (row0 + R - 1) * S + 2) converted once and added to every one of
    // them that reads it
    constexpr int NI = (R - 1) * S + 3;
    const int row0 = warp / r.chunks * R, chunk = warp % r.chunks;
    const int H = static_cast<int>(s.h);
    int t = 0;
    for (int64_t item = blockIdx.x; item < r.items; item += gridDim.x, ++t) {
      const int k = t % r.stages;
      barrier_wait(full + k, (t / r.stages) & 1);
      const int ih0 = static_cast<int>(item % r.bands) * r.band * S + row0 * S - s.pad_h;  // tile row row0 * S
      const T* tile = tiles + static_cast<int64_t>(k) * stage + lane * L;
      float d[R][CW][L];  // dy rows row0 ...: zeros past the band (and past out_h: the copy's zeros)
#pragma unroll
      for (int q = 0; q < R; ++q) {
        const T* dy_row = tile + x_tile + ((row0 + q) * r.dy_pitch + chunk * CW) * CG;
#pragma unroll
        for (int j = 0; j < CW; ++j) {
          if (row0 + q < r.band) {
            unpack(*reinterpret_cast<const P*>(dy_row + j * CG), d[q][j]);
          } else {
#pragma unroll
            for (int v = 0; v < L; ++v) d[q][j][v] = 0.f;
          }
        }
      }
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        if (ih0 + i < 0 || ih0 + i >= H || row0 * S + i >= r.x_rows) continue;
        const T* x_row = tile + ((row0 * S + i) * r.x_pitch + chunk * CW * S) * CG;
#pragma unroll
        for (int jx = 0; jx < COLS; ++jx) {
          float xv[L];
          unpack(*reinterpret_cast<const P*>(x_row + jx * CG), xv);
#pragma unroll
          for (int q = 0; q < R; ++q) {
            const int kh = i - q * S;
            if (kh < 0 || kh > 2) continue;
#pragma unroll
            for (int kw = 0; kw < 3; ++kw) {
              if (jx < kw || (jx - kw) % S != 0 || (jx - kw) / S >= CW) continue;
#pragma unroll
              for (int v = 0; v < L; ++v)
                acc[kh * 3 + kw][v] = fmaf(xv[v], d[q][(jx - kw) / S][v], acc[kh * 3 + kw][v]);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0) {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(empty + k)) : "memory");
      }
    }
  }

  // the block's sum per tap and channel: the consumers' sums in order, in the tiles' memory once every copy has landed
  __syncthreads();
  let_dependent_launch();  // depthwise_conv_wgrad_sum, which waits for this grid to complete before it reads
  float* sums = reinterpret_cast<float*>(shared + kTileHeader);  // [9][units][CG]
  if (warp < units) {
#pragma unroll
    for (int tap = 0; tap < 9; ++tap)
#pragma unroll
      for (int v = 0; v < L; ++v) sums[(tap * units + warp) * CG + lane * L + v] = acc[tap][v];
  }
  __syncthreads();
  const int C = static_cast<int>(s.channels), width = min(CG, C - c0);
  for (int i = threadIdx.x; i < 9 * width; i += blockDim.x) {
    const int tap = i / width, channel = i % width;
    float total = 0.f;
    for (int u = 0; u < units; ++u) total += sums[(tap * units + u) * CG + channel];
    partial[(static_cast<int64_t>(blockIdx.x) * 9 + tap) * C + c0 + channel] = total;
  }
#endif
}

// Block (bx, by): threadIdx.x walks groups of V channels, threadIdx.y the strips of a tile of band(by) rows. The
// groups are split evenly over the fewest blocks of at most 64 (72 groups: two blocks of 36, not 64 and 8, whose
// second block left most of its threads idle: 576 channels in bf16 ran 16% slower than PyTorch's, H100). The
// filters of 64 groups of 8 channels (K = 3) take 18 KB of shared memory, within the 48 KB a launch may ask for.
constexpr int kBand = 8;
constexpr int kMaxGroups = 64;
int band_of(unsigned by) { return static_cast<int>(std::min<unsigned>(by, kBand)); }

nhwc::Launch tile_launch(int64_t n, int64_t rows, int64_t strips, int64_t channels, int vector, unsigned classes) {
  const int64_t groups = (channels + vector - 1) / vector;
  const int64_t blocks = (groups + kMaxGroups - 1) / kMaxGroups;
  const int bx = static_cast<int>((groups + blocks - 1) / blocks);
  const int band = band_of(nhwc::kThreads / bx);
  const int by = nhwc::kThreads / bx / band * band;
  const int64_t positions = strip_positions(n, rows, strips, band);
  return {dim3(static_cast<unsigned>((positions + by - 1) / by), static_cast<unsigned>((groups + bx - 1) / bx),
               classes),
          dim3(bx, by)};
}

// Calls fn(V, K, S) with the three as std::integral_constant, for the shape's kernel size and stride; kStrideOne:
// whether stride 1 is built (dgrad runs in our kernels at stride 2 only: depthwise_kernel_steps).
template <typename T, bool kStrideOne, typename Fn>
cudaError_t dispatch(const DepthwiseShape& s, bool vectors, Fn&& fn) {
  auto by_kernel = [&](auto v) -> cudaError_t {
    auto by_stride = [&](auto k) -> cudaError_t {
      if constexpr (kStrideOne) {
        if (s.stride == 1) return fn(v, k, std::integral_constant<int, 1>{});
      }
      if (s.stride == 2) return fn(v, k, std::integral_constant<int, 2>{});
      return cudaErrorInvalidValue;
    };
    if (s.kernel == 3) return by_stride(std::integral_constant<int, 3>{});
    return cudaErrorInvalidValue;
  };
  if (vectors) return by_kernel(std::integral_constant<int, vector_size<T>()>{});
  return by_kernel(std::integral_constant<int, 1>{});
}

// Lets `kernel` launch with `bytes` of dynamic shared memory (above the 48 KB a launch gets without asking), once per
// device and kernel: `devices` is the kernel's own record of the devices done.
template <typename Kernel>
cudaError_t allow_shared_bytes(Kernel kernel, int bytes, std::atomic<uint64_t>& devices) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (devices.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (status == cudaSuccess) devices.fetch_or(bit, std::memory_order_relaxed);
  return status;
}

// Output rows a forward walk's thread walks at most (the band; out_h is split evenly into bands of at most this many).
// Stride 1: 7. Stride 2 in 16-bit types: 4 where out_h >= 28, else 16; in float: 2 where out_h >= 28, 8 where
// out_h >= 14, else 4.
// Stride 1 (a scratch harness, H100, bf16, batch 256, the ten stride-1 layers of bench_depthwise, 2026-11-26, two
// runs, x the bytes' time, the forward, plain forward and stride-1 dgrad together; every limit gave the same bits):
// bands of 7 against 16 took 1.21-1.24 against 1.30-1.33 on v2's 576-channel 14 x 14 layer, 1.22-1.26 against
// 1.29-1.32 on its 384-channel one, 1.10-1.17 against 1.15-1.25 on the 28 x 28 layers, 1.05-1.11 against 1.11-1.16 on
// the 56 x 56 ones and 1.07-1.08 against 1.13-1.14 on v1's 32-channel 112 x 112 one; the 7 x 7 layers launch the same
// band. The plain forwards' sum: 1.533-1.546 against 1.573-1.577 ms. Bands of 8 were 0.01-0.02 slower on the 56 x 56
// layers; 6, 5 and 4 up to 1.25x slower at 7 x 7, where the 7 rows make 2 bands. Before the filters were read as
// vectors (load_filters), bands of 7 and below were up to 1.3x slower than 16 at 14 x 14 and 7 x 7 (H200): each
// band's thread paid 36 filter loads.
// Stride 2 (the same harness, H200, the eight stride-2 layers, limits 32 ... 3): bands of 4 took 1.02-1.11 against
// 1.08-1.15 for 16 on the four layers with out_h >= 28, and 1.23-1.45 against 1.22-1.46 on the 14 x 14 and 28 x 28
// inputs (slower on three of the four): more, shorter threads fill the machine better where each one's extra row costs
// little. Stride 2 in float (H100, the eight stride-2 layers with bias and ReLU, limits 2, 4, 8, 16 and 32, three
// repetitions, 2026-11-26; a float walk's block takes twice the shared memory, 3 blocks a multiprocessor, not 4):
// against the 16-bit types' limits, 2 took v1 64@112 1.16 -> 1.11, v1 128@56 1.18 -> 1.14, v2 96@112 1.20 -> 1.14
// and v2 144@56 1.30 -> 1.24; 8 (two bands of 7) v1 256@28 1.32 -> 1.21 (v2 192@28 1.20 either way; 2: 1.25); 4
// (bands of 4 and 3) v1 512@14 1.38 -> 1.33 and v2 576@14 1.33 -> 1.29. In bf16 the same limits were no better
// but 4 at v2 576@14 (1.29 -> 1.23), which took v1 512@14 from 1.19 to 1.22.
int forward_walk_band(int stride, int64_t out_h, int element_bytes) {
  if (stride == 1) return 7;
  if (element_bytes == 4) return out_h >= 28 ? 2 : out_h >= 14 ? 8 : 4;
  return out_h >= 28 ? 4 : 16;
}

// The walk's launch: bands of at most forward_walk_band rows splitting out_h evenly; false where the grid cannot hold
// the threads or an image's sizes are not 32-bit (the caller runs the strip kernel then).
template <typename T, int S, bool Turned>
bool forward_walk(const DepthwiseShape& s, const void* x, const void* w, const void* bias, const void* residual,
                  void* y, int activation, cudaStream_t stream) {
  const int max_band = forward_walk_band(S, s.out_h, static_cast<int>(sizeof(T)));
  const int64_t bands = (s.out_h + max_band - 1) / max_band;
  const int band = static_cast<int>((s.out_h + bands - 1) / bands);
  const int64_t threads = s.n * bands * ((s.out_w + kWalkColumns - 1) / kWalkColumns) * (s.channels / kWalkVector);
  const int64_t blocks = (threads + kWalkThreads - 1) / kWalkThreads;
  if (blocks > 0x7fffffff || s.h * s.w * s.channels > 0x7fffffff || s.out_h * s.out_w * s.channels > 0x7fffffff) {
    return false;
  }
  const int shared_bytes =
      kWalkSlots * walk_columns<S>() * kWalkThreads * static_cast<int>(sizeof(Pack<T, kWalkVector>));
  auto launch = [&](auto activation_constant, auto has_bias) {
    constexpr int A = decltype(activation_constant)::value;
    constexpr bool B = decltype(has_bias)::value;
    auto kernel = depthwise_conv_forward_walk<T, S, A, B, Turned>;
    static std::atomic<uint64_t> devices{0};  // one per kernel (each takes at most 48 KB as the slots stand)
    if (allow_shared_bytes(kernel, shared_bytes, devices) != cudaSuccess) return;  // the launch error is kept
    kernel<<<static_cast<unsigned>(blocks), kWalkThreads, shared_bytes, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
        static_cast<const T*>(residual), static_cast<T*>(y), s, band, threads);
  };
  if constexpr (Turned) {
    launch(std::integral_constant<int, kActivationNone>{}, std::false_type{});
  } else {
    auto by_activation = [&](auto has_bias) {
      if (activation == kActivationRelu) {
        launch(std::integral_constant<int, kActivationRelu>{}, has_bias);
      } else if (activation == kActivationRelu6) {
        launch(std::integral_constant<int, kActivationRelu6>{}, has_bias);
      } else {
        launch(std::integral_constant<int, kActivationNone>{}, has_bias);
      }
    };
    if (bias != nullptr) {
      by_activation(std::true_type{});
    } else {
      by_activation(std::false_type{});
    }
  }
  return true;
}

template <typename T>
cudaError_t forward_typed(const DepthwiseShape& s, const void* x, const void* w, const void* bias,
                          const void* residual, void* y, int activation, bool vectors, cudaStream_t stream) {
  // 16-byte vectors: the walk; else the strip kernel
  if (vectors && s.kernel == 3 && s.stride == 1 &&
      forward_walk<T, 1, false>(s, x, w, bias, residual, y, activation, stream)) {
    return cudaGetLastError();
  }
  if (vectors && s.kernel == 3 && s.stride == 2 &&
      forward_walk<T, 2, false>(s, x, w, bias, residual, y, activation, stream)) {
    return cudaGetLastError();
  }
  return dispatch<T, true>(s, vectors, [&](auto v, auto k, auto stride) {
    constexpr int V = decltype(v)::value, K = decltype(k)::value, S = decltype(stride)::value;
    const int64_t strips = (s.out_w + kStrip - 1) / kStrip;
    auto shape = tile_launch(s.n, s.out_h, strips, s.channels, V, 1);
    const size_t shared_bytes = static_cast<size_t>(K) * K * shape.block.x * V * sizeof(float);
    depthwise_conv_forward<T, V, K, S><<<shape.grid, shape.block, shared_bytes, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(bias),
        static_cast<const T*>(residual), static_cast<T*>(y), s, activation, band_of(shape.block.y));
    return cudaGetLastError();
  });
}

// dy rows a stride-2 dgrad walk's thread writes from at most: 5 where 28 or more dy rows reach dx, else 8. The same
// harness as forward_walk_band's (limits 32 ... 3, the same bits for each): bands of 5 took 1.08-1.18x the bytes'
// time against 1.12-1.18x for 8 on the four layers with 56 x 56 or 112 x 112 inputs; on the others 8 was the best
// limit or within 0.01 of it.
int dgrad_walk_band(int64_t rows) { return rows >= 28 ? 5 : kDgradWalkBand; }

// The stride-2 dgrad walk's launch: bands of at most dgrad_walk_band dy rows splitting the rows evenly; false where
// the grid cannot hold the threads or an image's sizes are not 32-bit (the caller runs the strip kernel then).
template <typename T, int CX = kDgradWalkColumns>
bool dgrad_walk(const DepthwiseShape& s, const void* dy, const void* w, void* dx, cudaStream_t stream) {
  const int first_row = s.pad_h / 2;
  const int64_t rows = (s.h + s.pad_h - 1) / 2 - first_row + 1;  // dy rows that reach dx: two dx rows each
  const int max_band = dgrad_walk_band(rows);
  const int64_t bands = (rows + max_band - 1) / max_band;
  const int band = static_cast<int>((rows + bands - 1) / bands);
  const int64_t strips = (s.w + s.pad_w + CX - 1) / CX;
  const int64_t threads = s.n * ((rows + band - 1) / band) * strips * (s.channels / kWalkVector);
  const int64_t blocks = (threads + kWalkThreads - 1) / kWalkThreads;
  if (blocks > 0x7fffffff || s.h * s.w * s.channels > 0x7fffffff || s.out_h * s.out_w * s.channels > 0x7fffffff) {
    return false;
  }
  constexpr int shared_bytes =
      kDgradWalkSlots * (CX / 2 + 1) * kWalkThreads * static_cast<int>(sizeof(Pack<T, kWalkVector>));
  static std::atomic<uint64_t> devices{0};
  if (allow_shared_bytes(depthwise_conv_dgrad_walk<T, CX>, shared_bytes, devices) != cudaSuccess) return true;
  depthwise_conv_dgrad_walk<T, CX><<<static_cast<unsigned>(blocks), kWalkThreads, shared_bytes, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx), s, band, first_row,
      static_cast<int>(rows), threads);
  return true;
}

template <typename T>
cudaError_t dgrad_typed(const DepthwiseShape& s, const void* dy, const void* w, void* dx, bool vectors,
                        cudaStream_t stream) {
  if (vectors && s.kernel == 3 && s.stride == 2 && dgrad_walk<T>(s, dy, w, dx, stream)) return cudaGetLastError();
  // stride 1: the walk over dy with the filter turned 180 degrees, padded kernel - 1 - padding
  if (s.stride == 1) {
    const DepthwiseShape turned{s.n, s.out_h, s.out_w, s.channels, s.h, s.w, 3, 1, 2 - s.pad_h, 2 - s.pad_w};
    const bool taken = vectors && s.kernel == 3 && s.pad_h <= 2 && s.pad_w <= 2 &&
                       forward_walk<T, 1, true>(turned, dy, w, nullptr, nullptr, dx, kActivationNone, stream);
    return taken ? cudaGetLastError() : cudaErrorInvalidValue;
  }
  return dispatch<T, false>(s, vectors, [&](auto v, auto k, auto stride) {
    constexpr int V = decltype(v)::value, K = decltype(k)::value, S = decltype(stride)::value;
    const int64_t rows_t = (s.h - 1 + s.pad_h) / S - s.pad_h / S + 1;
    const int64_t columns_t = (s.w - 1 + s.pad_w) / S - s.pad_w / S + 1;
    const int64_t strips = (columns_t + kStrip - 1) / kStrip;
    auto shape = tile_launch(s.n, rows_t, strips, s.channels, V, S * S);
    const size_t shared_bytes = static_cast<size_t>(K) * K * shape.block.x * V * sizeof(float);
    depthwise_conv_dgrad<T, V, K, S><<<shape.grid, shape.block, shared_bytes, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(w), static_cast<T*>(dx), s, band_of(shape.block.y));
    return cudaGetLastError();
  });
}

constexpr int kWgradWalkMaxBand = 32;  // output rows a wgrad walk's band has at most

// How a wgrad walk splits the outputs: bands of at most kWgradWalkMaxBand rows (out_h split evenly), strips of
// wgrad_walk_thread_columns, blocks of up to 32 vectors of channels (42 below), and the blocks per channel group
// (parts): no more than every multiprocessor holds at once, each thread walking the same number of positions but in
// the last part. A block takes 32 vectors, a warp a position, where the last channel group is then at least half full
// (else the vectors split evenly): 144 vectors as 32, 32, 32, 32 and 16, not 5 x 29 (a warp reading one stretch of a
// position's channels, not parts of two). A scratch harness (H100, batch 256, 2026-11-26, one run of four repetitions
// in bf16 and two in fp16, x the bytes' time): v2 576@14 1.30-1.31 -> 1.28-1.29 in bf16 and fp16, 576@14/2
// 1.38-1.42 -> 1.36-1.38, 192@28 (24 + 24 before) 1.26-1.31 -> 1.24-1.27, 192@28/2 1.30-1.31 -> 1.27-1.29, 960@7
// 1.61-1.64 -> 1.60-1.63, the others within 0.01 (but one repetition). Blocks of a multiple of 4 vectors without the
// half-full test (20 + 16 for v2's 36) took 144@56/2 from 1.14 to 1.16-1.19; blocks of 24 (6 x 24 for 144 vectors,
// 10 x 24 for 240) were not faster. Up to 42 vectors (3 positions a block) whose even split would leave two blocks
// sharing a 32-byte sector of each position (36 as 18 + 18) run as one group: v2's 144 channels in bf16 (the harness,
// two repetitions) 1.20 -> 1.11x at stride 1 and 1.14 -> 1.10 at stride 2, where cuDNN's float16 wgrad took 1.11 and
// ours 1.15 (depthwise_float16_h100_2026-11-26s); on the committed tree 1.11 and 1.13 in float16, 1.10 and 1.10 in
// bfloat16 (-26t).
struct WgradWalkPlan {
  WgradWalkShape shape;
  dim3 block;
  int64_t channel_groups, parts;
  bool tiled = false;  // the tile kernel runs, in `threads` threads a block with `shared_bytes`, shaped by `tile`
  bool second = false;  // the second plan's walk (wgrad_walk_plan_for)
  bool plane = false;   // the plane kernel runs, in channel_groups x parts blocks, plane_bands items an image
  int plane_bands = 1;
  WgradTileShape tile;
  int threads, shared_bytes;
};

// The kernel, allowed its shared memory on the current device.
template <typename T, int S, int Slots, int Ahead, int Blocks, int CW>
cudaError_t wgrad_walk_allowed() {
  static std::atomic<uint64_t> devices{0};
  return allow_shared_bytes(depthwise_conv_wgrad_walk<T, S, Slots, Ahead, Blocks, CW>,
                            wgrad_walk_shared_bytes<T, S, Slots, CW>(), devices);
}

// The walk kernel's blocks a multiprocessor of the current device holds, asked once per device; 0 where it cannot
// launch (the caller then runs PyTorch's kernel).
template <typename T, int S, int Slots, int Ahead, int Blocks, int CW>
int wgrad_walk_blocks_per_multiprocessor() {
  static PerDevice blocks;
  return blocks.get_current([](int) {
    int n = 0;
    if (wgrad_walk_allowed<T, S, Slots, Ahead, Blocks, CW>() != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, depthwise_conv_wgrad_walk<T, S, Slots, Ahead, Blocks, CW>,
                                                      kWalkThreads, wgrad_walk_shared_bytes<T, S, Slots, CW>()) !=
            cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  });
}

// The parts (blocks a channel group) of a wgrad launch whose channel groups each have `work` blocks' (the walk) or
// items' (the tile) worth, `resident` blocks fitting the device at once: no more than fit beside the other groups,
// each part the same number of rounds but the last; 0 where no block fits.
int64_t balanced_parts(int64_t work, int64_t resident, int64_t channel_groups) {
  if (resident == 0) return 0;
  const int64_t parts = std::max<int64_t>(1, std::min(work, resident / channel_groups));
  const int64_t rounds = (work + parts - 1) / parts;
  return (work + rounds - 1) / rounds;
}

template <typename T, int S, int Slots = kWgradWalkSlots[S], int Ahead = kWgradWalkAhead[S],
          int Blocks = wgrad_walk_blocks<T>(), int CW = wgrad_walk_thread_columns<T>()>
WgradWalkPlan wgrad_walk_plan(const DepthwiseShape& s, int multiprocessors, bool even_split) {
  WgradWalkPlan plan;
  WgradWalkShape& r = plan.shape;
  const int64_t bands = (s.out_h + kWgradWalkMaxBand - 1) / kWgradWalkMaxBand;
  r.band = static_cast<int>((s.out_h + bands - 1) / bands);
  r.bands = static_cast<int>((s.out_h + r.band - 1) / r.band);
  r.strips = static_cast<int>((s.out_w + CW - 1) / CW);
  r.positions = s.n * r.bands * r.strips;
  const int64_t vectors = s.channels / kWalkVector;
  plan.channel_groups = (vectors + 31) / 32;
  int bx = static_cast<int>((vectors + plan.channel_groups - 1) / plan.channel_groups);
  if (even_split) {
    // the vectors split evenly (the second plan)
  } else if (vectors >= 32 && (vectors % 32 == 0 || vectors % 32 >= 16)) {
    bx = 32;  // a warp a position
  } else if (vectors * 3 <= kWalkThreads && bx * sizeof(Pack<T, kWalkVector>) % 32 != 0) {
    bx = static_cast<int>(vectors);  // one group: two would share a 32-byte sector of each position
  }
  plan.channel_groups = (vectors + bx - 1) / bx;
  plan.block = dim3(bx, kWalkThreads / bx);
  const int64_t blocks = (r.positions + plan.block.y - 1) / plan.block.y;
  const int64_t resident =
      static_cast<int64_t>(multiprocessors) * wgrad_walk_blocks_per_multiprocessor<T, S, Slots, Ahead, Blocks, CW>();
  plan.parts = balanced_parts(blocks, resident, plan.channel_groups);
  return plan;
}

template <typename T, int S, int Slots = kWgradWalkSlots[S], int Ahead = kWgradWalkAhead[S],
          int Blocks = wgrad_walk_blocks<T>(), int CW = wgrad_walk_thread_columns<T>()>
void wgrad_walk(const DepthwiseShape& s, const WgradWalkPlan& plan, const void* x, const void* dy, float* partial,
                cudaStream_t stream) {
  if (wgrad_walk_allowed<T, S, Slots, Ahead, Blocks, CW>() != cudaSuccess) return;  // the launch error is kept
  depthwise_conv_wgrad_walk<T, S, Slots, Ahead, Blocks, CW>
      <<<dim3(static_cast<unsigned>(plan.parts), static_cast<unsigned>(plan.channel_groups)), plan.block,
         wgrad_walk_shared_bytes<T, S, Slots, CW>(), stream>>>(static_cast<const T*>(x), static_cast<const T*>(dy),
                                                               partial, s, plan.shape);
}

// The plane kernel's blocks a multiprocessor of the current device holds, asked once per device; 0 where the query
// fails.
template <typename T, int S, int Side>
int wgrad_plane_blocks_per_multiprocessor() {
  static PerDevice blocks;
  return blocks.get_current([](int) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, depthwise_conv_wgrad_plane<T, S, Side>, 32 * kPlaneWarps,
                                                      0) != cudaSuccess) {
      cudaGetLastError();
      n = 0;
    }
    return n;
  });
}

// Whether the plane kernel takes the shape: padding 1 on both sides (the output as large as the input at stride 1,
// half of it at stride 2: its row and column counts are compile-time sizes), whole 4-byte words of channels, and
// images of 7 x 7 at stride 1 or 14 x 14 at either stride. Plan 0 runs it on all but 14 x 14 at stride 1, where the
// tile was faster on an H100; plan 2 runs it there (wgrad_walk_plan_for).
template <typename T>
bool plane_takes(const DepthwiseShape& s) {
  return ((s.h == 7 && s.stride == 1) || s.h == 14) && s.w == s.h && s.pad_h == 1 && s.pad_w == 1 &&
         s.out_h == (s.h - 1) / s.stride + 1 && s.out_w == s.out_h && s.channels % plane_lane_channels<T>() == 0;
}

bool plane_is_first(const DepthwiseShape& s) { return !(s.h == 14 && s.stride == 1); }

// The plane wgrad (depthwise_conv_wgrad_plane) where plane_takes the shape: blocks of a channel group of 32 lanes'
// channels, parts as the walk's over blocks of kPlaneWarps items; an item is an image, or half of its output rows where
// that takes fewer rows a thread in all (rounds of a part x rows an item): v2's 576 channels make 9 groups, and at 2
// blocks of 8 images a multiprocessor (132 of them, batch 256) 16 parts of 2 rounds, 7 rows each at stride 2, against
// 22 parts of 3 rounds of at most 4 rows with bands.
template <typename T>
bool wgrad_plane_plan(const DepthwiseShape& s, int multiprocessors, WgradWalkPlan& plan) {
  if (!plane_takes<T>(s)) return false;
  const int per_multiprocessor = s.h == 7         ? wgrad_plane_blocks_per_multiprocessor<T, 1, 7>()
                                 : s.stride == 1 ? wgrad_plane_blocks_per_multiprocessor<T, 1, 14>()
                                                 : wgrad_plane_blocks_per_multiprocessor<T, 2, 14>();
  if (per_multiprocessor == 0) return false;
  const int64_t lanes_channels = 32 * plane_lane_channels<T>();
  const int64_t resident = static_cast<int64_t>(multiprocessors) * per_multiprocessor;
  plan.channel_groups = (s.channels + lanes_channels - 1) / lanes_channels;
  int64_t best_rows = 0;
  for (int bands = 1; bands <= 2; ++bands) {
    const int64_t blocks = (s.n * bands + kPlaneWarps - 1) / kPlaneWarps;
    const int64_t parts = balanced_parts(blocks, resident, plan.channel_groups);  // resident > 0: parts > 0
    const int64_t rows = (blocks + parts - 1) / parts * ((s.out_h + bands - 1) / bands);
    if (bands == 1 || rows < best_rows) {
      best_rows = rows;
      plan.parts = parts;
      plan.plane_bands = bands;
    }
  }
  plan.plane = true;
  return true;
}

// The tile wgrad (depthwise_conv_wgrad_tile) for inputs at least kTileMinWidth and outputs at most kTileMaxOutW
// columns wide: bands of at most (kTileMaxWarps - 1) / chunks rows (out_h split evenly), fewer where kTileStages
// stages would not fit a block's shared memory, blocks of a group of tile_channels channels, and parts as the walk's.
constexpr int kTileMaxOutW = 14;
constexpr int kTileMinWidth = 8;
constexpr int kTileStages = 2;
constexpr int kTileMaxSharedBytes = 227 * 1024;

// cuTensorMapEncodeTiled from the driver (through the runtime: no link to libcuda), or null.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found);
#else
    const cudaError_t status = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      function = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// Whether the tile kernel's code for the current device is built for compute capability 9.0 or above (below, its body
// is empty) and the driver encodes tensor maps, once per device.
template <typename T, int S>
bool wgrad_tile_built() {
  static PerDevice built;
  return built.get_current([](int) {
    static std::atomic<uint64_t> shared_devices{0};
    cudaFuncAttributes attributes{};
    const bool yes = tensor_map_encoder() != nullptr &&
                     cudaFuncGetAttributes(&attributes, depthwise_conv_wgrad_tile<T, S>) == cudaSuccess &&
                     attributes.binaryVersion >= 90 &&
                     allow_shared_bytes(depthwise_conv_wgrad_tile<T, S>, kTileMaxSharedBytes, shared_devices) ==
                         cudaSuccess;
    if (!yes) cudaGetLastError();
    return yes ? 1 : 0;
  }) == 1;
}

// The tile kernel's blocks a multiprocessor holds at `threads` threads and `shared_bytes`, on the current device; 0
// where the query fails. Asked once per device and launch shape: asking on every call (twice a wgrad: its parts, then
// its launch) cost 0.3-0.9 us more host time a tile wgrad (a scratch harness, H100, 14 x 14 shapes, the faster of
// two interleaved runs of 15 rounds; the host's own spread between runs was up to 4 us).
template <typename T, int S>
int wgrad_tile_blocks_per_multiprocessor(int threads, int shared_bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, int> known;  // (device, threads, shared bytes) -> blocks
  const int device = current_device();
  if (device < 0) return 0;
  const auto key = std::make_tuple(device, threads, shared_bytes);
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(key);
  if (found != known.end()) return found->second;
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, depthwise_conv_wgrad_tile<T, S>, threads, shared_bytes) !=
      cudaSuccess) {
    cudaGetLastError();
    return 0;  // not remembered: asked again next time
  }
  known.emplace(key, blocks);
  return blocks;
}

template <typename T, int S>
bool wgrad_tile_plan(const DepthwiseShape& s, int multiprocessors, WgradWalkPlan& plan) {
  constexpr int CW = kTileColumns, CG = tile_channels<T>();
  if (s.out_w > kTileMaxOutW || s.w < kTileMinWidth || !wgrad_tile_built<T, S>()) return false;
  WgradTileShape& r = plan.tile;
  r.chunks = static_cast<int>((s.out_w + CW - 1) / CW);
  r.x_pitch = r.chunks * CW * S + 3 - S;
  r.dy_pitch = r.chunks * CW;
  r.stages = kTileStages;
  const int64_t room = kTileMaxSharedBytes - kTileHeader;
  int64_t stage_bytes = 0;
  const int64_t rows_most = (kTileMaxWarps - 1) / r.chunks * kTileRows;  // a warp per kTileRows rows and chunk
  for (int64_t most = std::min<int64_t>(rows_most, (256 - 3) / S + 1);; --most) {
    if (most < 1) return false;
    const int64_t bands = (s.out_h + most - 1) / most;
    r.band = static_cast<int>((s.out_h + bands - 1) / bands);
    r.bands = static_cast<int>((s.out_h + r.band - 1) / r.band);
    r.x_rows = (r.band - 1) * S + 3;
    stage_bytes = (r.x_rows * r.x_pitch + r.band * r.dy_pitch) * CG * static_cast<int64_t>(sizeof(T));
    if (r.stages * stage_bytes <= room) break;  // else fewer rows a band
  }
  r.items = s.n * r.bands;
  const int units = (r.band + kTileRows - 1) / kTileRows * r.chunks;
  const int64_t sums_bytes = static_cast<int64_t>(9) * units * CG * sizeof(float);
  if (sums_bytes > room) return false;
  plan.threads = (units + 1) * 32;
  plan.shared_bytes = static_cast<int>(kTileHeader + std::max(r.stages * stage_bytes, sums_bytes));
  const int per_multiprocessor = wgrad_tile_blocks_per_multiprocessor<T, S>(plan.threads, plan.shared_bytes);
  if (per_multiprocessor == 0) return false;
  plan.channel_groups = (s.channels + CG - 1) / CG;
  plan.parts = balanced_parts(r.items, static_cast<int64_t>(multiprocessors) * per_multiprocessor, plan.channel_groups);
  plan.tiled = plan.parts > 0;
  return plan.tiled;
}

// A 4-dimensional map of an NHWC tensor (channels fastest) with boxes of tile_channels channels x `columns` x `rows`
// x 1 image.
template <typename T>
bool encode_tile_map(CUtensorMap& map, const void* data, int64_t n, int64_t h, int64_t w, int64_t channels,
                     int columns, int rows) {
  constexpr CUtensorMapDataType type = sizeof(T) == 4                           ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                       : std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(channels), static_cast<cuuint64_t>(w),
                              static_cast<cuuint64_t>(h), static_cast<cuuint64_t>(n)};
  const cuuint64_t bytes = sizeof(T);
  const cuuint64_t strides[3] = {channels * bytes, w * channels * bytes, h * w * channels * bytes};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(tile_channels<T>()), static_cast<cuuint32_t>(columns),
                             static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  return tensor_map_encoder()(&map, type, 4, const_cast<void*>(data), dims, strides, box, steps,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <typename T, int S>
cudaError_t wgrad_tile(const DepthwiseShape& s, const WgradWalkPlan& plan, const void* x, const void* dy,
                       float* partial, cudaStream_t stream) {
  CUtensorMap x_map, dy_map;
  const WgradTileShape& r = plan.tile;
  if (!encode_tile_map<T>(x_map, x, s.n, s.h, s.w, s.channels, r.x_pitch, r.x_rows) ||
      !encode_tile_map<T>(dy_map, dy, s.n, s.out_h, s.out_w, s.channels, r.dy_pitch, r.band)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(plan.parts), static_cast<unsigned>(plan.channel_groups));
  depthwise_conv_wgrad_tile<T, S><<<grid, plan.threads, plan.shared_bytes, stream>>>(x_map, dy_map, partial, s,
                                                                                   plan.tile);
  return cudaGetLastError();
}

// The plan `which` (0, 1 or 2) at the shape's stride, or none (parts 0) where an image's sizes are not 32-bit, the grid
// cannot hold the channel groups (PyTorch's kernel runs then) or plan 2 has no kernel of its own for the shape.
// Plan 0: the plane kernel at padding 1 on 7 x 7 images at stride 1 and 14 x 14 ones at stride 2, else the tile where
// it takes the shape, else the walk as wgrad_walk_plan shapes it.
// Plan 1: the walk as it ran before ace379a, b0e189b and 66737c4, kWalkColumns output columns a thread and 2 blocks a
// multiprocessor in every type, the channel vectors split evenly between the blocks, never the tile. On an H200 (a
// scratch harness, batch 256, 2026-11-26ab, bf16 twice and fp16 once, x the bytes' time, the first plan -> the
// second): v2 144@56 1.47-1.53 -> 1.20 and 192@28 1.73-1.80 -> 1.46-1.47, v1 32@112 and 128@56 1.23-1.27 -> 1.18-1.20,
// but v1 256@28 1.31-1.35 -> 1.43-1.45 and the 7 x 7 layers 2.08-2.29 -> 2.23-2.45. On an H100 those commits had made
// 144@56 1.20 -> 1.11 (where cuDNN's float16 wgrad took 1.11) and 192@28 1.26-1.31 -> 1.24-1.27.
// Plan 2: the small-image kernel plan 0 passes over: the plane kernel on 14 x 14 images at stride 1 (padding 1), and
// where plan 0 runs the plane kernel, what ran there before it (the tile, else the walk). The plane kernel was the
// faster at 14 x 14 / 1 in a scratch harness on an H200 (29.2 against the tile's 33.9 us on v1's 512 channels) and the
// slower in bench_depthwise on an H100 (1.53 against 1.20 x the bytes' time), and in float32 at 14 x 14 / 2 it ran
// 0.0509 and 0.0572 ms on an H100 where the tile had run 0.0473 and 0.0529 on another (docs/benchmarks.md, 27r).
// No plan is the faster on every GPU and layer: under torch.backends.cudnn.benchmark the caller times the three and
// PyTorch's (csrc/ops/depthwise_ops.cpp).
template <typename T>
WgradWalkPlan wgrad_walk_plan_for(const DepthwiseShape& s, int multiprocessors, int which) {
  WgradWalkPlan plan{};
  if (s.h * s.w * s.channels > 0x7fffffff || s.out_h * s.out_w * s.channels > 0x7fffffff) return plan;
  const bool plane = plane_takes<T>(s);
  if (which == 1) {
    plan = s.stride == 1 ? wgrad_walk_plan<T, 1, kWgradWalkSlots[1], kWgradWalkAhead[1], 2, kWalkColumns>(
                               s, multiprocessors, true)
                         : wgrad_walk_plan<T, 2, kWgradWalkSlots[2], kWgradWalkAhead[2], 2, kWalkColumns>(
                               s, multiprocessors, true);
    plan.second = true;
  } else if (which == 2 && !plane) {
    return plan;  // plan 2 has no kernel of its own for the shape
  } else {
    // plan 0, or plan 2 on a shape the plane kernel takes: the plane kernel where it is this plan's (plane_is_first:
    // plan 0's but at 14 x 14 / 1, plan 2's there), else the tile, else the walk; where it is this plan's but its
    // occupancy could not be read, plan 0 runs the tile or the walk and plan 2 nothing
    const bool plane_here = plane && (which == 0) == plane_is_first(s);
    const bool planned = plane_here && wgrad_plane_plan<T>(s, multiprocessors, plan);
    if (!planned && plane_here && which == 2) return plan;
    if (!planned && !(s.stride == 1 ? wgrad_tile_plan<T, 1>(s, multiprocessors, plan)
                                    : wgrad_tile_plan<T, 2>(s, multiprocessors, plan))) {
      plan = s.stride == 1 ? wgrad_walk_plan<T, 1>(s, multiprocessors, false)
                           : wgrad_walk_plan<T, 2>(s, multiprocessors, false);
    }
  }
  if (plan.channel_groups > 65535) plan.parts = 0;
  return plan;
}

bool wgrad_takes(const DepthwiseShape& s) {
  return s.kernel == 3 && (s.stride == 1 || s.stride == 2) && s.out_h > 0 && s.out_w > 0 && s.n > 0;
}

// The parts of a launch, or 0 where the walk does not take the shape (PyTorch's kernel runs then).
template <typename T>
int64_t wgrad_parts_typed(const DepthwiseShape& s, int multiprocessors, int which) {
  return wgrad_walk_plan_for<T>(s, multiprocessors, which).parts;
}

// depthwise_conv_wgrad_sum (depthwise_conv_wgrad_sum_flat for at most kWgradSumFlatParts parts: the same sums in the
// same order, the same bits) after the wgrad kernel on `stream`, launched as its programmatic dependent where
// `dependent` (the device runs them): its launch overlaps the wgrad's last blocks (a scratch harness, H100, bf16, batch
// 256, 2026-11-26, three runs: the walk and sum together 1.55-1.59 -> 1.51-1.54x the bytes' time on v1's 1024-channel
// 7 x 7 layer, 1.67-1.69 -> 1.62-1.63 on v2's 960-channel one, 0.02-0.05 less on the 14 x 14 layers and no layer
// slower).
template <typename O>
cudaError_t wgrad_sum(const float* partial, int64_t parts, O* dw, int64_t channels, bool dependent,
                      cudaStream_t stream) {
  const bool flat = parts <= kWgradSumFlatParts;
  cudaLaunchConfig_t config = {};
  config.gridDim = flat ? dim3(static_cast<unsigned>((9 * channels + kWgradSumFlatThreads - 1) / kWgradSumFlatThreads))
                        : dim3(static_cast<unsigned>((channels + 31) / 32), 9);
  config.blockDim = dim3(flat ? kWgradSumFlatThreads : 32 * kWgradSumGroups);
  config.stream = stream;
  cudaLaunchAttribute serialization[1];
  serialization[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  serialization[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = serialization;
  config.numAttrs = dependent ? 1 : 0;
  const cudaError_t status =
      flat ? cudaLaunchKernelEx(&config, depthwise_conv_wgrad_sum_flat<O>, partial, parts, dw, channels)
           : cudaLaunchKernelEx(&config, depthwise_conv_wgrad_sum<O>, partial, parts, dw, channels);
  return status != cudaSuccess ? status : cudaGetLastError();
}

template <typename T>
cudaError_t wgrad_typed(const DepthwiseShape& s, const void* x, const void* dy, void* dw, bool dw_float,
                        float* partial, int64_t parts, int multiprocessors, int which, bool dependent_sum,
                        cudaStream_t stream) {
  const WgradWalkPlan plan = wgrad_walk_plan_for<T>(s, multiprocessors, which);
  if (plan.parts != parts || parts <= 0) return cudaErrorInvalidValue;
  if (plan.plane) {
    const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>(plan.channel_groups));
    const auto launch = [&](auto kernel) {
      kernel<<<grid, 32 * kPlaneWarps, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(dy), partial, s.n,
                                                   static_cast<int>(s.channels), plan.plane_bands);
    };
    if (s.h == 7) {
      launch(depthwise_conv_wgrad_plane<T, 1, 7>);
    } else if (s.stride == 1) {
      launch(depthwise_conv_wgrad_plane<T, 1, 14>);
    } else {
      launch(depthwise_conv_wgrad_plane<T, 2, 14>);
    }
  } else if (plan.tiled) {
    const cudaError_t status = s.stride == 1 ? wgrad_tile<T, 1>(s, plan, x, dy, partial, stream)
                                             : wgrad_tile<T, 2>(s, plan, x, dy, partial, stream);
    if (status != cudaSuccess) return status;
  } else if (plan.second && s.stride == 1) {
    wgrad_walk<T, 1, kWgradWalkSlots[1], kWgradWalkAhead[1], 2, kWalkColumns>(s, plan, x, dy, partial, stream);
  } else if (plan.second) {
    wgrad_walk<T, 2, kWgradWalkSlots[2], kWgradWalkAhead[2], 2, kWalkColumns>(s, plan, x, dy, partial, stream);
  } else if (s.stride == 1) {
    wgrad_walk<T, 1>(s, plan, x, dy, partial, stream);
  } else {
    wgrad_walk<T, 2>(s, plan, x, dy, partial, stream);
  }
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  if (dw_float) return wgrad_sum(partial, parts, static_cast<float*>(dw), s.channels, dependent_sum, stream);
  return wgrad_sum(partial, parts, static_cast<T*>(dw), s.channels, dependent_sum, stream);
}

// Fn<T>::run(args...) for the element type (ElementType has no other values).
template <template <typename> class Fn, typename... Args>
auto by_type(ElementType type, Args&&... args) -> decltype(Fn<float>::run(args...)) {
  switch (type) {
    case ElementType::kHalf:
      return Fn<__half>::run(args...);
    case ElementType::kBFloat16:
      return Fn<__nv_bfloat16>::run(args...);
    case ElementType::kFloat:
      break;
  }
  return Fn<float>::run(args...);
}

template <typename T>
struct Forward {
  template <typename... Args>
  static cudaError_t run(Args&&... args) { return forward_typed<T>(args...); }
};
template <typename T>
struct Dgrad {
  template <typename... Args>
  static cudaError_t run(Args&&... args) { return dgrad_typed<T>(args...); }
};
template <typename T>
struct Wgrad {
  template <typename... Args>
  static cudaError_t run(Args&&... args) { return wgrad_typed<T>(args...); }
};
template <typename T>
struct WgradParts {
  template <typename... Args>
  static int64_t run(Args&&... args) { return wgrad_parts_typed<T>(args...); }
};
int vector_elements(int element_bytes) { return 16 / element_bytes; }

}  // namespace

bool depthwise_vectors_fit(int64_t channels, int element_bytes) {
  return channels % vector_elements(element_bytes) == 0;
}

cudaError_t launch_depthwise_conv_forward(ElementType type, const DepthwiseShape& shape, const void* x,
                                          const void* weight, const void* bias, const void* residual, void* y,
                                          int activation, bool vectors, cudaStream_t stream) {
  return by_type<Forward>(type, shape, x, weight, bias, residual, y, activation, vectors, stream);
}

cudaError_t launch_depthwise_conv_dgrad(ElementType type, const DepthwiseShape& shape, const void* dy,
                                        const void* weight, void* dx, bool vectors, cudaStream_t stream) {
  return by_type<Dgrad>(type, shape, dy, weight, dx, vectors, stream);
}

int64_t depthwise_wgrad_parts(ElementType type, const DepthwiseShape& shape, int multiprocessors, int plan) {
  return wgrad_takes(shape) && plan >= 0 && plan < kDepthwiseWgradPlans
             ? by_type<WgradParts>(type, shape, multiprocessors, plan)
             : 0;
}

cudaError_t launch_depthwise_conv_wgrad(ElementType type, const DepthwiseShape& shape, const void* x, const void* dy,
                                        void* dw, bool dw_float, float* partial, int64_t parts, int multiprocessors,
                                        int plan, bool dependent_sum, cudaStream_t stream) {
  if (!wgrad_takes(shape) || parts <= 0 || plan < 0 || plan >= kDepthwiseWgradPlans) return cudaErrorInvalidValue;
  return by_type<Wgrad>(type, shape, x, dy, dw, dw_float, partial, parts, multiprocessors, plan, dependent_sum,
                        stream);
}

}  // namespace tcf
