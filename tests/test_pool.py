"""The global average pool fuse() puts in the fused model (torch_cudnn_fusion/nn/pool.py, csrc/ops/pool_ops.cpp):
ATen's pool itself on the CPU; on the GPU for a channels_last input, ATen's values with the gradient channels_last in
a tensor of its own; which pools fuse() replaces, and the user's model untouched. Its effect on the fused layer
before it (no transpose in backward, BatchNorm's backward in place) is checked in test_bn_gpu.py."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.models import mobilenet_v1
from torch_cudnn_fusion.nn import GlobalAvgPool2d
from torch_cudnn_fusion.nn.pool import global_avg_pool2d

from conftest import gpu


def _gradient_reaching(pool, x, weights):
    """(pool's output, the gradient reaching its input from a weighting of the output, whether that input was dense
    channels_last) for a non-leaf input (x * 1, laid out by ATen from x's strides), whose gradient autograd does not
    restride."""
    x = x.detach().requires_grad_()
    inner = x * 1.0
    seen = []
    inner.register_hook(seen.append)
    out = pool(inner)
    (out * weights).sum().backward()
    return out, seen[0], inner.is_contiguous(memory_format=torch.channels_last) and not inner.is_contiguous()


def _aten(x):
    return F.adaptive_avg_pool2d(x, 1)


CASES = [((4, 64, 7, 7), "channels_last"), ((2, 24, 5, 3), "channels_last"), ((3, 8, 1, 6), "channels_last"),
         ((2, 6, 5, 4), "nchw"), ((2, 6, 1, 1), "channels_last"), ((2, 6, 5, 4), "strided")]


def _input(shape, layout, dtype, device):
    x = torch.randn(shape, dtype=dtype, device=device)
    if layout == "channels_last":
        return x.to(memory_format=torch.channels_last)
    if layout == "strided":
        return x.to(memory_format=torch.channels_last)[:, :, 1:]
    return x


@pytest.mark.parametrize("shape, layout", CASES)
def test_on_the_cpu_it_is_aten_s_pool(shape, layout):
    torch.manual_seed(0)
    x = _input(shape, layout, torch.float32, "cpu")
    weights = torch.randn(shape[0], shape[1], 1, 1)
    ours, grad_ours, _ = _gradient_reaching(global_avg_pool2d, x, weights)
    aten, grad_aten, _ = _gradient_reaching(_aten, x, weights)
    torch.testing.assert_close(ours, aten, rtol=0, atol=0)
    torch.testing.assert_close(grad_ours, grad_aten, rtol=0, atol=0)
    assert ours.stride() == aten.stride() and grad_ours.stride() == grad_aten.stride()


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape, layout", CASES)
def test_on_the_gpu_a_channels_last_input_gets_its_gradient_channels_last_in_its_own_tensor(extension, dtype, shape,
                                                                                           layout):
    """ATen's output bit for bit (its own forward) and ATen's gradient values bit for bit (each grad / (H * W) in the
    gradient's dtype); for a channels_last input the gradient channels_last and not a view (the fused BatchNorm
    backward before the pool writes over it), where ATen's comes back NCHW. Other inputs run ATen's pool."""
    torch.manual_seed(0)
    x = _input(shape, layout, dtype, "cuda")
    weights = torch.randn(shape[0], shape[1], 1, 1, device="cuda").to(dtype)
    ours, grad_ours, takes = _gradient_reaching(global_avg_pool2d, x, weights)
    aten, grad_aten, _ = _gradient_reaching(_aten, x, weights)
    torch.testing.assert_close(ours, aten, rtol=0, atol=0)
    assert ours.stride() == aten.stride()
    torch.testing.assert_close(grad_ours, grad_aten, rtol=0, atol=0)
    assert takes == (layout != "nchw" and shape[2] * shape[3] > 1 and shape[1] > 1)  # x * 1 of the strided view is dense
    if takes:
        assert grad_ours.is_contiguous(memory_format=torch.channels_last) and grad_ours._base is None
        assert not grad_aten.is_contiguous(memory_format=torch.channels_last)  # why the op exists
    else:
        assert grad_ours.stride() == grad_aten.stride()


@gpu
def test_the_pool_op_passes_opcheck_and_double_backward(extension):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 3, device="cuda", dtype=torch.float64).to(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.cudnn_fusion.global_avg_pool.default, (x.requires_grad_(),))
    assert torch.autograd.gradcheck(global_avg_pool2d, (x,)) and torch.autograd.gradgradcheck(global_avg_pool2d, (x,))
    with pytest.raises(RuntimeError, match=r"global_avg_pool: x must be 4-d \(N, C, H, W\), got 3 dimensions"):
        torch.ops.cudnn_fusion.global_avg_pool(x[0])
    with torch.no_grad():
        torch.testing.assert_close(global_avg_pool2d(x), _aten(x), rtol=0, atol=0)


def test_module_is_an_adaptive_avg_pool_of_size_one_only():
    assert isinstance(GlobalAvgPool2d(), nn.AdaptiveAvgPool2d) and GlobalAvgPool2d((1, 1)).output_size == (1, 1)
    for size in (2, (1, 2), (1, None), (None, None)):
        with pytest.raises(ValueError, match=r"output_size must be 1 or \(1, 1\).*got"):
            GlobalAvgPool2d(size)


class _FunctionalPool(nn.Module):
    """torchvision's mobilenet_v2 head: F.adaptive_avg_pool2d in forward, beside a pool of another size."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)

    def forward(self, x):
        y = F.relu(self.bn(self.conv(x)))
        return F.adaptive_avg_pool2d(y, (1, 1)).flatten(1) + F.adaptive_avg_pool2d(y, output_size=2).mean((2, 3))


def test_fuse_replaces_global_pools_only_and_reports_them():
    torch.manual_seed(0)
    plain = mobilenet_v1(num_classes=10, width_multiplier=0.25)
    untouched = copy.deepcopy(plain)
    hooked = []
    plain.pool.register_forward_hook(lambda m, i, o: hooked.append(o.shape))
    fused, report = tcf.fuse(plain)
    assert type(plain.pool) is nn.AdaptiveAvgPool2d, "fuse() changed the user's pool"
    assert type(fused.get_submodule("pool")) is GlobalAvgPool2d and report.pools == ["pool"]
    assert "1 global average pool runs cudnn_fusion::global_avg_pool" in str(report)
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    plain.eval(), fused.eval(), untouched.eval()
    torch.testing.assert_close(fused(x), untouched(x))
    assert len(hooked) == 1, "the user's forward hook on the pool must still run in the fused model (and only there)"

    functional, report = tcf.fuse(_FunctionalPool())
    assert report.pools == ["(model): F.adaptive_avg_pool2d (adaptive_avg_pool2d)"]
    targets = [n.target for n in functional.graph.nodes if n.op == "call_function"]
    assert global_avg_pool2d in targets and F.adaptive_avg_pool2d in targets  # the (2, 2) pool stays ATen's
    again, report = tcf.fuse(functional)  # a fused model traces again, its pool a call
    assert report.pools == [] and global_avg_pool2d in [n.target for n in again.graph.nodes]

    other = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d((2, 2)))
    _, report = tcf.fuse(other)
    assert report.pools == [] and "global average pool" not in str(report)
