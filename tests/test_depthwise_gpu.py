"""Our NHWC depthwise convolution kernels (csrc/kernels/depthwise_conv_kernel.cu): the forward with bias, residual and
ReLU fused, the plain forward and wgrad in half precision, dgrad (the steps where they beat PyTorch's,
csrc/ops/depthwise_ops.h), in whole conv layers against eager and a float64 reference; where they run (conv layers, conv + BatchNorm in training and eval) and where
they do not, with the reason."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf

from conftest import (assert_as_accurate_as_eager, capture_training_step, gpu, reference_conv_bias_act,
                      without_ambiguous_relu6_gradient)

pytestmark = gpu
CL = torch.channels_last
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# channels, kernel, stride, padding, height, width, bias, residual, relu (True, False or "relu6")
CASES = {
    "3x3-s1": (32, 3, 1, 1, 14, 14, True, False, True),
    "3x3-s2-odd-channels": (13, 3, 2, 1, 15, 13, True, False, True),  # one element at a time
    "3x3-s2-even-size": (64, 3, 2, 1, 16, 16, False, False, True),
    "3x3-s1-residual-no-relu": (40, 3, 1, 1, 9, 11, True, True, False),
    "3x3-s2-no-padding": (24, 3, 2, 0, 10, 9, True, False, False),
    "3x3-s2-wide-padding": (16, 3, 2, 3, 9, 7, True, False, True),
    # channel groups split evenly over blocks: 72 (bf16) or 144 (float32) groups of a vector; 125 groups of 8 in two
    # blocks of 63, one thread past the last channel
    "3x3-s1-576-channels": (576, 3, 1, 1, 7, 9, True, False, True),
    "3x3-s2-1000-channels": (1000, 3, 2, 1, 6, 6, True, True, True),
    "3x3-s1-relu6": (48, 3, 1, 1, 11, 12, True, False, "relu6"),  # inputs scaled by 4: some outputs clip at 6
    "3x3-s2-relu6-odd-channels": (21, 3, 2, 1, 9, 9, True, True, "relu6"),
    # the stride-1 walk (depthwise_conv_forward_walk): strips of 4 columns, the last partial (37 = 9 * 4 + 1), with a
    # residual; many strips; padding 2; bands of at most 7 rows splitting 13 rows as 7 + 6 and 67 as nine of 7 and one
    # of 4, with ReLU6
    "3x3-s1-wide-tiles": (64, 3, 1, 1, 13, 37, True, True, True),
    "3x3-s1-ring-tiles": (64, 3, 1, 1, 11, 130, True, True, True),
    "3x3-s1-ring-padding-2": (128, 3, 1, 2, 6, 5, True, False, True),
    "3x3-s1-rows-tiles": (40, 3, 1, 1, 13, 37, True, True, True),
    "3x3-s1-bands": (16, 3, 1, 1, 67, 6, True, True, "relu6"),
    # the stride-2 walk's bands: out_h 29 (float: bands of 2, the last of 1; 16-bit types: 4) and 14 (float: two of 7)
    "3x3-s2-tall": (16, 3, 2, 1, 57, 9, True, False, True),
    "3x3-s2-two-bands": (32, 3, 2, 1, 28, 10, True, True, False),
    # the stride-2 dgrad walk (depthwise_conv_dgrad_walk): strips of 4 dx columns from b = 0 (b = iw + padding), 35
    # columns + 1 of padding in 9 strips; bands of at most 8 dy rows splitting 10 rows as 5 + 5, and of at most 5
    # (28 rows or more) splitting 34 as six of 5 and one of 4; there the stride-2 forward's bands of at most 4 split
    # its 34 output rows as eight of 4 and one of 2
    "3x3-s2-wide-dgrad-tiles": (24, 3, 2, 1, 19, 35, True, False, True),
    "3x3-s2-dgrad-bands": (32, 3, 2, 1, 67, 9, True, False, True),
    # stride 1 with padding 0 and 2: in half precision dgrad runs as the walk with the filter turned, padded 2 and 0
    "3x3-s1-no-padding": (32, 3, 1, 0, 10, 12, True, False, True),
    "3x3-s1-padding-2": (32, 3, 1, 2, 9, 8, True, False, True),
}


def _leaf(*shape, dtype):
    return torch.randn(*shape, device="cuda", dtype=torch.float64).to(dtype).contiguous(memory_format=CL)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_depthwise_conv_matches_float64(extension, no_tf32, dtype, case):
    """Forward, dx, dweight, dbias and the residual's gradient, fused (strict: our kernels must run) vs eager in the
    same dtype, both against float64; three calls on fresh inputs."""
    channels, kernel, stride, padding, height, width, has_bias, has_residual, relu = CASES[case]
    torch.manual_seed(0)
    activation = relu if isinstance(relu, str) else ("relu" if relu else None)
    for _ in range(3):
        x = _leaf(3, channels, height, width, dtype=dtype)
        if activation == "relu6":
            x = (x.float() * 4).to(dtype)
        weight = (torch.randn(channels, 1, kernel, kernel, device="cuda") / kernel).to(dtype)
        bias = torch.randn(channels, device="cuda").to(dtype) if has_bias else None
        out_size = [(s + 2 * padding - kernel) // stride + 1 for s in (height, width)]
        residual = _leaf(3, channels, *out_size, dtype=dtype) if has_residual else None
        grad = _leaf(3, channels, *out_size, dtype=dtype)
        if activation == "relu6":
            inputs64 = [t.detach().double() if t is not None else None for t in (x, weight, bias, residual)]
            z64 = reference_conv_bias_act(*inputs64, stride, padding, 1, channels, False)
            grad = without_ambiguous_relu6_gradient(grad.detach(), z64, dtype)
        results = []
        for run in ("fused", "eager", "reference"):
            precision = torch.float64 if run == "reference" else dtype
            leaves = [t.detach().to(precision).requires_grad_() if t is not None else None
                      for t in (x, weight, bias, residual)]
            if run == "fused":
                # strict: our kernels must run (ReLU's backward is a cuDNN graph where channels do not fill our
                # ReLU-backward kernel's vectors, which cuDNN refuses for float32 without TF32: eager then)
                strict = not relu or channels % 8 == 0
                y = tcf.conv2d_bias_act(*leaves, stride, padding, 1, channels, activation, strict=strict)
                assert y.is_contiguous(memory_format=CL)
            else:
                y = reference_conv_bias_act(*leaves, stride, padding, 1, channels, relu)
            y.backward(grad.to(precision))
            results.append([y.detach()] + [t.grad for t in leaves if t is not None])
        names = ["y", "dx", "dweight"] + (["dbias"] if has_bias else []) + (["dresidual"] if has_residual else [])
        for name, fused, eager, reference in zip(names, *results):
            assert fused.dtype == dtype and fused.shape == reference.shape, name
            assert_as_accurate_as_eager(f"{case} {name}", fused, eager, reference, dtype)
    # which kernels ran: ours for the forward (every case has a bias or ReLU to fuse), and for dgrad at stride 2
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, weight, bias, residual)]
    ran = _profile_kernels(lambda: tcf.conv2d_bias_act(*leaves, stride, padding, 1, channels,
                                                       activation).backward(grad))
    assert any("depthwise_conv_forward" in n for n in ran), ran
    assert any("depthwise_conv_dgrad" in n for n in ran) == (stride == 2), ran
    vectors = channels * dtype.itemsize % 16 == 0  # the walks take channels that fill 16-byte vectors
    assert any("depthwise_conv_dgrad_walk<" in n for n in ran) == (stride == 2 and vectors), ran
    # at stride 1 the dgrad is the walk with the filter turned, where the channels fill 16-byte vectors
    turned_walk = stride == 1 and vectors and padding < kernel
    assert any("depthwise_conv_forward_walk<" in n and ", true>" in n for n in ran) == turned_walk, ran
    # wgrad in our kernel where the channels fill its 16-byte vectors, in bfloat16 and float16, in float32 at stride 2
    # and on outputs of at most 14 x 14
    ours_wgrad = vectors and (dtype != torch.float32 or stride == 2 or max(out_size) <= 14)
    assert any("depthwise_conv_wgrad" in n for n in ran) == ours_wgrad, ran
    if stride == 1 and dtype == torch.bfloat16 and padding < kernel:  # no cuDNN dgrad: the walk or cuDNN's forward
        assert not any("dgrad" in n and "depthwise_conv_dgrad" not in n for n in ran), ran


@pytest.mark.parametrize("stride, padding, dtype, channels, out_size, forward, dgrad, wgrad", [
    (1, 1, "bfloat16", 64, (56, 56), "ours", "ours", "ours"), (1, 0, "bfloat16", 64, (7, 7), "ours", "ours", "ours"),
    (1, 2, "bfloat16", 64, (-1, -1), "ours", "ours", "ours"),  # a traced size: ours at every size
    # padding past the filter: no forward computes that dgrad
    (1, 3, "bfloat16", 64, (56, 56), "ours", "pytorch", "ours"),
    # channels that do not fill 16-byte vectors
    (1, 1, "bfloat16", 60, (56, 56), "pytorch", "turned_forward", "pytorch"),
    # float16: the walks at stride 1, but cuDNN's own dgrad where the channels do not fill the vectors; float32: the
    # turned walk at stride 1 where they fill the vectors (62 channels of 4 bytes do not)
    (1, 1, "float16", 64, (56, 56), "ours", "ours", "ours"),
    (1, 1, "float16", 60, (7, 7), "pytorch", "pytorch", "pytorch"),
    # float32's stride-1 plain forward and wgrad: ours on outputs of at most 14 x 14, PyTorch's beyond; a traced size
    # names both
    (1, 1, "float32", 64, (56, 56), "pytorch", "ours", "pytorch"),
    (1, 1, "float32", 64, (14, 15), "pytorch", "ours", "pytorch"),
    (1, 1, "float32", 64, (15, 14), "pytorch", "ours", "pytorch"),
    (1, 1, "float32", 64, (14, 14), "ours", "ours", "ours"), (1, 1, "float32", 64, (7, 7), "ours", "ours", "ours"),
    (1, 1, "float32", 64, (-1, -1), "ours_small", "ours", "ours_small"),
    (1, 1, "float32", 62, (7, 7), "pytorch", "pytorch", "pytorch"),
    (2, 1, "bfloat16", 64, (28, 28), "ours", "ours", "ours"),  # the stride-2 walk, also without an epilogue
    (2, 1, "float16", 64, (28, 28), "ours", "ours", "ours"),
    # float32 at stride 2: PyTorch's plain forward, our wgrad, at every size
    (2, 1, "float32", 64, (28, 28), "pytorch", "ours", "ours"),
    (2, 1, "float32", 64, (7, 7), "pytorch", "ours", "ours"),
    (2, 1, "bfloat16", 60, (7, 7), "pytorch", "ours", "pytorch"),  # channels that do not fill the 16-byte vectors
])
def test_the_depthwise_backward_rule(extension, stride, padding, dtype, channels, out_size, forward, dgrad, wgrad):
    """What runs a depthwise 3x3 layer's forward, dgrad and wgrad (csrc/ops/depthwise_ops.cpp,
    depthwise_kernel_steps) for an output of out_size (-1: traced), as Python's decision reads it; the forward in our
    kernel always with an epilogue, and without one (`forward`) where the channels fill 16-byte vectors in bfloat16
    and float16, and in float32 on small outputs at stride 1."""
    from torch_cudnn_fusion.ops import decide

    assert extension.depthwise_small_output == 14
    w_size = [channels, 1, 3, 3]
    verdict = extension.depthwise_kernel_verdict(channels, w_size, [stride] * 2, [padding] * 2, [1, 1], channels,
                                                 True, dtype, False, list(out_size))
    assert (verdict["unmet"], verdict["forward"], verdict["dgrad"], verdict["wgrad"]) == ("", forward, dgrad, wgrad), \
        verdict
    steps = decide.depthwise_kernel_steps(channels, tuple(w_size), (stride,) * 2, (padding,) * 2, (1, 1), channels,
                                          True, getattr(torch, dtype), True, out_size)
    assert steps == ("ours", dgrad, wgrad), steps
    grouped = extension.depthwise_kernel_verdict(64, [64, 2, 3, 3], [stride] * 2, [padding] * 2, [1, 1], 32, True,
                                                 dtype, True, list(out_size))
    assert grouped["unmet"] and (grouped["forward"], grouped["dgrad"], grouped["wgrad"]) == ("pytorch", "pytorch",
                                                                                             "pytorch"), grouped


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_stride1_dgrad_off_a_vector_boundary_runs_what_the_rule_runs_without_vectors(extension, dtype):
    """cudnn_fusion::conv_dgrad at stride 1: the walk with the filter turned where grad_z is on a 16-byte boundary; one
    element off it (channels that fill the vectors, so the rule picked our kernel), what the rule picks where the
    channels do not fill them (depthwise_dgrad_without_vectors): in bfloat16 cuDNN's forward with the filter turned,
    in float16 and float32 PyTorch's own dgrad, no forward kernel; each as accurate as PyTorch's dgrad against
    float64."""
    torch.manual_seed(0)
    channels = 64
    dz = _leaf(2, channels, 9, 11, dtype=dtype)
    dz_off = torch.empty(dz.numel() + 1, device="cuda", dtype=dtype)[1:].as_strided(dz.shape, dz.stride())
    dz_off.copy_(dz)
    assert dz_off.is_contiguous(memory_format=CL) and dz_off.data_ptr() % 16 != 0
    weight = torch.randn(channels, 1, 3, 3, device="cuda").to(dtype)
    args = (list(dz.shape), [1, 1], [1, 1], [1, 1], [1, 1], channels)
    reference = torch.ops.aten.convolution_backward(dz.double(), dz.double(), weight.double(), None, [1, 1], [1, 1],
                                                    [1, 1], False, [0, 0], channels, [True, False, False])[0]
    eager = torch.ops.aten.convolution_backward(dz, dz, weight, None, [1, 1], [1, 1], [1, 1], False, [0, 0],
                                                channels, [True, False, False])[0]
    turned_forward = dtype == torch.bfloat16
    for grad, walk in ((dz, True), (dz_off, False)):
        ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_dgrad(grad, weight, *args))
        assert any("depthwise_conv_forward_walk<" in n and ", true>" in n for n in ran) == walk, ran
        assert any("conv2d_c1_k1" in n for n in ran) == (not walk and turned_forward), ran
        if not walk and not turned_forward:
            assert not any("depthwise_conv" in n for n in ran) and ran, ran
        dx = torch.ops.cudnn_fusion.conv_dgrad(grad, weight, *args)
        assert_as_accurate_as_eager("dx", dx, eager, reference, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_weight_off_a_vector_boundary_keeps_the_walks_out_and_matches_float64(extension, no_tf32, dtype):
    """The walks read the filters as vectors. With the weight one element past a 16-byte boundary the forward and the
    stride-2 dgrad run their strip kernels, and the stride-1 dgrad what the rule runs without vectors
    (depthwise_dgrad_without_vectors); on the boundary the three run the walks. Each as accurate as eager's against
    float64."""
    torch.manual_seed(0)
    channels = 64
    x = _leaf(2, channels, 9, 11, dtype=dtype)
    weight = torch.randn(channels, 1, 3, 3, device="cuda").to(dtype)
    weight_off = torch.empty(weight.numel() + 1, device="cuda", dtype=dtype)[1:].view_as(weight)
    weight_off.copy_(weight)
    assert weight_off.is_contiguous() and weight_off.data_ptr() % 16 != 0
    bias = torch.randn(channels, device="cuda").to(dtype)
    eager = F.relu(F.conv2d(x, weight, bias, 1, 1, 1, channels))
    reference = F.relu(F.conv2d(x.double(), weight.double(), bias.double(), 1, 1, 1, channels))
    args = (list(x.shape), [1, 1], [1, 1], [1, 1], [1, 1], channels)
    eager_dx = torch.ops.aten.convolution_backward(x, x, weight, None, [1, 1], [1, 1], [1, 1], False, [0, 0],
                                                   channels, [True, False, False])[0]
    reference_dx = torch.ops.aten.convolution_backward(x.double(), x.double(), weight.double(), None, [1, 1], [1, 1],
                                                       [1, 1], False, [0, 0], channels, [True, False, False])[0]
    dz2 = _leaf(2, channels, 5, 6, dtype=dtype)  # stride 2 of x
    args2 = (list(x.shape), [2, 2], [1, 1], [1, 1], [1, 1], channels)
    eager_dx2 = torch.ops.aten.convolution_backward(dz2, x, weight, None, [2, 2], [1, 1], [1, 1], False, [0, 0],
                                                    channels, [True, False, False])[0]
    reference_dx2 = torch.ops.aten.convolution_backward(dz2.double(), x.double(), weight.double(), None, [2, 2],
                                                        [1, 1], [1, 1], False, [0, 0], channels,
                                                        [True, False, False])[0]
    for w, walk in ((weight, True), (weight_off, False)):
        def forward():
            return tcf.conv2d_bias_act(x, w, bias, None, 1, 1, 1, channels, "relu", strict=True)
        ran = _profile_kernels(forward)
        assert any("depthwise_conv_forward_walk<" in n for n in ran) == walk, ran
        assert any("depthwise_conv_forward<" in n for n in ran) == (not walk), ran
        assert_as_accurate_as_eager("y", forward(), eager, reference, dtype)
        ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_dgrad(x, w, *args))
        assert any("depthwise_conv_forward_walk<" in n and ", true>" in n for n in ran) == walk, ran
        dx = torch.ops.cudnn_fusion.conv_dgrad(x, w, *args)
        assert_as_accurate_as_eager("dx", dx, eager_dx, reference_dx, dtype)
        ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_dgrad(dz2, w, *args2))
        assert any("depthwise_conv_dgrad_walk<" in n for n in ran) == walk, ran
        assert any("depthwise_conv_dgrad<" in n for n in ran) == (not walk), ran
        dx2 = torch.ops.cudnn_fusion.conv_dgrad(dz2, w, *args2)
        assert_as_accurate_as_eager("dx at stride 2", dx2, eager_dx2, reference_dx2, dtype)


@pytest.mark.parametrize("batch, channels, height, width, kernel", [
    (16, 96, 30, 30, "walk"),  # 24 vectors of 4 channels: blocks of 5 positions; out 15 x 15 in one band, 3 strips
                               # of 7 columns (16-bit types), the last of 1
    (48, 128, 130, 66, "walk"),  # out 65 x 33: three bands (22, 22, 21), 5 strips (the last of 5 columns); 720
                                 # positions, 180 blocks: on 132 multiprocessors (a block each) each thread walks two
                                 # of them in turn
    (16, 192, 7, 7, "walk"),  # 48 vectors: channel groups of 32 and 16 (a warp a position), out 4 x 4
    # the tile kernel (inputs at least 8 columns wide, out_w up to 14): channel groups of 128 and 72 (200 channels),
    # out 7 x 7; out 14 x 11 in two bands of 7 rows, two column chunks, the second of 4 columns
    (20, 200, 13, 13, "tile"),
    (9, 64, 27, 21, "tile"),  # bands of 4 rows (4, 4, 4, 2): two stages of 7 rows would not fit shared memory
    (16, 192, 14, 13, "tile"),  # 14 x 13: not the plane kernel's 14 x 14
])
def test_the_depthwise_wgrad_kernel_is_deterministic_and_matches_float64(extension, batch, channels, height, width,
                                                                         kernel):
    """Our stride-2 bfloat16 wgrad (cudnn_fusion::conv_wgrad: depthwise_conv_wgrad_walk, or depthwise_conv_wgrad_tile
    on small images, at stride 2) on batches large enough for many blocks' partial sums: the same bits on every call
    (fixed-order sums, no atomics), as accurate as PyTorch's against float64, and PyTorch's where the input is off a
    16-byte boundary."""
    torch.manual_seed(0)
    dtype = torch.bfloat16
    x = torch.randn(batch, channels, height, width, device="cuda").to(dtype).contiguous(memory_format=CL)
    dz = torch.randn(batch, channels, (height + 1) // 2, (width + 1) // 2,
                     device="cuda").to(dtype).contiguous(memory_format=CL)
    w_size = (channels, 1, 3, 3)
    args = (list(w_size), [2, 2], [1, 1], [1, 1], [1, 1], channels)
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
    assert any(f"depthwise_conv_wgrad_{kernel}<" in n for n in ran), ran
    first = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    for _ in range(3):
        assert torch.equal(torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args), first)
    assert first.shape == w_size and first.dtype == dtype and not first.isnan().any()
    eager = torch.nn.grad.conv2d_weight(x, w_size, dz, 2, 1, 1, channels)
    reference = torch.nn.grad.conv2d_weight(x.double(), w_size, dz.double(), 2, 1, 1, channels)
    assert_as_accurate_as_eager("dweight", first, eager, reference, dtype)
    _assert_the_float32_wgrad_is_the_unrounded_sums(dz, x, args, first, eager, reference)
    # an NHWC view 2 elements past a 16-byte boundary: PyTorch's wgrad, the same numbers as eager's
    storage = torch.empty(x.numel() + 2, device="cuda", dtype=dtype)
    shifted = storage[2:].view(batch, height, width, channels).permute(0, 3, 1, 2)
    shifted.copy_(x)
    assert shifted.is_contiguous(memory_format=CL) and shifted.data_ptr() % 16 != 0
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, shifted, *args))
    assert not any("depthwise_conv_wgrad" in n for n in ran), ran
    misaligned = torch.ops.cudnn_fusion.conv_wgrad(dz, shifted, *args)
    assert_as_accurate_as_eager("dweight (misaligned)", misaligned, eager, reference, dtype)
    # asked for float32 there: PyTorch's bfloat16 wgrad, cast
    assert torch.equal(torch.ops.cudnn_fusion.conv_wgrad(dz, shifted, *args, out_dtype=torch.float32),
                       misaligned.float())


@pytest.mark.parametrize("batch, channels, height, width, padding, kernel", [
    (24, 32, 40, 37, 1, "walk"),  # 8 vectors of 4 channels: blocks of 16 positions; out_h 40 in two bands of 20; 37
                                  # columns in 6 strips of 7 (16-bit types), the last of 2 columns
    (24, 200, 17, 7, 0, "walk"),  # 50 vectors: channel groups of 32 and 18 (a warp a position); no padding (out
                                  # 15 x 5)
    (24, 576, 7, 6, 1, "walk"),  # 144 vectors: four channel groups of 32 and one of 16 (7 x 6: not the plane
                                 # kernel's 7 x 7)
    (16, 144, 7, 6, 1, "walk"),  # 36 vectors: one group of 36 (18 + 18 would share a 32-byte sector), 3 positions a
                                 # block
    (24, 1032, 7, 7, 2, "walk"),  # 258 vectors: nine groups of 29 (a last group of 2 would not be half full), the
                                  # last of 26; padding 2 (out 9 x 9, the second strip of 2 columns)
    (50, 128, 54, 47, 1, "walk"),  # 700 positions (two bands of 27 rows, 7 strips, the last of 5 columns), 175
                                   # blocks: on 132 multiprocessors (one block each) each thread walks two of them
                                   # back to back, the last part one
    # the tile kernel: channel groups of 128 (the last of 64: 576 channels, of 16: 144); a band of 15 rows, one
    # column chunk, no padding, groups of 128 and 72 (out 15 x 7); bands of 7 and 6 rows, two chunks (the second of
    # 4 columns); padding 2 (tiles from input row and column -2)
    (24, 576, 14, 14, 1, "tile"),
    (16, 144, 14, 14, 1, "tile"),
    (24, 200, 17, 9, 0, "tile"),
    (10, 200, 13, 11, 1, "tile"),
    (12, 64, 9, 8, 2, "tile"),
    (24, 576, 7, 7, 1, "plane"),  # 7 x 7 at padding 1: the plane kernel, 9 channel groups of 64
    (24, 64, 7, 7, 0, "walk"),  # 7 x 7 without padding (out 5 x 5): not the plane kernel's
])
def test_the_stride1_depthwise_wgrad_kernel_is_deterministic_and_matches_float64(extension, batch, channels, height,
                                                                                  width, padding, kernel):
    """Our stride-1 bfloat16 wgrad (depthwise_conv_wgrad_walk, or depthwise_conv_wgrad_tile on small images, then the
    fixed-order sum of its blocks' partial sums): poisoned output fully written, the same bits on every call, as
    accurate as PyTorch's against float64, on shapes whose strips, bands and channel groups do not divide evenly, and
    where threads walk several positions."""
    torch.manual_seed(0)
    dtype = torch.bfloat16
    out_h, out_w = height + 2 * padding - 2, width + 2 * padding - 2
    x = torch.randn(batch, channels, height, width, device="cuda").to(dtype).contiguous(memory_format=CL)
    dz = torch.randn(batch, channels, out_h, out_w, device="cuda").to(dtype).contiguous(memory_format=CL)
    args = ([channels, 1, 3, 3], [1, 1], [padding] * 2, [padding] * 2, [1, 1], channels)
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
    assert any(f"depthwise_conv_wgrad_{kernel}<" in n for n in ran), ran
    first = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    assert first.shape == (channels, 1, 3, 3) and first.dtype == dtype and not first.isnan().any()
    for _ in range(3):
        assert torch.equal(torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args), first)
    eager = torch.nn.grad.conv2d_weight(x, (channels, 1, 3, 3), dz, 1, padding, 1, channels)
    reference = torch.nn.grad.conv2d_weight(x.double(), (channels, 1, 3, 3), dz.double(), 1, padding, 1, channels)
    assert_as_accurate_as_eager("dweight", first, eager, reference, dtype)
    _assert_the_float32_wgrad_is_the_unrounded_sums(dz, x, args, first, eager, reference)


def _square_wgrad_case(dtype, batch, channels, size, stride, device="cuda"):
    """x and dz (seeded, channels_last) of a 3 x 3 depthwise conv at padding 1 on square images, and conv_wgrad's
    arguments after them."""
    torch.manual_seed(0)
    out = (size - 1) // stride + 1
    x = torch.randn(batch, channels, size, size, device=device).to(dtype).contiguous(memory_format=CL)
    dz = torch.randn(batch, channels, out, out, device=device).to(dtype).contiguous(memory_format=CL)
    return x, dz, ([channels, 1, 3, 3], [stride] * 2, [1, 1], [1, 1], [1, 1], channels)


def _assert_the_square_wgrad_is_deterministic_and_matches_float64(dz, x, args, unrounded):
    """conv_wgrad of _square_wgrad_case's tensors: poisoned output fully written, the same bits on every call, as
    accurate as PyTorch's against float64; with `unrounded`, also written unrounded in float32 when asked for it."""
    w_size, stride, channels = tuple(args[0]), args[1][0], args[5]
    first = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    assert first.shape == w_size and first.dtype == x.dtype and not first.isnan().any()
    for _ in range(2):
        assert torch.equal(torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args), first)
    eager = torch.nn.grad.conv2d_weight(x, w_size, dz, stride, 1, 1, channels)
    reference = torch.nn.grad.conv2d_weight(x.double(), w_size, dz.double(), stride, 1, 1, channels)
    assert_as_accurate_as_eager("dweight", first, eager, reference, x.dtype)
    if unrounded:
        _assert_the_float32_wgrad_is_the_unrounded_sums(dz, x, args, first, eager, reference)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("batch, channels, size, stride", [
    (300, 1032, 7, 1),  # 38 blocks of 8 images over 17 channel groups (in float 33): each block takes several in
                        # turn; the last group, of 8 channels, leaves most lanes idle
    (5, 144, 7, 1),  # fewer images than a block's 8 warps
    (64, 1024, 7, 1),
    (256, 576, 14, 2),  # mobilenet_v2's layer: 9 channel groups (in float 18), on 132 multiprocessors two bands of 4
                        # and 3 output rows an image
    (20, 200, 14, 2),
    (3, 64, 14, 2),
])
def test_the_plane_wgrad_of_small_images_is_deterministic_and_matches_float64(extension, no_tf32, dtype, batch,
                                                                             channels, size, stride):
    """The wgrad at padding 1 of 7 x 7 images at stride 1 and of 14 x 14 ones at stride 2
    (depthwise_conv_wgrad_plane, a thread an image's rows of a few channels, then the sum of its blocks' partial sums
    in order): poisoned output fully written, the same bits on every call, as accurate as PyTorch's against float64
    in each dtype, and written unrounded in float32 when asked for it."""
    x, dz, args = _square_wgrad_case(dtype, batch, channels, size, stride)
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
    assert any(f"depthwise_conv_wgrad_plane<{_KERNEL_TYPE[dtype]}, {stride}, {size}>" in n for n in ran), ran
    assert not any("depthwise_conv_wgrad_walk" in n or "depthwise_conv_wgrad_tile" in n for n in ran), ran
    _assert_the_square_wgrad_is_deterministic_and_matches_float64(dz, x, args, unrounded=dtype != torch.float32)


