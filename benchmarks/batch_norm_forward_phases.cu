// Driven by batch_norm_forward_phases.py, which writes `bnf_patched.cu` beside this file: a copy of
// csrc/kernels/batch_norm_forward_kernel.cu with phase stamps in its one-launch kernel and launch-shape knobs
// (g_blocks_per_sm, g_force_three, g_min_rows_per_thread). No torch: the kernel's launch function is called directly.
// For each BatchNorm shape (batch 256, bfloat16, NHWC) and each launch-shape variant, one line:
//   row,<channels>,<size>,<activation>,<variant>,<graph us>,<stream us>,<copy us>,<grid x>,<grid y>,<block x>,
//       <block y>,<max |y - the reference's y|>,<stamps us: statistics, barrier 1, finalize, barrier 2,
//       apply (to the last block's end)>,<the blocks' spread: 8 numbers, block_spread>
// graph us: 20 launches captured in a CUDA graph, the median of 15 replays, per launch; stream us: 20 launches
// issued back to back, the median of 15; copy us: a device-to-device copy of x's bytes, timed as `graph us`. The
// stamps (%globaltimer, block (0, 0) but the last, the latest block's end) come from one more launch; 0 where the
// variant runs three launches. Before a shape's rows, one line of its reference's bits (y of three launches at two
// blocks a multiprocessor, the saved mean and invstd), hashed: bits,<channels>,<size>,<hex>.
#include "bnf_patched.cu"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

namespace tcf {
int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}
}  // namespace tcf

using namespace tcf;

#define CHECK(call)                                                                    \
  do {                                                                                 \
    const cudaError_t status = (call);                                                 \
    if (status != cudaSuccess) {                                                       \
      std::fprintf(stderr, "CUDA error %s at line %d\n", cudaGetErrorString(status), __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// x[i]: a spread of values around 0.2, a fixed function of i
__global__ void fill(__nv_bfloat16* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = static_cast<uint32_t>(i * 2654435761u) ^ static_cast<uint32_t>(i >> 7) * 40503u;
    x[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 3.f + 0.2f);
  }
}

// *worst = max over i of |a[i] - b[i]| (non-negative floats compare as their bits)
__global__ void max_difference(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t n, unsigned* worst) {
  float local = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    local = fmaxf(local, fabsf(__bfloat162float(a[i]) - __bfloat162float(b[i])));
  }
  atomicMax(worst, __float_as_uint(local));
}

// *hash += the bits of a[i] times an odd function of i, over all i (wrapping): equal arrays give equal hashes, and
// arrays differing anywhere different ones but by chance
__global__ void bits_hash(const uint16_t* a, int64_t n, unsigned long long* hash) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    local += a[i] * (2 * static_cast<unsigned long long>(i) * 0x9E3779B97F4A7C15ull + 1);
  }
  atomicAdd(hash, local);
}

// The median per call of 15 timings of `issue` (which issues `calls` calls) on `stream`.
float median_us(const std::function<void()>& issue, int calls, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> us;
  for (int r = 0; r < 15; ++r) {
    CHECK(cudaEventRecord(start, stream));
    issue();
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(ms * 1000.f / calls);
  }
  std::sort(us.begin(), us.end());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return us[us.size() / 2];
}

// `launch` captured 20 times in a CUDA graph; the median per launch of its replays.
float graph_us(const std::function<void()>& launch, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 20; ++i) launch();
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));  // warm-up
  const float us = median_us([&] { CHECK(cudaGraphLaunch(exec, stream)); }, 20, stream);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

