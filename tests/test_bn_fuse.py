"""BatchNorm modules, fuse() and MobileNet v1 on the CPU (the eager composition): semantics, state_dict
compatibility, the fuse() report and its messages. The GPU numerics are in test_bn_gpu.py."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.models import mobilenet_v1
from torch_cudnn_fusion.nn import ActivationFused, BatchNorm2dFused


def conv_bn_relu_seq(cin=8, cout=16, **bn_kwargs):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout, **bn_kwargs),
                         nn.ReLU())


@pytest.mark.parametrize("bn_kwargs", [dict(), dict(momentum=None), dict(affine=False), dict(eps=1e-3, momentum=0.3),
                                       dict(track_running_stats=False)])
def test_conv_bn_relu_module_matches_eager_in_training_and_eval(bn_kwargs):
    torch.manual_seed(0)
    plain = conv_bn_relu_seq(**bn_kwargs)
    fused = tcf.Conv2dBNReLU.from_modules(copy.deepcopy(plain[0]), copy.deepcopy(plain[1]))
    for step in range(3):
        x = torch.randn(4, 8, 9, 7)
        torch.testing.assert_close(fused(x), plain(x))
    for name, buffer in plain[1].named_buffers():
        torch.testing.assert_close(getattr(fused.bn, name), buffer, msg=name)
    plain.eval(), fused.eval()
    x = torch.randn(4, 8, 9, 7)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)


def test_eval_fold_is_recomputed_when_parameters_or_statistics_change():
    torch.manual_seed(0)
    plain = conv_bn_relu_seq().eval()
    fused = tcf.Conv2dBNReLU.from_modules(plain[0], plain[1]).eval()
    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)
        plain[1].running_var.mul_(3.0)  # shared buffers: the fused module must see the change
        plain[0].weight.add_(0.5)
        plain[1].bias.sub_(0.25)
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)
        plain[1].load_state_dict({k: torch.rand_like(v.float()).to(v.dtype) + 0.5 for k, v in
                                  plain[1].state_dict().items()})
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-5)


def test_eval_gradients_flow_through_the_fold():
    torch.manual_seed(0)
    plain = conv_bn_relu_seq().eval()
    fused = tcf.Conv2dBNReLU.from_modules(copy.deepcopy(plain[0]), copy.deepcopy(plain[1])).eval()
    x = torch.randn(2, 8, 5, 5)
    plain(x).sum().backward()
    fused(x).sum().backward()
    torch.testing.assert_close(fused.weight.grad, plain[0].weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fused.bn.weight.grad, plain[1].weight.grad, rtol=1e-4, atol=1e-5)


def test_standalone_module_state_dict_and_constructor():
    fused = tcf.Conv2dBNReLU(8, 16, 3, padding=1, momentum=None, activation="relu6")
    assert list(fused.state_dict()) == ["weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                                        "bn.num_batches_tracked"]
    assert fused.bias is None and fused.bn.momentum is None and fused.activation == "relu6"
    assert "activation=relu6" in repr(fused)
    bn = tcf.BatchNorm2dReLU(16)
    assert list(bn.state_dict()) == list(nn.BatchNorm2d(16).state_dict())
    with pytest.raises(ValueError, match="activation must be 'relu', 'relu6' or None, got 'gelu'"):
        tcf.Conv2dBNReLU(8, 16, 3, activation="gelu")
    with pytest.raises(ValueError, match=r"bn.num_features \(8\) must equal conv.out_channels \(16\)"):
        tcf.Conv2dBN.from_modules(nn.Conv2d(8, 16, 1), nn.BatchNorm2d(8))
    with pytest.raises(TypeError, match="bn must be an nn.BatchNorm2d, got Linear"):
        tcf.Conv2dBN.from_modules(nn.Conv2d(8, 16, 1), nn.Linear(2, 2))


@pytest.mark.parametrize("activation", ["relu", "relu6", None])
def test_batchnorm2d_relu_matches_eager(activation):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8, momentum=None)
    fused = tcf.BatchNorm2dReLU.from_bn(copy.deepcopy(bn), activation=activation)
    act = {"relu": F.relu, "relu6": F.relu6, None: lambda t: t}[activation]
    for _ in range(2):
        x = torch.randn(3, 8, 4, 4) * 4
        torch.testing.assert_close(fused(x), act(bn(x)))
    torch.testing.assert_close(fused.running_var, bn.running_var)
    assert int(fused.num_batches_tracked) == 2


def test_functional_errors_name_the_argument():
    x = torch.randn(2, 8, 4, 4)
    with pytest.raises(ValueError, match="running_mean and running_var must be given together"):
        tcf.batch_norm_act(x, torch.zeros(8), None, training=True)
    with pytest.raises(ValueError, match="activation must be 'relu', 'relu6', 'identity' or None, got 'tanh'"):
        tcf.batch_norm_act(x, None, None, training=True, activation="tanh")
    with pytest.raises(ValueError, match=r"residual must match x \(\[2, 8, 4, 4\]"):
        tcf.batch_norm_act(x, None, None, training=True, residual=torch.randn(2, 8, 4, 3))


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block, without a downsample."""

    def __init__(self, channels=16):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


