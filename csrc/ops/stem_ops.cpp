#include "ops/stem_ops.h"

#include <c10/core/DeviceGuard.h>

#include "kernels/space_to_depth_kernel.h"
#include "ops/kernel_launch.h"
#include "ops/run_graph.h"
#include "ops/tensor_checks.h"

namespace tcf {

at::Tensor space_to_depth(const at::Tensor& x, at::IntArrayRef padding_pre, at::IntArrayRef out_size,
                          std::optional<at::ScalarType> dtype) {
  check_4d_cuda(x, "x");
  const int64_t channels = x.size(1);
  TORCH_CHECK(channels >= 1 && channels <= 4, "cudnn_fusion: space_to_depth takes x of 1 to 4 channels, got x of shape ",
              x.sizes());
  TORCH_CHECK(padding_pre.size() == 2 && padding_pre[0] >= 0 && padding_pre[1] >= 0,
              "cudnn_fusion: padding_pre must be two sizes >= 0 (height, width), got ", padding_pre);
  TORCH_CHECK(out_size.size() == 2 && out_size[0] >= 0 && out_size[1] >= 0,
              "cudnn_fusion: out_size must be two sizes >= 0 (height, width), got ", out_size);
  const at::ScalarType out_type = dtype.value_or(x.scalar_type());
  TORCH_CHECK(out_type == at::kHalf || out_type == at::kBFloat16,
              "cudnn_fusion: space_to_depth writes float16 or bfloat16, got dtype ", out_type);
  const int64_t out_channels = channels <= 2 ? 8 : 16;
  auto out = at::empty({x.size(0), out_channels, out_size[0], out_size[1]},
                       x.options().dtype(out_type).memory_format(at::MemoryFormat::ChannelsLast));
  if (out.numel() == 0) return out;
  poison_output(out);  // under the tests' poisoning: an element the kernel did not write shows
  SpaceToDepthShape shape{x.size(0),      channels,       x.size(2),      x.size(3),   x.stride(0),
                          x.stride(1),    x.stride(2),    x.stride(3),    padding_pre[0], padding_pre[1],
                          out_size[0],    out_size[1],    out_channels};
  c10::DeviceGuard guard(x.device());
  const auto status = launch_space_to_depth(element_type(x.scalar_type()), element_type(out_type), x.data_ptr(),
                                            out.data_ptr(), shape, current_stream());
  TORCH_CHECK(status == cudaSuccess, "cudnn_fusion: the space-to-depth kernel failed to launch: ",
              cudaGetErrorString(status));
  return out;
}

}  // namespace tcf
