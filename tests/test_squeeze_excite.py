"""Squeeze-and-excitation blocks on the CPU: what fuse() matches and what it leaves, the module's state_dict and
errors, and eager's numbers off CUDA. The GPU numerics are in test_squeeze_excite_gpu.py."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.nn import SqueezeExcite


class TorchvisionStyle(nn.Module):
    """torchvision.ops.SqueezeExcitation's structure: pool and gate as modules, scale * input."""

    def __init__(self, channels=16, squeeze=4, activation=nn.ReLU, gate=nn.Sigmoid, bias=True):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1, bias=bias)
        self.fc2 = nn.Conv2d(squeeze, channels, 1, bias=bias)
        self.activation = activation()
        self.scale_activation = gate()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class TimmStyle(nn.Module):
    """timm's SEModule: x.mean((2, 3), keepdim=True), an Identity between conv and activation, x * gate."""

    def __init__(self, channels=16, squeeze=4):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.bn = nn.Identity()
        self.act = nn.SiLU(inplace=True)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x):
        x_se = self.fc2(self.act(self.bn(self.fc1(x.mean((2, 3), keepdim=True)))))
        return x * x_se.sigmoid()


def _block_model(block):
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), block, nn.Conv2d(16, 8, 1))


@pytest.mark.parametrize("make, activation, gate", [
    (lambda: TorchvisionStyle(), "relu", "sigmoid"),
    (lambda: TorchvisionStyle(activation=nn.SiLU, gate=nn.Hardsigmoid), "silu", "hardsigmoid"),
    (lambda: TorchvisionStyle(bias=False), "relu", "sigmoid"),
    (lambda: TimmStyle(), "silu", "sigmoid"),
], ids=["torchvision-relu-sigmoid", "torchvision-silu-hardsigmoid", "no-bias", "timm"])
def test_fuse_makes_a_squeeze_excitation_block_one_module_and_keeps_eager_numbers_on_cpu(make, activation, gate):
    torch.manual_seed(0)
    model = _block_model(make())
    keys = set(model.state_dict())
    fused, report = tcf.fuse(model)
    rows = [r for r in report if r.module == "SqueezeExcite"]
    assert len(rows) == 1 and rows[0].path == "1.fc1", str(report)
    block = fused.get_submodule("1.fc1")
    assert isinstance(block, SqueezeExcite) and (block.activation, block.gate) == (activation, gate)
    assert block.weight is model[1].fc1.weight and block.fc2 is fused.get_submodule("1.fc2")
    assert fused.get_submodule("1.fc2").weight is model[1].fc2.weight
    assert report.conv_coverage()[:2] == (2, 4)  # the block's two convs; the model's other two are not fused
    assert set(fused.state_dict()) == keys
    assert type(model[1].fc1) is nn.Conv2d and type(model[1]) in (TorchvisionStyle, TimmStyle)  # untouched
    x = torch.randn(2, 3, 7, 5, requires_grad=True)
    expected = model(x)
    expected_grads = torch.autograd.grad(expected.square().sum(), [x, *model.parameters()])
    got = fused(x)
    grads = torch.autograd.grad(got.square().sum(), [x, *model.parameters()])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # eager's own composition off CUDA
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-7)
    status = block.fusion_status
    assert not status.fused and "x is on cpu" in status.reason, status


@pytest.mark.parametrize("change", ["gate tanh", "product with another tensor", "3x3 conv", "fc1 called twice",
                                    "pool without keepdim"])
def test_fuse_leaves_what_is_not_a_squeeze_excitation_block(change):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Conv2d(16, 4, 3 if change == "3x3 conv" else 1, padding=1 if change == "3x3 conv" else 0)
            self.fc2 = nn.Conv2d(4, 16, 1)

        def forward(self, x):
            if change == "pool without keepdim":  # [N, C] into a conv: eager raises, and so must the fused model
                s = x.mean((2, 3))
            else:
                s = x.mean((2, 3), keepdim=True)
            s = self.fc2(F.relu(self.fc1(s)))
            if change == "fc1 called twice":
                s = s + self.fc2(F.relu(self.fc1(s)))
            gate = torch.tanh(s) if change == "gate tanh" else torch.sigmoid(s)
            other = x.flip(0) if change == "product with another tensor" else x
            return other * gate

    model = Block()
    fused, report = tcf.fuse(model)
    assert not any(r.module == "SqueezeExcite" for r in report), str(report)
    assert not any(isinstance(m, SqueezeExcite) for m in fused.modules())
    x = torch.randn(2, 16, 5, 5)
    if change == "pool without keepdim":
        for m in (model, fused):  # nn.Conv2d's RuntimeError; the fused conv's ValueError names x's shape
            with pytest.raises((RuntimeError, ValueError)):
                m(x)
        return
    torch.testing.assert_close(fused(x), model(x))


