// What every part asks of a CUDA device and of a convolution's arithmetic: compute capability and multiprocessor
// count (read once per device), a pointer's alignment, the output size. No cuDNN or frontend headers: cheap to include.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace tcf {

struct ComputeCapability {
  int8_t major = 0;
  int8_t minor = 0;
};

ComputeCapability compute_capability(int device);  // cached per device
int multiprocessor_count(int device);              // cached per device
// The calling thread's current CUDA device, or -1 where it cannot be read (the CUDA error is cleared).
int current_device();

// A non-negative int asked of each device once and remembered for it: get(device, ask) returns what ask() returned
// the first time it was called for `device` (the caller's current device). Lock-free; devices past the 64th are
// asked every time. For what depends on the device, such as a kernel's occupancy: one static per kernel.
class PerDevice {
 public:
  // get() for the current device, ask(device) asked; 0, ask not called, where the device cannot be read.
  template <typename Ask>
  int get_current(Ask&& ask) {
    const int device = current_device();
    return device < 0 ? 0 : get(device, [&] { return ask(device); });
  }

  template <typename Ask>
  int get(int device, Ask&& ask) {
    if (device < 0 || device >= kDevices) return ask();
    int known = known_[device].load(std::memory_order_acquire);  // the value + 1; 0: not asked yet
    if (known == 0) {
      known = ask() + 1;
      known_[device].store(known, std::memory_order_release);
    }
    return known - 1;
  }

 private:
  static constexpr int kDevices = 64;
  std::atomic<int> known_[kDevices] = {};
};

// Byte alignment of a data pointer, capped at 16 (what cuDNN's vectorized engines ask for).
int8_t pointer_alignment(const void* ptr);

// N, K, P, Q of a convolution of x [N, C, H, W] with w [K, C / groups, R, S]; the one place the formula lives
// (callers check first that the padded input is at least the dilated kernel: check_conv_problem).
std::array<int64_t, 4> conv_output_size(const std::array<int64_t, 4>& x_size, const std::array<int64_t, 4>& w_size,
                                        const std::array<int64_t, 2>& stride, const std::array<int64_t, 2>& pad_pre,
                                        const std::array<int64_t, 2>& pad_post,
                                        const std::array<int64_t, 2>& dilation);

}  // namespace tcf
