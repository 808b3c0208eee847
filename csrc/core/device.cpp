#include "core/device.h"

#include <mutex>
#include <unordered_map>

#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>

namespace tcf {

ComputeCapability compute_capability(int device) {
  thread_local int last_device = -1;  // the per-call path asks for one device again and again
  thread_local ComputeCapability last;
  if (device == last_device) return last;
  static std::mutex mutex;
  static std::unordered_map<int, ComputeCapability> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(device);
  if (found != known.end()) {
    last_device = device;
    last = found->second;
    return last;
  }
  int major = 0, minor = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
                  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess,
              "torch_cudnn_fusion: could not read the compute capability of cuda:", device);
  ComputeCapability cc{static_cast<int8_t>(major), static_cast<int8_t>(minor)};
  known.emplace(device, cc);
  last_device = device;
  last = cc;
  return cc;
}

int multiprocessor_count(int device) {
  static std::mutex mutex;
  static std::unordered_map<int, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = known.find(device);
  if (found != known.end()) return found->second;
  int count = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess,
              "torch_cudnn_fusion: could not read the multiprocessor count of cuda:", device);
  known.emplace(device, count);
  return count;
}

int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess) return device;
  cudaGetLastError();
  return -1;
}

int8_t pointer_alignment(const void* ptr) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  int8_t alignment = 16;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

std::array<int64_t, 4> conv_output_size(const std::array<int64_t, 4>& x_size, const std::array<int64_t, 4>& w_size,
                                        const std::array<int64_t, 2>& stride, const std::array<int64_t, 2>& pad_pre,
                                        const std::array<int64_t, 2>& pad_post,
                                        const std::array<int64_t, 2>& dilation) {
  std::array<int64_t, 4> y{x_size[0], w_size[0], 0, 0};
  for (int i = 0; i < 2; ++i) {
    int64_t extent = x_size[2 + i] + pad_pre[i] + pad_post[i];
    int64_t window = dilation[i] * (w_size[2 + i] - 1) + 1;
    y[2 + i] = (extent - window) / stride[i] + 1;
  }
  return y;
}

}  // namespace tcf