def rows_by_path(report):
    return {row.path: row for row in report}


def test_fuse_mobilenet_report_state_dict_and_training_match():
    torch.manual_seed(0)
    plain = mobilenet_v1(num_classes=10, width_multiplier=0.25)
    model, report = tcf.fuse(copy.deepcopy(plain))
    assert len(report.fused) == 27 and not report.not_fused  # stem + 13 x (depthwise, pointwise)
    assert all(row.module == "Conv2dBNReLU" and row.pattern == "Conv2d -> BatchNorm2d -> ReLU" for row in report)
    assert "grouped/depthwise" in rows_by_path(report)["features.1.0"].reason
    assert rows_by_path(report)["features.1.3"].reason == ""
    assert list(model.state_dict()) == list(plain.state_dict())
    assert isinstance(model.get_submodule("features.1.1"), BatchNorm2dFused)
    assert "Conv2d -> BatchNorm2d -> ReLU" in str(report)

    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    opt_fused = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert len(list(model.parameters())) == len(list(plain.parameters()))
    for step in range(3):
        x, target = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
        losses = []
        for m, opt in ((plain, opt_plain), (model, opt_fused)):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), target)
            loss.backward()
            opt.step()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(model.state_dict(), plain.state_dict())
    plain.eval(), model.eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), plain(x), rtol=1e-4, atol=1e-5)


def test_checkpoint_round_trip_between_plain_and_fused():
    torch.manual_seed(0)
    plain = mobilenet_v1(num_classes=10, width_multiplier=0.25)
    fused, _ = tcf.fuse(mobilenet_v1(num_classes=10, width_multiplier=0.25))
    fused.load_state_dict(plain.state_dict())  # plain -> fused
    fresh = mobilenet_v1(num_classes=10, width_multiplier=0.25)
    fresh.load_state_dict(fused.state_dict())  # fused -> plain: the way back
    torch.testing.assert_close(fresh.state_dict(), plain.state_dict())
    plain.eval(), fused.eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-4, atol=1e-5)


def test_fuse_is_idempotent_and_sequential_walk_matches():
    torch.manual_seed(0)
    model, _ = tcf.fuse(mobilenet_v1(num_classes=10, width_multiplier=0.25))
    again, report = tcf.fuse(model)
    assert again is model
    assert all(row.reason == "already fused" for row in report) and len(report) == 27
    walked, report = tcf.fuse(mobilenet_v1(num_classes=10, width_multiplier=0.25), use_fx=False)
    assert len(report.fused) == 27
    assert isinstance(walked.get_submodule("features.1.2"), ActivationFused)  # in a Sequential, it is called
    _, report = tcf.fuse(walked, use_fx=False)
    assert all(row.reason == "already fused" for row in report)


def test_fuse_resnet_basic_block_fuses_the_residual():
    torch.manual_seed(0)
    plain = BasicBlock()
    model, report = tcf.fuse(copy.deepcopy(plain))
    rows = rows_by_path(report)
    assert rows["conv1"].module == "Conv2dBNReLU" and rows["conv1"].fused
    assert rows["conv2"].module == "Conv2dBNAddReLU" and rows["conv2"].pattern == "Conv2d -> BatchNorm2d -> add -> ReLU"
    assert list(model.state_dict()) == list(plain.state_dict())
    x = torch.randn(2, 16, 8, 8)
    torch.testing.assert_close(model(x.clone()), plain(x.clone()))
    plain.eval(), model.eval()
    torch.testing.assert_close(model(x.clone()), plain(x.clone()), rtol=1e-4, atol=1e-5)