@pytest.mark.parametrize("batch, channels, size, flat", [
    (256, 1024, 7, True),  # the plane kernel: 16 or fewer parts a channel group on an H100 or H200
    (50, 128, 54, False),  # the walk: 800 positions in 100 blocks of one channel group, more parts than
                           # kWgradSumFlatParts (32)
])
def test_the_wgrad_sum_takes_a_thread_per_tap_and_channel_for_few_parts(extension, batch, channels, size, flat):
    """The partial sums of a bfloat16 wgrad are added by depthwise_conv_wgrad_sum_flat (a thread per tap and channel)
    where a channel group has few parts, by depthwise_conv_wgrad_sum (groups of threads, then the groups in order)
    where it has many; either way the result is as accurate as PyTorch's against float64."""
    torch.manual_seed(0)
    x = torch.randn(batch, channels, size, size, device="cuda").to(torch.bfloat16).contiguous(memory_format=CL)
    dz = torch.randn_like(x)
    args = ([channels, 1, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], channels)
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
    assert any("depthwise_conv_wgrad_sum_flat<" in n for n in ran) == flat, ran
    assert any("depthwise_conv_wgrad_sum<" in n for n in ran) == (not flat), ran
    got = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    eager = torch.nn.grad.conv2d_weight(x, (channels, 1, 3, 3), dz, 1, 1, 1, channels)
    reference = torch.nn.grad.conv2d_weight(x.double(), (channels, 1, 3, 3), dz.double(), 1, 1, 1, channels)
    assert_as_accurate_as_eager("dweight", got, eager, reference, torch.bfloat16)


