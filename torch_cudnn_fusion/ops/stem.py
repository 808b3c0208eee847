"""A stem conv (stride 2, 1 to 4 input channels) in its space-to-depth form: the same sums as a stride-1 conv over
2x2 blocks of pixels stacked as channels (4 * C, zero-padded to 8 or 16), with the filter rearranged to match.

cuDNN's engines for a conv of 3 input channels at stride 2 are slow; the same sums over 16 channels at stride 1 run
much faster (see docs/benchmarks.md, "Stem convs in their space-to-depth form"). Which convs take the form is decided
in ops/decide.py (stem_plan); the rearranged input comes from our kernel (cudnn_fusion::space_to_depth, which also
casts it to the conv's dtype), the rearranged filter from cudnn_fusion::stem_filter: one gather by the plan's index,
whose gradient is one gather back (each filter element lands once). A conv layer in the form is one op call,
cudnn_fusion::stem_conv_bias_act or stem_conv_batch_norm_act, with its autograd node in C++ (csrc/ops/stem_form.h):
it keeps x in the conv's dtype and the filter as passed, not their larger rearrangements, and backward rearranges
them again. (Three op calls from Python, with saved-tensor hooks in Python, cost twice eager's host time on a batch
of 8, more than the form's GPU time saved there.)

Geometry, per spatial dim, for kernel k, padding p (both sides) and input size H: the output row i reads input rows
2i - p + t, t < k. With q = ceil(p / 2) block rows of zeros before the input, that row is block row i + Y (Y < k')
at offset a in its block, where t = 2 (Y - q) + a + p; k' = floor((k - 1 - p) / 2) + q + 1, and the rearranged
input has Ho + k' - 1 block rows, Ho = floor((H + 2p - k) / 2) + 1 the conv's output rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class StemPlan(NamedTuple):
    padding_pre: tuple[int, int]  # block rows and columns of zeros before x's first in the rearranged input
    out_size: tuple[int, int]  # the rearranged input's height and width, in blocks
    channels: int  # its channels: 8 (x of 1 or 2 channels) or 16
    kernel: tuple[int, int]  # the rearranged filter's size
    index: torch.Tensor  # [kh' * kw' * channels] int64 on x's device: for each element of the rearranged filter in
    # channels_last order, the filter's element (flattened in channels_last order) it is, or kh * kw * C for a zero
    inverse: torch.Tensor  # [kh * kw * C] int64 on x's device: for each of the filter's elements, where it lands
    dtype: torch.dtype  # the conv's (the rearranged input and filter are written in it)
    note: str
    form: list[int]  # the sizes above as the stem ops take them (csrc/ops/stem_form.h): padding_pre, out_size,
    # kernel, channels (made once: a call that the C++ record does not catch passes it as it is)


def block_geometry(size: int, kernel: int, padding: int) -> tuple[int, int, int]:
    """(block rows of zeros before the input, the rearranged filter's rows, the rearranged input's block rows) for one
    spatial dim (see the module's docstring)."""
    before = (padding + 1) // 2
    rows = (kernel - 1 - padding) // 2 + before + 1
    out = (size + 2 * padding - kernel) // 2 + 1
    return before, rows, out + rows - 1


def filter_index(in_channels: int, kernel_size: tuple[int, int], padding: tuple[int, int], channels: int,
                 kernel: tuple[int, int], before: tuple[int, int]) -> list[int]:
    """For each element of the rearranged filter, in channels_last order (Y, X, k), the index of the original
    filter's element in its flattened channels_last form [kh * kw * C], or C * kh * kw (a zero) where none lands
    there."""
    kh, kw = kernel_size
    zero = in_channels * kh * kw
    index = []
    for y in range(kernel[0]):
        for x in range(kernel[1]):
            for k in range(channels):
                block, c = divmod(k, in_channels)
                a, b = divmod(block, 2)
                ty = 2 * (y - before[0]) + a + padding[0]
                tx = 2 * (x - before[1]) + b + padding[1]
                inside = block < 4 and 0 <= ty < kh and 0 <= tx < kw
                index.append((ty * kw + tx) * in_channels + c if inside else zero)
    return index


def plan(x_size, w_size, padding, dtype: torch.dtype, device: torch.device) -> StemPlan:
    """The form's geometry for a conv of these sizes (stride 2, dilation 1, one group, padding on both sides)."""
    in_channels = int(x_size[1])
    geometry = [block_geometry(int(x_size[2 + i]), int(w_size[2 + i]), int(padding[i])) for i in range(2)]
    before = (geometry[0][0], geometry[1][0])
    kernel = (geometry[0][1], geometry[1][1])
    channels = 8 if in_channels <= 2 else 16
    index = filter_index(in_channels, (int(w_size[2]), int(w_size[3])), tuple(padding), channels, kernel, before)
    elements = in_channels * int(w_size[2]) * int(w_size[3])
    if sorted(index)[:elements] != list(range(elements)):  # with 2 * padding <= kernel each lands once (stem_plan)
        raise ValueError(f"the stem form of a {tuple(w_size)} filter with padding {tuple(padding)} would not place "
                         "each of its elements exactly once")
    inverse = [0] * elements
    for place, element in enumerate(index):
        if element < elements:
            inverse[element] = place
    note = (f"stem: the {w_size[2]}x{w_size[3]} stride-2 conv of {in_channels} channels runs as a {kernel[0]}x"
            f"{kernel[1]} stride-1 conv of {channels} (2x2 blocks of pixels as channels, space-to-depth: our kernel "
            "rearranges x)")
    out_size = (geometry[0][2], geometry[1][2])
    return StemPlan(before, out_size, channels, kernel, torch.tensor(index, dtype=torch.int64, device=device),
                    torch.tensor(inverse, dtype=torch.int64, device=device), dtype, note,
                    [*before, *out_size, *kernel, channels])


def input_like(x: torch.Tensor, stem: StemPlan) -> torch.Tensor:
    """An empty tensor with the properties of x's rearranged form (what a decision needs, without running the
    kernel): its sizes, the conv's dtype, channels_last, a fresh allocation's alignment, x's requires_grad."""
    form = torch.empty((x.shape[0], stem.channels, *stem.out_size), dtype=stem.dtype, device=x.device,
                       memory_format=torch.channels_last)
    return form.requires_grad_(x.requires_grad)


def weight_like(weight: torch.Tensor, stem: StemPlan) -> torch.Tensor:
    """An empty tensor with the properties of the rearranged filter (what a decision needs, without running the op):
    its sizes, the conv's dtype, channels_last, the weight's requires_grad."""
    form = torch.empty((weight.shape[0], stem.channels, *stem.kernel), dtype=stem.dtype, device=weight.device,
                       memory_format=torch.channels_last)
    return form.requires_grad_(weight.requires_grad)