// The one launch's blocks' stamps (g_block_stamps: start, end of the statistics pass, exit from barrier 2, end) in
// us from the earliest start: the latest start; the median and latest end of the statistics pass; the earliest,
// median and latest exit from barrier 2; the median and latest end. Zeros where the launch left no stamps (three
// launches) or has more blocks than the probe keeps.
std::vector<double> block_spread(const nhwc::Launch& shape) {
  const int n = static_cast<int>(shape.grid.x * shape.grid.y);
  std::vector<double> spread(8, 0.0);
  if (n > kMostBlocks) return spread;
  std::vector<unsigned long long> all(static_cast<size_t>(kMostBlocks) * 4);
  CHECK(cudaMemcpyFromSymbol(all.data(), g_block_stamps, all.size() * sizeof(unsigned long long)));
  std::vector<double> column[4];
  unsigned long long first = ~0ull;
  for (int b = 0; b < n; ++b) {
    if (all[b * 4] == 0) return spread;
    first = std::min(first, all[b * 4]);
  }
  for (int b = 0; b < n; ++b) {
    for (int k = 0; k < 4; ++k) column[k].push_back((all[b * 4 + k] - first) / 1e3);
  }
  for (auto& c : column) std::sort(c.begin(), c.end());
  const auto median = [](const std::vector<double>& c) { return c[c.size() / 2]; };
  return {column[0].back(), median(column[1]), column[1].back(), column[2].front(),
          median(column[2]),  column[2].back(), median(column[3]), column[3].back()};
}