# the wgrad kernels before the sum of their partial sums, by name
_WGRAD_KERNEL = re.compile(r"depthwise_conv_wgrad_(plane|tile|walk)<")
# the sum of a wgrad's partial sums written as float32: the sum of few parts (a thread per tap and channel) or of many
_SUM_OF_FLOAT = re.compile(r"depthwise_conv_wgrad_sum(_flat)?<float>")


def _assert_the_float32_wgrad_is_the_unrounded_sums(dz, x, args, rounded, eager, reference):
    """conv_wgrad(out_dtype=float32), as the conv + BatchNorm op asks for a float32 weight: the same fixed-order float
    sums written unrounded (poisoned output fully written, the same bits on every call), which round to the bfloat16
    result bit for bit; as accurate as eager's against float64."""
    def call():
        return torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args, out_dtype=torch.float32)
    ran = _profile_kernels(call)
    assert any(_SUM_OF_FLOAT.search(n) for n in ran), ran
    full = call()
    assert full.dtype == torch.float32 and full.shape == rounded.shape and not full.isnan().any()
    for _ in range(2):
        assert torch.equal(call(), full)
    assert torch.equal(full.to(rounded.dtype), rounded)
    assert not torch.equal(full, rounded.float()), "the float32 result is the bfloat16 one cast back, not the sums"
    assert_as_accurate_as_eager("dweight in float32", full, eager, reference, rounded.dtype)


