// Copies into channels_last (NHWC) order, with our transposing kernel where the source is NCHW-contiguous (the
// gradient of a global mean pool arrives so: kernels/channels_last_copy_kernel.cu).
#pragma once

#include <ATen/ATen.h>

namespace tcf {

// src copied into dst, a channels_last-contiguous tensor of src's shape and dtype on src's device.
void copy_into_channels_last(const at::Tensor& src, const at::Tensor& dst);

// t itself where it is channels_last-contiguous, else a new channels_last copy of it.
at::Tensor channels_last_contiguous(const at::Tensor& t);

}  // namespace tcf