def test_the_module_is_drop_in_and_its_errors_name_the_argument():
    torch.manual_seed(0)
    block = SqueezeExcite(16, 4, activation="silu", gate="hardsigmoid")
    assert sorted(block.state_dict()) == ["bias", "fc2.bias", "fc2.weight", "weight"]
    assert "activation=silu, gate=hardsigmoid" in repr(block)
    x = torch.randn(2, 16, 3, 3)
    scale = F.hardsigmoid(F.conv2d(F.silu(F.conv2d(x.mean((2, 3), keepdim=True), block.weight, block.bias)),
                                   block.fc2.weight, block.fc2.bias))
    torch.testing.assert_close(block(x), x * scale)
    copied = copy.deepcopy(block)
    torch.testing.assert_close(copied(x), block(x))
    with pytest.raises(ValueError, match="SqueezeExcite: activation must be 'relu' or 'silu', got 'tanh'"):
        SqueezeExcite(16, 4, activation="tanh")
    with pytest.raises(ValueError, match="gate must be 'sigmoid' or 'hardsigmoid', got 'relu'"):
        SqueezeExcite(16, 4, gate="relu")
    with pytest.raises(ValueError, match="fc1 must be an nn.Conv2d with a 1x1 kernel"):
        SqueezeExcite.from_modules(nn.Conv2d(16, 4, 3), nn.Conv2d(4, 16, 1))
    with pytest.raises(ValueError, match="fc2 must map fc1's 4 channels back to its 16, got 4 -> 8"):
        SqueezeExcite.from_modules(nn.Conv2d(16, 4, 1), nn.Conv2d(4, 8, 1))
    with pytest.raises(TypeError, match="from_modules"):
        SqueezeExcite.from_conv(nn.Conv2d(16, 4, 1))


def test_strict_mode_raises_for_a_block_that_cannot_run_fused():
    block = SqueezeExcite(16, 4)
    block(torch.randn(2, 16, 3, 3))  # decided eager and remembered; strict mode is part of what a repeat compares
    with tcf.strict(), pytest.raises(tcf.FusionError, match="squeeze-and-excitation block of 16 channels .* "
                                                            "x is on cpu"):
        block(torch.randn(2, 16, 3, 3))


def test_explain_and_the_report_count_the_blocks_convs():
    model = _block_model(TorchvisionStyle())
    fused, report = tcf.fuse(model)
    row = next(r for r in report if r.module == "SqueezeExcite")
    assert row.pattern == "AdaptiveAvgPool2d -> Conv2d -> ReLU -> Conv2d -> Sigmoid -> mul"
    assert "2 of 4 Conv2d layers" in report.summary()
    assert [r.path for r in tcf.fusion_report(fused)] == ["1.fc1"]
    # what explain lists for a block that ran the op (explain's own run needs a GPU)
    from torch_cudnn_fusion.diagnostics.report import _explain_squeeze_excite
    block = SqueezeExcite.from_modules(nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1, bias=False), activation="silu",
                                       gate="hardsigmoid")
    assert _explain_squeeze_excite("b", block).operations == (
        "mean over H and W", "1x1 conv as a GEMM + bias", "silu", "1x1 conv as a GEMM", "hardsigmoid",
        "multiply x by the gate")
    again = tcf.fuse(fused)[1]  # fusing the fused model: the block is counted once, with both its convs
    assert again.conv_coverage()[:2] == (2, 4) and "1.fc2" not in again.conv_coverage()[2], str(again)