@pytest.mark.parametrize("size, stride, pre, post", [
    (7, 1, 1, 0),    # out 6 x 6, where the plane kernel's would be 7 x 7
    (7, 1, 0, 1),
    (14, 2, 1, 2),   # out 8 x 8 (7 x 7 at padding 1)
    (14, 1, 1, 0),   # out 13 x 13
])
@pytest.mark.parametrize("plan", [0, 2])
def test_a_wgrad_padded_unevenly_keeps_the_plane_kernel_out_and_matches_float64(extension, size, stride, pre, post,
                                                                              plan):
    """conv_wgrad with padding_pre != padding_post on the plane kernel's image sizes: its output rows and columns are
    compile-time sizes, so it must not run (the tile, a walk or PyTorch's does), under plan 0 and plan 2; poisoned
    output fully written, as accurate as PyTorch's against float64 (of the input padded as asked)."""
    torch.manual_seed(0)
    batch, channels, dtype = 16, 128, torch.bfloat16
    out = (size + pre + post - 3) // stride + 1
    x = torch.randn(batch, channels, size, size, device="cuda").to(dtype).contiguous(memory_format=CL)
    dz = torch.randn(batch, channels, out, out, device="cuda").to(dtype).contiguous(memory_format=CL)
    w_size = (channels, 1, 3, 3)
    args = (list(w_size), [stride] * 2, [pre] * 2, [post] * 2, [1, 1], channels)
    extension.set_depthwise_wgrad_plan_for_tests(plan)
    try:
        ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
        got = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    finally:
        extension.set_depthwise_wgrad_plan_for_tests(-1)
    assert not any("depthwise_conv_wgrad_plane" in n for n in ran), ran
    if plan == 0:
        assert any("depthwise_conv_wgrad_walk<" in n or "depthwise_conv_wgrad_tile<" in n for n in ran), ran
    assert got.shape == w_size and got.dtype == dtype and not got.isnan().any()
    padded = F.pad(x, (pre, post, pre, post))
    eager = torch.nn.grad.conv2d_weight(padded, w_size, dz, stride, 0, 1, channels)
    reference = torch.nn.grad.conv2d_weight(padded.double(), w_size, dz.double(), stride, 0, 1, channels)
    assert_as_accurate_as_eager("dweight", got, eager, reference, dtype)


