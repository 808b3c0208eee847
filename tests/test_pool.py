"""The global average pool fuse() puts in the fused model (torch_cudnn_fusion/nn/pool.py), on the CPU: values and
strides as ATen's, the gradient channels_last for a channels_last input, which pools fuse() replaces, and the
user's model untouched. Its effect on the fused layer before it (no transpose in backward) is checked on the GPU in
test_bn_gpu.py."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.models import mobilenet_v1
from torch_cudnn_fusion.nn import GlobalAvgPool2d
from torch_cudnn_fusion.nn.pool import global_avg_pool2d


def _gradient_reaching(pool, x):
    """(pool's output, the gradient reaching x from a random weighting of the output) for a non-leaf x, whose
    gradient autograd does not restride."""
    x = x.detach().requires_grad_()
    inner = x * 1.0
    seen = []
    inner.register_hook(seen.append)
    out = pool(inner)
    (out * torch.randn_like(out)).sum().backward()
    return out, seen[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 64, 7, 7), (2, 24, 5, 3), (3, 8, 1, 6)])
def test_channels_last_input_gets_its_gradient_channels_last_with_aten_values(dtype, shape):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype).to(memory_format=torch.channels_last)
    torch.manual_seed(1)
    ours, grad_ours = _gradient_reaching(global_avg_pool2d, x)
    torch.manual_seed(1)
    aten, grad_aten = _gradient_reaching(lambda t: F.adaptive_avg_pool2d(t, 1), x)
    assert ours.shape == aten.shape and ours.stride() == aten.stride() and ours.dtype == aten.dtype
    tolerance = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(ours, aten, **tolerance)
    torch.testing.assert_close(grad_ours, grad_aten, rtol=0, atol=0)  # both are grad / (H * W), spread
    assert grad_ours.is_contiguous(memory_format=torch.channels_last)
    assert grad_ours._base is None, "a view: the fused BatchNorm backward before the pool could not overwrite it"
    assert not grad_aten.is_contiguous(memory_format=torch.channels_last)  # why GlobalAvgPool2d exists


def test_double_backward_matches_aten():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 3, dtype=torch.float64).to(memory_format=torch.channels_last).requires_grad_()
    weights = torch.randn(2, 8, 1, 1, dtype=torch.float64)
    for pool in (global_avg_pool2d, lambda t: F.adaptive_avg_pool2d(t, 1)):
        assert torch.autograd.gradcheck(pool, (x,)) and torch.autograd.gradgradcheck(pool, (x,))
    (ours,) = torch.autograd.grad((global_avg_pool2d(x) ** 2 * weights).sum(), x, create_graph=True)
    (aten,) = torch.autograd.grad((F.adaptive_avg_pool2d(x, 1) ** 2 * weights).sum(), x, create_graph=True)
    torch.testing.assert_close(torch.autograd.grad(ours.square().sum(), x)[0],
                               torch.autograd.grad(aten.square().sum(), x)[0])


@pytest.mark.parametrize("x", [torch.randn(2, 6, 5, 4), torch.randn(6, 5, 4), torch.randn(2, 6, 1, 1),
                               torch.randn(2, 6, 5, 4).to(memory_format=torch.channels_last)[:, :, 1:]],
                         ids=["NCHW", "3-d", "1x1", "strided"])
def test_other_inputs_run_aten_exactly(x):
    torch.testing.assert_close(global_avg_pool2d(x), F.adaptive_avg_pool2d(x, 1), rtol=0, atol=0)
    assert global_avg_pool2d(x).stride() == F.adaptive_avg_pool2d(x, 1).stride()


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
    assert "1 global average pool runs as an average pool over the whole image" in str(report)
    x = torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last)
    plain.eval(), fused.eval(), untouched.eval()
    torch.testing.assert_close(fused(x), untouched(x))
    assert len(hooked) == 1, "the user's forward hook on the pool must still run in the fused model (and only there)"

    functional, report = tcf.fuse(_FunctionalPool())
    assert report.pools == ["(model): F.adaptive_avg_pool2d (adaptive_avg_pool2d)"]
    targets = [n.target for n in functional.graph.nodes if n.op == "call_function"]
    assert global_avg_pool2d in targets and F.adaptive_avg_pool2d in targets  # the (2, 2) pool stays ATen's

    other = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d((2, 2)))
    _, report = tcf.fuse(other)
    assert report.pools == [] and "global average pool" not in str(report)


def test_fused_model_gradient_reaches_the_last_layer_channels_last():
    torch.manual_seed(0)
    plain = mobilenet_v1(num_classes=10, width_multiplier=0.25).to(memory_format=torch.channels_last)
    fused, _ = tcf.fuse(plain)
    seen = {}
    for name, model in (("plain", plain), ("fused", fused)):
        handle = model.get_submodule("pool").register_full_backward_hook(
            lambda m, grad_in, grad_out, name=name: seen.__setitem__(name, grad_in[0]))
        model(torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last)).sum().backward()  # 2 x 2 at the pool
        handle.remove()
    assert seen["fused"].is_contiguous(memory_format=torch.channels_last)
    assert not seen["plain"].is_contiguous(memory_format=torch.channels_last)