def test_fuse_relu6_and_other_activations():
    torch.manual_seed(0)
    plain = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU6(),  # fused, clipped ReLU
        nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), nn.SiLU(),  # Conv + BN fused, SiLU reported
        nn.Conv2d(16, 16, 1), nn.ReLU6(),  # no BN: the conv graph has no clipped ReLU
        nn.BatchNorm2d(16), nn.ReLU(),  # BN + ReLU without a conv
    )
    model, report = tcf.fuse(copy.deepcopy(plain))
    rows = rows_by_path(report)
    assert rows["0"].module == "Conv2dBNReLU" and model.get_submodule("0").activation == "relu6"
    assert rows["3"].module == "Conv2dBN" and "SiLU after it not fused" in rows["3"].reason
    assert not rows["6"].fused and "ReLU6 without a BatchNorm" in rows["6"].reason
    assert rows["8"].module == "BatchNorm2dReLU"
    x = torch.randn(2, 8, 6, 6) * 3
    torch.testing.assert_close(model(x), plain(x))


def test_fuse_odd_channel_counts_fuses_modules_and_they_fall_back_at_run_time():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 13, 3, padding=1), nn.BatchNorm2d(13), nn.ReLU(),
                          nn.Conv2d(13, 13, 3, padding=1, groups=13), nn.BatchNorm2d(13), nn.ReLU())
    model, report = tcf.fuse(copy.deepcopy(plain), torch.randn(2, 3, 8, 8))
    assert len(report.fused) == 2
    # on the CPU the layers run eager, and the report says why (from the example forward)
    assert all("eager" in row.implementation and "cuda" in row.implementation.lower() for row in report)
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(model(x), plain(x))


def test_fuse_reports_modules_used_twice_and_sync_batchnorm():
    conv, bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.relu = conv, bn, nn.ReLU()

        def forward(self, x):
            return self.relu(self.bn(self.conv(self.relu(self.bn(self.conv(x))))))

    _, report = tcf.fuse(Twice())
    assert report and not report.fused
    assert all("called 2 times" in row.reason or "called more than once" in row.reason for row in report)
    assert any("conv is called 2 times" in row.reason for row in report)
    sync = nn.Sequential(nn.Conv2d(8, 8, 1), nn.SyncBatchNorm(8), nn.ReLU())
    _, report = tcf.fuse(sync)
    assert not report.fused and "SyncBatchNorm" in report[0].reason
    shared = nn.Sequential(conv, bn, nn.ReLU(), conv, bn, nn.ReLU())
    _, report = tcf.fuse(shared, use_fx=False)
    assert not report.fused and "used more than once" in report[0].reason


def test_fuse_non_traceable_model_gets_a_clear_message():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = conv_bn_relu_seq()

        def forward(self, x):
            if x.sum() > 0:  # control flow on a tensor value: torch.fx cannot trace it
                return self.body(x)
            return self.body(-x)

    plain = DataDependent()
    model, report = tcf.fuse(copy.deepcopy(plain))
    assert report[0].path == "(model)" and "not traceable by torch.fx" in report[0].reason
    assert report[1].fused and report[1].module == "Conv2dBNReLU"
    x = torch.randn(2, 8, 5, 5)
    torch.testing.assert_close(model(x), plain(x))
    with pytest.raises(TypeError, match="model must be an nn.Module, got int"):
        tcf.fuse(3)


def test_mobilenet_v1_shape_and_width():
    model = mobilenet_v1()
    assert model.classifier.out_features == 1000 and model.classifier.in_features == 1024
    assert sum(isinstance(m, nn.Conv2d) and m.groups > 1 for m in model.modules()) == 13
    small = mobilenet_v1(num_classes=5, width_multiplier=0.5)
    assert small(torch.randn(1, 3, 64, 64)).shape == (1, 5)
    with pytest.raises(ValueError, match="width_multiplier must be > 0"):
        mobilenet_v1(width_multiplier=0)