@pytest.fixture
def third_wgrad_plan(extension):
    """Every depthwise wgrad our kernels take runs their third plan (the small-image kernel the first passes over),
    untimed."""
    extension.set_depthwise_wgrad_plan_for_tests(2)
    yield extension
    extension.set_depthwise_wgrad_plan_for_tests(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("batch, channels, size, stride, kernel", [
    (24, 576, 14, 1, "plane"),   # the plane kernel at 14 x 14 / 1 (the first plan: the tile), 9 channel groups (in
                                 # float 18): two bands of 7 rows an image
    (300, 1032, 14, 1, "plane"),  # blocks that take several images in turn; a last channel group of 8 channels
    (5, 144, 14, 1, "plane"),    # fewer images than a block's 8 warps
    (24, 576, 7, 1, "walk"),     # where the first plan runs the plane kernel: the walk (7 columns: not the tile's)
    (64, 1024, 7, 1, "walk"),
    (256, 576, 14, 2, "tile"),   # the tile at 14 x 14 / 2
    (20, 200, 14, 2, "tile"),
    (16, 64, 28, 1, None),       # no kernel of its own: PyTorch's
])
def test_the_third_wgrad_plan_is_deterministic_and_matches_float64(third_wgrad_plan, no_tf32, dtype, batch, channels,
                                                                   size, stride, kernel):
    """The wgrad's third plan (depthwise_conv_kernel.cu, wgrad_walk_plan_for; timed against the others and PyTorch's
    under cudnn.benchmark): the kernel named runs, and no other of ours; poisoned output fully written, the same bits
    on every call, as accurate as PyTorch's against float64 in each dtype, and written unrounded in float32 when asked
    for it."""
    x, dz, args = _square_wgrad_case(dtype, batch, channels, size, stride)
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
    ours = sorted({m.group(1) for m in map(_WGRAD_KERNEL.search, ran) if m})
    assert ours == ([kernel] if kernel else []), ran
    if kernel == "plane":
        assert any(f"depthwise_conv_wgrad_plane<{_KERNEL_TYPE[dtype]}, 1, 14>" in n for n in ran), ran
    _assert_the_square_wgrad_is_deterministic_and_matches_float64(dz, x, args,
                                                                  unrounded=kernel and dtype != torch.float32)


@pytest.fixture
def second_wgrad_plan(extension):
    """Every depthwise wgrad our kernels take runs their second plan (the walk at 4 columns and 2 blocks a
    multiprocessor, channel vectors split evenly), untimed."""
    extension.set_depthwise_wgrad_plan_for_tests(1)
    yield extension
    extension.set_depthwise_wgrad_plan_for_tests(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("batch, channels, height, width, stride, padding", [
    (16, 144, 23, 29, 1, 1),  # 36 vectors of 4 channels as 18 + 18 (the first plan: one group of 36), strips of 4
                              # columns, the last of 1
    (24, 192, 28, 28, 1, 1),  # 48 vectors as 24 + 24 (the first plan: 32 + 16)
    (24, 200, 17, 7, 1, 0),   # 50 vectors as 25 + 25, no padding (out 15 x 5)
    (12, 64, 9, 8, 1, 2),     # the first plan's tile shape, padding 2
    (50, 128, 54, 47, 1, 1),  # two bands of 27 rows; more blocks than fit at once: threads walk several positions
    (16, 96, 30, 30, 2, 1),   # stride 2, 24 vectors, out 15 x 15
    (20, 200, 13, 13, 2, 1),  # stride 2, the first plan's tile shape
])
def test_the_second_wgrad_plan_is_deterministic_and_matches_float64(second_wgrad_plan, no_tf32, dtype, batch, channels,
                                                                    height, width, stride, padding):
    """The wgrad's second plan (depthwise_conv_kernel.cu, wgrad_walk_plan_for; timed against the first and PyTorch's
    under cudnn.benchmark): poisoned output fully written, the same bits on every call, as accurate as PyTorch's
    against float64, in each dtype, and written unrounded in float32 when asked for it."""
    torch.manual_seed(0)
    out_h = (height + 2 * padding - 3) // stride + 1
    out_w = (width + 2 * padding - 3) // stride + 1
    x = torch.randn(batch, channels, height, width, device="cuda").to(dtype).contiguous(memory_format=CL)
    dz = torch.randn(batch, channels, out_h, out_w, device="cuda").to(dtype).contiguous(memory_format=CL)
    w_size = (channels, 1, 3, 3)
    args = (list(w_size), [stride] * 2, [padding] * 2, [padding] * 2, [1, 1], channels)
    # float32's stride-1 wgrad is ours on outputs of at most 14 x 14 only (depthwise_kernel_steps)
    ours = dtype != torch.float32 or stride == 2 or max(out_h, out_w) <= 14
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
    assert any(f"depthwise_conv_wgrad_walk<{_KERNEL_TYPE[dtype]}, {stride}, " in n and n.split(">(")[0].endswith(
        ", 2, 4") for n in ran) == ours, ran
    assert not any("depthwise_conv_wgrad_tile" in n for n in ran), ran
    first = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    assert first.shape == w_size and first.dtype == dtype and not first.isnan().any()
    for _ in range(2):
        assert torch.equal(torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args), first)
    eager = torch.nn.grad.conv2d_weight(x, w_size, dz, stride, padding, 1, channels)
    reference = torch.nn.grad.conv2d_weight(x.double(), w_size, dz.double(), stride, padding, 1, channels)
    assert_as_accurate_as_eager("dweight", first, eager, reference, dtype)
    if ours and dtype != torch.float32:
        _assert_the_float32_wgrad_is_the_unrounded_sums(dz, x, args, first, eager, reference)


_KERNEL_TYPE = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half", torch.float32: "float"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("channels, size", [(192, 28), (512, 14)])  # plan 2 has no kernel of its own at 28 x 28
def test_under_cudnn_benchmark_the_depthwise_wgrad_is_timed_once_and_runs_the_fastest(cudnn_benchmark, dtype,
                                                                                       channels, size):
    """With torch.backends.cudnn.benchmark on, a depthwise wgrad's first call times our three plans (plan 2 on small
    images only) and PyTorch's on its own tensors and the fastest runs from then on (depthwise_wgrad_choice): one
    choice per shape and dtype, listed with the four medians; the kernels that run are the chosen one's; the result as
    accurate as eager's against float64. Under deterministic algorithms nothing is timed (plan 0)."""
    extension = cudnn_benchmark
    torch.manual_seed(0)
    x = torch.randn(32, channels, size, size, device="cuda").to(dtype).contiguous(memory_format=CL)
    dz = torch.randn(32, channels, size, size, device="cuda").to(dtype).contiguous(memory_format=CL)
    args = ([channels, 1, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], channels)
    first = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    choices = tcf.depthwise_wgrad_choices()
    assert choices == extension.depthwise_wgrad_choices() and len(choices) == 1, choices
    made = choices[0]
    assert (made["x_size"], made["stride"], made["padding"]) == ([32, channels, size, size], 1, [1, 1]), made
    assert made["dtype"] == made["dw_dtype"] == {torch.bfloat16: "BFloat16", torch.float16: "Half"}[dtype], made
    assert len(made["ms"]) == 4 and [ms > 0 for ms in made["ms"]] == [True, True, size == 14, True], made
    fastest = min((i for i in range(4) if made["ms"][i] > 0), key=lambda i: made["ms"][i])
    assert made["choice"] == ["plan 0", "plan 1", "plan 2", "pytorch"][fastest], made
    ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args))
    ours = [n.split(">(")[0] for n in ran if _WGRAD_KERNEL.search(n)]
    expected = {"pytorch": None, "plan 1": "walk", "plan 2": "plane", "plan 0": "tile" if size == 14 else "walk"}
    if expected[made["choice"]] is None:
        assert not ours, ran
    else:
        assert len(ours) == 1 and _WGRAD_KERNEL.search(ours[0]).group(1) == expected[made["choice"]], ran
        if expected[made["choice"]] == "walk":  # plan 1's walk: 4 columns a thread, 2 blocks a multiprocessor
            assert ours[0].endswith(", 2, 4") == (made["choice"] == "plan 1"), ran
    assert len(tcf.depthwise_wgrad_choices()) == 1  # timed once
    eager = torch.nn.grad.conv2d_weight(x, (channels, 1, 3, 3), dz, 1, 1, 1, channels)
    reference = torch.nn.grad.conv2d_weight(x.double(), (channels, 1, 3, 3), dz.double(), 1, 1, 1, channels)
    assert_as_accurate_as_eager("dweight", first, eager, reference, dtype)
    # another shape under deterministic algorithms: plan 0, nothing timed
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        ran = _profile_kernels(lambda: torch.ops.cudnn_fusion.conv_wgrad(dz[:16], x[:16], *args))
    finally:
        torch.use_deterministic_algorithms(previous)
    assert len(tcf.depthwise_wgrad_choices()) == 1
    first_plan = "depthwise_conv_wgrad_tile<" if size == 14 else "depthwise_conv_wgrad_walk<"
    assert any(first_plan in n and not n.split(">(")[0].endswith(", 2, 4") for n in ran), ran


