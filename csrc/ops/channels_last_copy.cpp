#include "ops/channels_last_copy.h"

#include <ATen/MemoryOverlap.h>
#include <c10/core/DeviceGuard.h>

#include "kernels/channels_last_copy_kernel.h"
#include "ops/kernel_launch.h"
#include "ops/tensor_checks.h"

namespace tcf {

namespace {

// Where our kernel copies src into dst: real CUDA data (not a tracer's), src NCHW-contiguous, dst channels_last-
// contiguous and apart from it, 2- or 4-byte elements of one dtype, a shape its grid takes.
bool kernel_copies(const at::Tensor& src, const at::Tensor& dst) {
  return src.dim() == 4 && src.is_cuda() && !is_traced(src) && !is_traced(dst) && dst.device() == src.device() &&
         dst.scalar_type() == src.scalar_type() && dst.sizes() == src.sizes() && src.is_contiguous() &&
         dst.is_contiguous(at::MemoryFormat::ChannelsLast) && !src.is_neg() && !src.is_conj() &&
         (src.element_size() == 2 || src.element_size() == 4) && !dst.is_same(src) &&
         at::get_overlap_status(src, dst) == at::MemOverlapStatus::No &&
         nchw_to_nhwc_fits(src.size(0), src.size(1), src.size(2) * src.size(3));
}

}  // namespace

void copy_into_channels_last(const at::Tensor& src, const at::Tensor& dst) {
  if (!kernel_copies(src, dst)) {
    dst.copy_(src);
    return;
  }
  c10::DeviceGuard guard(src.device());
  auto status = launch_nchw_to_nhwc(src.data_ptr(), dst.data_ptr(), static_cast<int>(src.element_size()),
                                    src.size(0), src.size(1), src.size(2) * src.size(3), current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the channels_last copy kernel failed to launch: ",
              cudaGetErrorString(status));
}

at::Tensor channels_last_contiguous(const at::Tensor& t) {
  if (t.dim() != 4 || t.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return t.contiguous(at::MemoryFormat::ChannelsLast);
  }
  auto out = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::ChannelsLast));
  copy_into_channels_last(t, out);
  return out;
}

}  // namespace tcf