int main() {
  int multiprocessors = 0;
  CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device,%s,%d\n", prop.name, multiprocessors);
  struct Shape {
    int channels, size, activation;
  };
  // mobilenet_v2's BatchNorm shapes at batch 256 (benchmarks/batch_norm_forward.py), the narrow ones first
  const Shape shapes[] = {{64, 14, 0},  {96, 14, 0},   {160, 7, 0},  {320, 7, 0},  {32, 28, 0},
                          {24, 56, 0},  {16, 112, 0},  {192, 28, 2}, {384, 14, 2}, {576, 14, 2},
                          {960, 7, 2},  {1280, 7, 2},  {32, 112, 2}, {144, 56, 2}, {96, 112, 2}};
  struct Variant {
    const char* name;
    int blocks_per_sm, three_launches, min_rows_per_thread;
  };
  // blocks_per_sm 0: the kernel's own launch shape (PROBE_KERNEL_SHAPE)
  const Variant variants[] = {{"main", 0, 0, 0},          {"2 blocks/SM", 2, 0, 0},  {"three launches", 2, 1, 0},
                              {"1 block/SM", 1, 0, 0},    {"rows >= 16", 2, 0, 16},  {"rows >= 32", 2, 0, 32},
                              {"rows >= 64", 2, 0, 64},   {"three + rows >= 32", 2, 1, 32}};
  const int64_t batch = 256;
  int64_t most = 0;
  for (const Shape& s : shapes) most = std::max<int64_t>(most, batch * s.channels * s.size * s.size);
  __nv_bfloat16 *x, *y, *reference;
  CHECK(cudaMalloc(&x, most * 2));
  CHECK(cudaMalloc(&y, most * 2));
  CHECK(cudaMalloc(&reference, most * 2));
  unsigned* worst;
  CHECK(cudaMalloc(&worst, sizeof(unsigned)));
  fill<<<1024, 256>>>(x, most);
  CHECK(cudaDeviceSynchronize());
  float *weight, *bias, *mean, *invstd, *running_mean, *running_var;
  for (float** p : {&weight, &bias, &mean, &invstd, &running_mean, &running_var}) CHECK(cudaMalloc(p, 2048 * 4));
  const std::vector<float> ones(2048, 1.f);
  CHECK(cudaMemcpy(weight, ones.data(), 2048 * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(running_var, ones.data(), 2048 * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(bias, 0, 2048 * 4));
  CHECK(cudaMemset(running_mean, 0, 2048 * 4));
  double* partial;  // the most any variant asks: 2 sums x 8 blocks per multiprocessor x 2048 channels
  CHECK(cudaMalloc(&partial, static_cast<size_t>(2) * 8 * multiprocessors * 2048 * sizeof(double)));
  int64_t* steps;
  CHECK(cudaMalloc(&steps, 8));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  for (const Shape& s : shapes) {
    const int64_t rows = batch * s.size * s.size;
    const float copy = graph_us(
        [&] { CHECK(cudaMemcpyAsync(y, x, rows * s.channels * 2, cudaMemcpyDeviceToDevice, stream)); }, stream);
    // the reference: y of three launches (statistics, finalize, apply) at two blocks a multiprocessor, the shape every
    // version of the kernel had before 2026-12-07b; every variant's y is held against it
    g_blocks_per_sm = 2;
    g_force_three = 1;
    g_min_rows_per_thread = 0;
    const BatchNormActForwardArgs first{x,        nullptr, reference, weight,  bias,       mean, invstd,
                                        running_mean, running_var, running_mean, running_var, steps, partial,
                                        rows,     s.channels, 1e-5f, 0.1f, s.activation, 0.f};
    CHECK(launch_batch_norm_act_forward_nhwc(ElementType::kBFloat16, first, true, multiprocessors, stream));
    // its bits (y, then the saved mean and invstd), to compare builds of two versions of the kernel
    unsigned long long hashes[3] = {};
    unsigned long long* hash;
    CHECK(cudaMalloc(&hash, sizeof hashes));
    CHECK(cudaMemsetAsync(hash, 0, sizeof hashes, stream));
    bits_hash<<<1024, 256, 0, stream>>>(reinterpret_cast<const uint16_t*>(reference), rows * s.channels, hash);
    bits_hash<<<8, 256, 0, stream>>>(reinterpret_cast<const uint16_t*>(mean), 2 * s.channels, hash + 1);
    bits_hash<<<8, 256, 0, stream>>>(reinterpret_cast<const uint16_t*>(invstd), 2 * s.channels, hash + 2);
    CHECK(cudaMemcpy(hashes, hash, sizeof hashes, cudaMemcpyDeviceToHost));
    CHECK(cudaFree(hash));
    std::printf("bits,%d,%d,%016llx%016llx%016llx\n", s.channels, s.size, hashes[0], hashes[1], hashes[2]);
    for (const Variant& v : variants) {
      g_blocks_per_sm = v.blocks_per_sm;
      g_force_three = v.three_launches;
      g_min_rows_per_thread = v.min_rows_per_thread;
      const BatchNormActForwardArgs a{x,        nullptr, y,     weight,  bias,       mean, invstd,
                                      running_mean, running_var, running_mean, running_var, steps, partial,
                                      rows,     s.channels, 1e-5f, 0.1f, s.activation, 0.f};
      const auto launch = [&] {
        CHECK(launch_batch_norm_act_forward_nhwc(ElementType::kBFloat16, a, true, multiprocessors, stream));
      };
      launch();
      CHECK(cudaStreamSynchronize(stream));
      const float graph = graph_us(launch, stream);
      const float issued = median_us([&] { for (int i = 0; i < 20; ++i) launch(); }, 20, stream);
      unsigned long long stamps[8] = {};
      CHECK(cudaMemcpyToSymbol(g_stamps, stamps, sizeof stamps));
      void* block_stamps_at;
      CHECK(cudaGetSymbolAddress(&block_stamps_at, g_block_stamps));
      CHECK(cudaMemsetAsync(block_stamps_at, 0, sizeof(unsigned long long) * kMostBlocks * 4, stream));
      launch();
      CHECK(cudaStreamSynchronize(stream));
      CHECK(cudaMemcpyFromSymbol(stamps, g_stamps, sizeof stamps));
      const std::vector<double> blocks = block_spread(probe_launch_shape(rows, s.channels, 8, multiprocessors));
      CHECK(cudaMemsetAsync(worst, 0, sizeof(unsigned), stream));
      max_difference<<<1024, 256, 0, stream>>>(y, reference, rows * s.channels, worst);
      unsigned worst_bits = 0;
      CHECK(cudaMemcpy(&worst_bits, worst, sizeof worst_bits, cudaMemcpyDeviceToHost));
      float difference;
      std::memcpy(&difference, &worst_bits, sizeof difference);
      const nhwc::Launch shape = probe_launch_shape(a.rows, a.channels, 8, multiprocessors);
      std::printf("row,%d,%d,%d,%s,%.2f,%.2f,%.2f,%u,%u,%u,%u,%g", s.channels, s.size, s.activation, v.name, graph,
                  issued, copy, shape.grid.x, shape.grid.y, shape.block.x, shape.block.y, difference);
      for (int phase = 0; phase < 5; ++phase) {
        const bool stamped = !v.three_launches && stamps[0] != 0;
        std::printf(",%.2f", stamped ? (stamps[phase + 1] - stamps[phase]) / 1e3 : 0.0);
      }
      for (double value : blocks) std::printf(",%.2f", value);
      std::printf("\n");
    }
  }
  return 0;
}