def test_under_cudnn_benchmark_a_depthwise_wgrad_first_seen_in_a_cuda_graph_capture_is_not_timed(cudnn_benchmark):
    """A wgrad whose shape is first met inside a CUDA-graph capture times nothing there (a capture cannot wait on an
    event): the captured call replays on fresh inputs as accurately as eager's, and the shape's first call outside the
    capture makes the choice."""
    torch.manual_seed(0)
    x = torch.randn(8, 64, 14, 14, device="cuda").to(torch.bfloat16).contiguous(memory_format=CL)
    dz = torch.randn_like(x)
    args = ([64, 1, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 64)
    torch.backends.cudnn.benchmark = False
    torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)  # warm-up without a choice: the kernels' one-time set-up
    torch.backends.cudnn.benchmark = True
    assert tcf.depthwise_wgrad_choices() == []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # on a side stream of its own
        captured = torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    assert tcf.depthwise_wgrad_choices() == []  # nothing timed in the capture
    x.copy_(torch.randn_like(x))
    dz.copy_(torch.randn_like(dz))
    graph.replay()
    eager = torch.nn.grad.conv2d_weight(x, (64, 1, 3, 3), dz, 1, 1, 1, 64)
    reference = torch.nn.grad.conv2d_weight(x.double(), (64, 1, 3, 3), dz.double(), 1, 1, 1, 64)
    assert_as_accurate_as_eager("dweight", captured, eager, reference, torch.bfloat16)
    torch.ops.cudnn_fusion.conv_wgrad(dz, x, *args)
    assert len(tcf.depthwise_wgrad_choices()) == 1  # chosen outside the capture


def test_a_misaligned_input_runs_one_element_at_a_time_and_matches(extension, no_tf32):
    """An NHWC view 4 bytes past a 16-byte boundary: the kernels take the element-at-a-time path, same numbers."""
    torch.manual_seed(0)
    storage = torch.randn(2 * 32 * 10 * 10 + 1, device="cuda")
    x = storage[1:].view(2, 10, 10, 32).permute(0, 3, 1, 2)
    assert x.is_contiguous(memory_format=CL) and x.data_ptr() % 16 != 0
    weight = torch.randn(32, 1, 3, 3, device="cuda")
    ran = _profile_kernels(lambda: tcf.conv2d_bias_act(x, weight, None, None, 1, 1, 1, 32, "relu", strict=True))
    assert any("depthwise_conv_forward<float, 1," in n for n in ran), ran  # one element at a time
    y = tcf.conv2d_bias_act(x, weight, None, None, 1, 1, 1, 32, "relu", strict=True)
    expected = F.relu(F.conv2d(x.double(), weight.double(), None, 1, 1, 1, 32))
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_two_stride1_forward_kernels_give_the_same_numbers(extension, no_tf32, dtype):
    """The stride-1 forward runs the walk where the tensors take 16-byte vectors, else the strip kernel. Both add each
    output's taps in the same order, and each channel's outputs depend on that channel alone: the first 40 of 64
    channels through the walk, and those 40 alone through the strip kernel (x and the output one element off a
    16-byte boundary), are the same numbers, as accurate as eager's against float64."""
    torch.manual_seed(0)
    x = _leaf(2, 64, 11, 9, dtype=dtype)
    weight = torch.randn(64, 1, 3, 3, device="cuda").to(dtype)
    bias = torch.randn(64, device="cuda").to(dtype)
    x40 = x[:, :40].contiguous(memory_format=CL)
    x_off = torch.empty(x40.numel() + 1, device="cuda", dtype=dtype)[1:].as_strided(x40.shape, x40.stride())
    x_off.copy_(x40)
    assert x_off.is_contiguous(memory_format=CL) and x_off.data_ptr() % 16 != 0
    runs = {"walk": (x, weight, bias, 64), "strip": (x_off, weight[:40].clone(), bias[:40].clone(), 40)}
    results = {}
    for name, (inp, w, b, channels) in runs.items():
        def call():
            return tcf.conv2d_bias_act(inp, w, b, None, 1, 1, 1, channels, "relu", strict=True)
        ran = _profile_kernels(call)
        kernels = {"walk": "depthwise_conv_forward_walk<", "strip": "depthwise_conv_forward<"}
        for other, kernel in kernels.items():
            assert any(kernel in n for n in ran) == (other == name), (name, ran)
        results[name] = call()
    assert torch.equal(results["walk"][:, :40], results["strip"])
    eager = F.relu(F.conv2d(x, weight, bias, 1, 1, 1, 64))
    reference = F.relu(F.conv2d(x.double(), weight.double(), bias.double(), 1, 1, 1, 64))
    assert_as_accurate_as_eager("y", results["walk"], eager, reference, dtype)


def test_depthwise_layers_say_they_run_our_kernel(extension):
    torch.manual_seed(0)
    layer = tcf.Conv2dReLU(32, 32, 3, padding=1, groups=32).cuda().to(memory_format=CL)
    x = torch.randn(4, 32, 20, 20, device="cuda", requires_grad=True).contiguous(memory_format=CL)
    layer(x).sum().backward()
    status = layer.fusion_status
    assert status.fused and status.implementation == "depthwise_kernel", status
    assert dict(status.backward) == {"relu_bias_backward": "", "dgrad": "", "wgrad": ""}, status
    assert status.reason == ("depthwise: forward in our kernel, dgrad in our kernel, wgrad in "
                             "PyTorch's kernel"), status  # stride 1, float32, an output larger than 14 x 14
    assert str(status).startswith("fused (depthwise kernels)"), str(status)
    with torch.no_grad():
        (row,) = tcf.explain(nn.Sequential(layer), x, time=False)
    assert row.fused and row.engine == "our NHWC depthwise kernel or PyTorch's", row
    assert row.operations == ("conv_fprop", "add bias", "relu") and row.reason == status.reason, row
    strided = tcf.Conv2dReLU(32, 32, 3, stride=2, padding=1, groups=32).cuda().to(memory_format=CL)
    strided(x)
    assert "dgrad in our kernel" in strided.fusion_status.reason, strided.fusion_status
    half = copy.deepcopy(layer).bfloat16()  # bfloat16 at stride 1: dgrad as our walk with the filter turned
    half(x.detach().bfloat16())
    assert ", dgrad in our kernel, wgrad in our kernel" in half.fusion_status.reason, half.fusion_status
    with tcf.strict():  # NCHW: not our kernels, and the reason says so
        with pytest.raises(tcf.FusionError, match="not our depthwise kernels: layout NCHW"):
            layer.to(memory_format=torch.contiguous_format)(x.contiguous())
    # 5x5: PyTorch's kernel (ours ran slower), eager's numbers, and the reason says so
    five = tcf.Conv2dReLU(32, 32, 5, padding=2, groups=32).cuda().to(memory_format=CL)
    ran = _profile_kernels(lambda: five(x))
    assert not any("depthwise_conv_forward" in n for n in ran), ran
    assert not five.fusion_status.fused, five.fusion_status
    assert "kernel_size=(5, 5): our depthwise kernels are built for 3x3" in five.fusion_status.reason
    with torch.no_grad():
        torch.testing.assert_close(five(x), F.relu(F.conv2d(x, five.weight, five.bias, 1, 2, 1, 32)), rtol=0, atol=0)


def _profile_kernels(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_bn_relu_training_runs_our_kernels_and_matches_float64(extension, stride):
    """A depthwise 3x3 Conv2dBNReLU training step under bf16 autocast: our walks run the forward and the dgrad (at
    stride 1 the forward walk with the filter turned 180 degrees, at stride 2 the dgrad walk) and our wgrad, so no
    cuDNN conv kernel runs at all; y, every gradient and the running statistics are as accurate as eager's against
    float64."""
    torch.manual_seed(0)
    conv = nn.Conv2d(64, 64, 3, stride, 1, groups=64, bias=False)
    bn = nn.BatchNorm2d(64)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5), bn.bias.normal_()
    plain = nn.Sequential(conv, bn, nn.ReLU()).cuda().to(memory_format=CL)
    x = torch.randn(8, 64, 28, 28, device="cuda").contiguous(memory_format=CL)
    grad_out = torch.randn(8, 64, 28 // stride, 28 // stride, device="cuda").contiguous(memory_format=CL)

    def step(model, precision=None):
        leaf = x.detach().to(precision or x.dtype).requires_grad_()
        with torch.autocast("cuda", torch.bfloat16, enabled=precision is None):
            y = model(leaf)
        y.backward(grad_out.to(y.dtype))
        return [y.detach(), leaf.grad] + [p.grad for p in model.parameters()]

    profiled = copy.deepcopy(plain)
    names = _profile_kernels(lambda: step(tcf.Conv2dBNReLU.from_modules(profiled[0], profiled[1])))
    ours = any("depthwise_conv_dgrad" in n for n in names)
    theirs = any("dgrad" in n and "depthwise_conv_dgrad" not in n for n in names)
    assert (ours, theirs) == ((stride == 2), False), names
    walks = [n for n in names if "depthwise_conv_forward_walk<" in n]
    assert len(walks) == (1 if stride == 2 else 2), names  # the forward; at stride 1 also the turned dgrad
    assert sum(", true>" in n for n in walks) == (0 if stride == 2 else 1), walks
    assert all(f"depthwise_conv_forward_walk<__nv_bfloat16, {stride}," in n for n in walks), walks
    ours = any("depthwise_conv_wgrad" in n for n in names)  # bf16, 64 channels: ours at both strides
    theirs = any("wgrad" in n and "depthwise_conv_wgrad" not in n for n in names)
    assert (ours, theirs) == (True, False), names
    assert not any("conv2d_c1_k1" in n for n in names), names  # cuDNN's depthwise kernels

    # the float32 weight's gradient is the kernel's float sums, written as float32: no bfloat16 gradient cast back in
    # the conv's node (a bfloat16 input: no cast of dx either), so the backward runs one cast only: the filter's, kept
    # as passed (float32), to bfloat16 for dx's kernel
    layer = tcf.Conv2dBNReLU.from_modules(*copy.deepcopy(plain)[:2])
    with torch.autocast("cuda", torch.bfloat16):
        y = layer(x.detach().to(torch.bfloat16).requires_grad_())
    grad_y = grad_out.to(y.dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        y.backward(grad_y)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    assert any(_SUM_OF_FLOAT.search(n) for n in names), names
    assert names.count("aten::_to_copy") == 1, names
    assert layer.weight.grad.dtype == torch.float32

    eager, reference = copy.deepcopy(plain), copy.deepcopy(plain).double()
    fused = tcf.Conv2dBNReLU.from_modules(plain[0], plain[1])
    results = [step(fused), step(eager), step(reference, torch.float64)]
    for name, *values in zip(["y", "dx", "dweight", "dbn_weight", "dbn_bias"], *results):
        assert_as_accurate_as_eager(name, *values, torch.bfloat16)
    for name in ("running_mean", "running_var"):
        values = [getattr(m[1], name) for m in (plain, eager, reference)]
        assert_as_accurate_as_eager(name, *values, torch.bfloat16)
    note = "conv: our depthwise kernel; its dgrad: our depthwise kernel; its wgrad: our depthwise kernel"
    assert note in fused.fusion_status.reason, fused.fusion_status


@pytest.mark.parametrize("size", [7, 14, 15, 28])
def test_float32_conv_bn_relu_runs_our_stride1_forward_and_wgrad_on_small_outputs_only(extension, no_tf32, size):
    """A float32 depthwise 3x3 Conv2dBNReLU at stride 1 in training: our forward walk and wgrad on outputs of at most
    14 x 14 (the wgrad's plane kernel at 7 columns, its tile at 14), PyTorch's on larger ones, as the layer's status and
    explain() say; the dgrad our turned walk at every size; y, dweight and the other gradients as accurate as eager's
    against float64 either way."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(64, 64, 3, 1, 1, groups=64, bias=False), nn.BatchNorm2d(64), nn.ReLU())
    plain = plain.cuda().to(memory_format=CL)
    x = torch.randn(6, 64, size, size, device="cuda").contiguous(memory_format=CL)
    grad_out = torch.randn(6, 64, size, size, device="cuda").contiguous(memory_format=CL)

    def step(model, precision=torch.float32):
        model = model.to(precision)
        leaf = x.detach().to(precision).requires_grad_()
        y = model(leaf)
        y.backward(grad_out.to(precision))
        return [y.detach(), leaf.grad] + [p.grad for p in model.parameters()]

    small = size <= extension.depthwise_small_output
    profiled = copy.deepcopy(plain)
    names = _profile_kernels(lambda: step(tcf.Conv2dBNReLU.from_modules(profiled[0], profiled[1])))
    kernel = "depthwise_conv_wgrad_tile<float, 1," if size >= 8 else "depthwise_conv_wgrad_plane<float, 1, 7>"
    assert any(kernel in n for n in names) == small, names
    assert any("depthwise_conv_wgrad" in n for n in names) == small, names
    walks = [n for n in names if "depthwise_conv_forward_walk<float, 1," in n]
    assert sorted(", true>" in n for n in walks) == ([False, True] if small else [True]), names  # forward, dgrad
    eager, reference = copy.deepcopy(plain), copy.deepcopy(plain)
    fused = tcf.Conv2dBNReLU.from_modules(plain[0], plain[1])
    results = [step(fused), step(eager), step(reference, torch.float64)]
    for name, *values in zip(["y", "dx", "dweight", "dbn_weight", "dbn_bias"], *results):
        assert_as_accurate_as_eager(name, *values, torch.float32)
    forward_note = "conv: our depthwise kernel" if small else "conv: PyTorch's cuDNN call"
    assert forward_note in fused.fusion_status.reason, fused.fusion_status
    assert ("its wgrad: our depthwise kernel" in fused.fusion_status.reason) == small, fused.fusion_status
    row = next(r for r in tcf.explain(fused, x, time=False) if r.module == "Conv2dBNReLU")
    assert row.operations[0].startswith("conv (our depthwise kernel;" if small else "conv (PyTorch's cuDNN call;"), row
    assert ("wgrad: our depthwise kernel" in row.operations[0]) == small, row


def test_a_traced_size_names_the_float32_wgrad_rule_in_the_conv_bn_note(extension):
    """Under torch.compile a Conv2dBN*'s note is written before the size is known (TRACED): for float32 at stride 1,
    where the forward and the wgrad depend on the output's size, the note says so; in bfloat16 (ours at every size)
    it does not."""
    from torch_cudnn_fusion.ops import batch_norm, decide

    conv = nn.Conv2d(64, 64, 3, 1, 1, groups=64, bias=False)
    traced = (decide.TRACED,) * 4
    small = "our depthwise kernel where the output is at most 14 x 14, else PyTorch's"
    dgrad = "dgrad: our depthwise kernel"
    notes = batch_norm.conv_notes(conv, conv.weight, True, torch.float32, traced)
    assert notes == [small, dgrad, f"wgrad: {small}"], notes
    notes = batch_norm.conv_notes(conv, conv.weight, True, torch.float32, (2, 64, 14, 14))
    assert notes == ["our depthwise kernel", dgrad, "wgrad: our depthwise kernel"], notes
    notes = batch_norm.conv_notes(conv, conv.weight, True, torch.float32, (2, 64, 15, 15))
    assert notes == ["PyTorch's cuDNN call", dgrad], notes
    notes = batch_norm.conv_notes(conv, conv.weight, True, torch.bfloat16, traced)
    assert notes == ["our depthwise kernel", dgrad, "wgrad: our depthwise kernel"], notes


def test_conv_bn_relu_eval_runs_the_folded_depthwise_kernel_in_a_cuda_graph(extension):
    """Eval folds BatchNorm into the depthwise conv: one launch of our kernel (bias and ReLU in its epilogue), which a
    CUDA graph captures and replays."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(96, 96, 3, 2, 1, groups=96, bias=False), nn.BatchNorm2d(96), nn.ReLU6())
    plain = plain.cuda().to(memory_format=CL).eval()
    with torch.no_grad():
        plain[1].running_mean.normal_(), plain[1].running_var.uniform_(0.5, 2.0)
    fused = tcf.Conv2dBNReLU.from_modules(plain[0], plain[1], activation="relu6").eval()
    x = torch.randn(16, 96, 30, 30, device="cuda").contiguous(memory_format=CL)
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        expected = plain(x)
        fused(x)  # decides, and folds
        ran = _profile_kernels(lambda: fused(x))
        assert sum("depthwise_conv_forward" in n for n in ran) == 1, ran  # the call the graph captures: ours, once
        assert not any("clamp" in n or "hardtanh" in n for n in ran), ran  # ReLU6 in its epilogue
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = fused(x)
        x.copy_(torch.randn_like(x))
        graph.replay()
        expected = plain(x)
    torch.testing.assert_close(y.float(), expected.float(), rtol=0.02, atol=0.02)
    assert fused.fusion_status.implementation == "depthwise_kernel", fused.fusion_status


def _depthwise_model():
    """Our forward and our stride-2 dgrad (first layer), our forward, under bf16 autocast our stride-1 dgrad (the walk
    with the filter turned) and wgrad (second), a depthwise conv + BatchNorm + ReLU6 in training (our walks for the
    plain forward, the stride-2 dgrad and the wgrad), and a pointwise conv + BatchNorm + ReLU (under autocast its
    float32 weight's gradient is one GEMM)."""
    conv_bn = tcf.Conv2dBNReLU(32, 32, 3, stride=2, padding=1, groups=32, bias=False, activation="relu6")
    pointwise = tcf.Conv2dBNReLU(32, 48, 1, bias=False)
    return nn.Sequential(tcf.Conv2dReLU(32, 32, 3, stride=2, padding=1, groups=32),
                         tcf.Conv2dReLU(32, 32, 3, padding=1, groups=32), conv_bn,
                         pointwise).cuda().to(memory_format=CL)


def test_depthwise_layers_under_torch_compile_fullgraph(extension):
    """torch.compile(fullgraph=True) of depthwise layers in training under bf16 autocast: our kernels run inside the
    compiled graph, and the output and every gradient are eager's."""
    torch.manual_seed(0)
    model = _depthwise_model()
    x = torch.randn(4, 32, 20, 20, device="cuda").contiguous(memory_format=CL).requires_grad_()

    def step(fn):
        with torch.autocast("cuda", torch.bfloat16):
            out = fn(x)
        return [out] + list(torch.autograd.grad(out.float().sum(), [x, *model.parameters()]))

    eager = step(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    step(compiled)  # compiles
    ran = _profile_kernels(lambda: step(compiled))
    # the three depthwise layers' forwards (the conv + BN's plain, bf16 at stride 2: the walk too), and the second's
    # dgrad (stride 1, bf16: the walk with the filter turned)
    assert sum("depthwise_conv_forward" in n for n in ran) == 4, ran
    assert sum("depthwise_conv_dgrad" in n for n in ran) == 2, ran  # the first layer's and the conv + BN's
    # the three layers' wgrads: their inputs (20, 10 and 10 columns) as tiles
    assert sum("depthwise_conv_wgrad_tile<" in n for n in ran) == 3, ran
    assert sum("depthwise_conv_wgrad_tile<__nv_bfloat16, 2," in n for n in ran) == 2, ran  # at stride 2
    for got, want in zip(step(compiled), eager):
        torch.testing.assert_close(got, want)


def test_depthwise_training_step_captured_in_a_cuda_graph(extension):
    """Forward and backward of depthwise layers under bf16 autocast captured in one CUDA graph: each replay on fresh
    input gives what eager gives on it."""
    torch.manual_seed(0)
    model = _depthwise_model()
    static_x = torch.randn(4, 32, 20, 20, device="cuda").contiguous(memory_format=CL)

    def forward(x):  # autocast's cast cache off: a captured graph must not keep casts made outside it
        with torch.autocast("cuda", torch.bfloat16, cache_enabled=False):
            return model(x)

    graph, static_y = capture_training_step(forward, model, static_x)
    for _ in range(2):
        fresh = torch.randn_like(static_x)
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        replay = [static_y.clone()] + [p.grad.clone() for p in model.parameters()]
        expected = forward(fresh)
        expected = [expected] + list(torch.autograd.grad(expected.float().sum(), list(model.parameters())))
        for got, want in zip(replay, expected):
            torch.testing.assert_close(got, want)
