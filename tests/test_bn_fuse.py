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


def test_eval_fold_takes_no_other_tensor_at_the_same_address_for_the_one_it_was_computed_from():
    """The eval fold is cached on the tensors it reads. A tensor put in a running statistic's place at the old one's
    address, with a version counter as fresh as the old one's (as where the CUDA allocator hands a freed block out
    again), is another tensor: the fold is computed anew from its values. Called directly: on the CPU the layer runs
    eager's composition, not the fold."""
    torch.manual_seed(0)
    plain = conv_bn_relu_seq().eval()
    fused = tcf.Conv2dBNReLU.from_modules(plain[0], plain[1]).eval()
    bn = plain[1]
    with torch.no_grad():
        weight, bias = fused._folded_weight_and_bias()
        old = bn.running_var
        other = torch.from_dlpack(old)  # another tensor over the same memory, with a version counter of its own
        while other._version < old._version:  # brought to the old one's count (reset_running_stats filled it once)
            other.add_(0)
        assert other is not old and other.data_ptr() == old.data_ptr() and other._version == old._version
        other.numpy()[:] = 4.0  # new values, no version bump: the key of (address, version) alone cannot tell
        bn.running_var = other
        weight2, bias2 = fused._folded_weight_and_bias()
        scale = bn.weight / torch.sqrt(torch.full_like(bn.weight, 4.0) + bn.eps)
        torch.testing.assert_close(weight2, plain[0].weight * scale.view(-1, 1, 1, 1))
        torch.testing.assert_close(bias2, bn.bias - bn.running_mean * scale)
        assert not torch.allclose(weight2, weight)


def test_eval_fold_follows_a_parameter_whose_storage_was_swapped_in_place():
    """`param.data = t` (how Module.to, .half() and .cuda() convert a Parameter) keeps the Parameter object and its
    version count and swaps its storage: the cached fold must not be handed out for the new values."""
    torch.manual_seed(0)
    plain = conv_bn_relu_seq().eval()
    fused = tcf.Conv2dBNReLU.from_modules(plain[0], plain[1]).eval()
    weight = fused.weight
    with torch.no_grad():
        folded, _ = fused._folded_weight_and_bias()
        version = weight._version
        weight.data = torch.randn_like(weight)
        assert fused.weight is weight and weight._version == version
        folded2, _ = fused._folded_weight_and_bias()
        scale = plain[1].weight / torch.sqrt(plain[1].running_var + plain[1].eps)
        torch.testing.assert_close(folded2, weight * scale.view(-1, 1, 1, 1))
        assert not torch.allclose(folded2, folded)


def test_eval_fold_is_let_go_in_training_and_when_the_module_is_converted():
    """The cached fold is a copy of the conv's weight that training does not read: entering training lets it go (a
    loop that evaluates every epoch would otherwise hold it through training), also through a fuse()d model's
    train(); eval() keeps it; .to() and the like let it go, as it was computed from the tensors before them."""
    torch.manual_seed(0)
    plain = conv_bn_relu_seq().eval()
    fused = tcf.Conv2dBNReLU.from_modules(plain[0], plain[1]).eval()
    with torch.no_grad():
        fused._folded_weight_and_bias()
        assert fused._call.fold is not None
        fused.eval()
        assert fused._call.fold is not None
        fused.train()
        assert fused._call.fold is None
        fused.eval()
        fused._folded_weight_and_bias()
        fused.double()
        assert fused._call.fold is None
        model, _ = tcf.fuse(nn.Sequential(conv_bn_relu_seq(), nn.Flatten()).eval())
        (layer,) = [m for m in model.modules() if isinstance(m, tcf.Conv2dBN)]
        layer._folded_weight_and_bias()
        model.eval()
        assert layer._call.fold is not None
        model.train()
        assert layer._call.fold is None


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
    with pytest.raises(ValueError, match="Conv2dBNReLU: activation must be 'relu', 'relu6' or None, got 'gelu'"):
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


def test_batchnorm2d_relu_in_eval_runs_eager_without_deciding_and_keeps_its_training_path(monkeypatch):
    """In eval a BatchNorm2dReLU runs eager's composition on its running statistics and says so, without building the
    signature a training call is compared by (that costs host time on every call); back in training it decides and
    counts its steps again, and every phase matches eager's modules."""
    from torch_cudnn_fusion.ops import batch_norm as ops_batch_norm

    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8)
    fused = tcf.BatchNorm2dReLU.from_bn(copy.deepcopy(bn))
    signature = ops_batch_norm.tensor_signature
    for phase, training in (("train", True), ("eval", False), ("train again", True)):
        bn.train(training), fused.train(training)
        if not training:  # a signature built in eval fails the call
            monkeypatch.setattr(ops_batch_norm, "tensor_signature", lambda t: 1 / 0)
        for _ in range(2):
            x = torch.randn(3, 8, 4, 4) * 4
            torch.testing.assert_close(fused(x), F.relu(bn(x)), msg=lambda m: f"{phase}: {m}")
        monkeypatch.setattr(ops_batch_norm, "tensor_signature", signature)
        status = fused.fusion_status
        assert ("inference with running statistics" in status.reason) == (not training), (phase, status)
        torch.testing.assert_close(fused.running_mean, bn.running_mean)
        torch.testing.assert_close(fused.running_var, bn.running_var)
        assert int(fused.num_batches_tracked) == int(bn.num_batches_tracked) == (2 if phase != "train again" else 4)
    fused.eval()  # and it traces whole under torch.compile
    x = torch.randn(3, 8, 4, 4)
    compiled = torch.compile(fused, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), F.relu(bn.eval()(x)))
    with pytest.raises(ValueError, match="activation must be"):
        tcf.batch_norm_act(torch.randn(2, 8, 3, 3), torch.zeros(8), torch.ones(8), activation="tanh")
    with pytest.raises(ValueError, match="running_mean and running_var must be given together"):
        tcf.batch_norm_act(torch.randn(2, 8, 3, 3), torch.zeros(8), None)


def test_functional_errors_name_the_argument():
    x = torch.randn(2, 8, 4, 4)
    with pytest.raises(ValueError, match="running_mean and running_var must be given together"):
        tcf.batch_norm_act(x, torch.zeros(8), None, training=True)
    with pytest.raises(ValueError, match="activation must be 'relu', 'relu6', 'silu', 'hardswish', 'leaky_relu', "
                                         "'identity' or None, got 'tanh'"):
        tcf.batch_norm_act(x, None, None, training=True, activation="tanh")


def test_functional_residual_is_added_as_eager_adds_it():
    """A residual eager would broadcast runs eager (with the reason); one eager cannot add fails as eager fails."""
    x = torch.randn(2, 8, 4, 4)
    residual = torch.randn(8, 1, 1)
    out = tcf.batch_norm_act(x, None, None, training=True, residual=residual)
    torch.testing.assert_close(out, F.relu(F.batch_norm(x, None, None, training=True) + residual), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="must match the size of tensor b"):
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


def module_classes(model):
    return [(path, type(m)) for path, m in model.named_modules()]


def test_fuse_mobilenet_report_state_dict_and_training_match():
    torch.manual_seed(0)
    plain = mobilenet_v1(num_classes=10, width_multiplier=0.25)
    untouched = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    assert model is not plain and module_classes(plain) == module_classes(untouched)
    assert len(report.replaced) == 27 and not report.not_replaced  # stem + 13 x (depthwise, pointwise)
    assert report.conv_coverage()[:2] == (27, 27)
    assert all(row.module == "Conv2dBNReLU" and row.pattern == "Conv2d -> BatchNorm2d -> ReLU" for row in report)
    assert rows_by_path(report)["features.1.0"].reason == rows_by_path(report)["features.1.3"].reason == ""
    assert set(model.state_dict()) == set(plain.state_dict())
    assert isinstance(model.get_submodule("features.1.1"), BatchNorm2dFused)
    assert type(plain.get_submodule("features.1.1")) is nn.BatchNorm2d
    text = str(report)
    assert "Conv2d -> BatchNorm2d -> ReLU" in text and "27 patterns replaced by fused modules (27 of 27" in text

    # one set of Parameters and buffers: the optimizer of the plain model trains the fused one
    assert [id(p) for p in model.parameters()] == [id(p) for p in plain.parameters()]
    eager = copy.deepcopy(untouched)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_fused = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, target = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
        losses = []
        for m, opt in ((eager, opt_eager), (model, opt_fused)):
            opt.zero_grad()
            loss = F.cross_entropy(m(x), target)
            loss.backward()
            opt.step()
            losses.append(loss)
        torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=0)
    torch.testing.assert_close(model.state_dict(), eager.state_dict(), rtol=0, atol=0)
    eager.eval(), model.eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)  # on the CPU eval runs eager's own composition
    assert plain.training  # fused.eval() is the fused model's own
    plain.eval()
    torch.testing.assert_close(plain(x), eager(x), rtol=0, atol=0)  # the original, still a plain model, works


def test_fuse_never_changes_the_model_even_when_it_fails(monkeypatch):
    torch.manual_seed(0)
    plain = BasicBlock()
    untouched = copy.deepcopy(plain)
    x = torch.randn(2, 16, 8, 8)

    def same_as_untouched():
        assert module_classes(plain) == module_classes(untouched)
        torch.testing.assert_close(plain.state_dict(), untouched.state_dict(), rtol=0, atol=0)
        torch.testing.assert_close(plain(x), untouched(x), rtol=0, atol=0)  # training: both update their statistics

    tcf.fuse(plain)
    same_as_untouched()
    from torch_cudnn_fusion.fx import rewrite

    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure in the middle of the rewrite")

    monkeypatch.setattr(rewrite._GraphRewrite, "replace", broken)
    with pytest.raises(RuntimeError, match="simulated failure"):
        tcf.fuse(plain)
    same_as_untouched()


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
    torch.testing.assert_close(fused(x), plain(x), rtol=0, atol=0)


def test_fuse_is_idempotent_and_sequential_walk_matches():
    torch.manual_seed(0)
    model, _ = tcf.fuse(mobilenet_v1(num_classes=10, width_multiplier=0.25))
    again, report = tcf.fuse(model)
    assert again is not model
    assert ({path: type(m).__name__ for path, m in again.named_modules()}
            == {path: type(m).__name__ for path, m in model.named_modules()})
    assert all(row.reason == "already fused" for row in report) and len(report) == 27
    walked, report = tcf.fuse(mobilenet_v1(num_classes=10, width_multiplier=0.25), use_fx=False)
    assert len(report.replaced) == 27
    assert isinstance(walked.get_submodule("features.1.2"), ActivationFused)  # in a Sequential, it is called
    assert type(walked).__name__ == "MobileNetV1"  # no tracing: the model keeps its class
    _, report = tcf.fuse(walked, use_fx=False)
    assert all(row.reason == "already fused" for row in report)


def test_fuse_resnet_basic_block_fuses_the_residual():
    torch.manual_seed(0)
    plain = BasicBlock()
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    rows = rows_by_path(report)
    assert rows["conv1"].module == "Conv2dBNReLU" and rows["conv1"].replaced
    assert rows["conv2"].module == "Conv2dBNAddReLU" and rows["conv2"].pattern == "Conv2d -> BatchNorm2d -> add -> ReLU"
    assert set(model.state_dict()) == set(plain.state_dict())
    x = torch.randn(2, 16, 8, 8)
    torch.testing.assert_close(model(x.clone()), eager(x.clone()), rtol=0, atol=0)
    eager.eval(), model.eval()
    torch.testing.assert_close(model(x.clone()), eager(x.clone()), rtol=0, atol=0)


class DownsampleBlock(nn.Module):
    """torchvision's ResNet block with a downsample: the residual comes from a module run after the first conv."""

    def __init__(self, cin=8, cout=16):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=2, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.downsample(x)
        return self.relu(out)


class FunctionalForms(nn.Module):
    """Activations and adds written as functions and methods."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(8, 8, 3, padding=1, bias=False) for _ in range(6))
        self.bns = nn.ModuleList(nn.BatchNorm2d(8) for _ in range(6))

    def forward(self, x):
        c, b = self.convs, self.bns
        x = F.relu(b[0](c[0](x)), inplace=True)
        x = torch.relu(b[1](c[1](x)))
        x = b[2](c[2](x)).relu()
        x = F.relu6(b[3](c[3](x)))
        x = torch.add(b[4](c[4](x)), x).relu_()
        skip = x * 0.5  # a residual produced by a function, after the conv
        return F.relu(b[5](c[5](x)) + skip)


@pytest.mark.parametrize("block, patterns", [
    (DownsampleBlock, {"conv1": "Conv2dBNReLU", "conv2": "Conv2dBNAddReLU", "downsample.0": "Conv2dBN"}),
    (FunctionalForms, {f"convs.{i}": m for i, m in enumerate(
        ["Conv2dBNReLU"] * 4 + ["Conv2dBNAddReLU"] * 2)}),
])
def test_fuse_any_graph_residuals_from_modules_and_functions(block, patterns):
    torch.manual_seed(0)
    plain = block()
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    assert {r.path: r.module for r in report.replaced} == patterns
    model.graph.lint()
    assert model.get_submodule("convs.3" if block is FunctionalForms else "conv1").activation == (
        "relu6" if block is FunctionalForms else "relu")
    x = torch.randn(2, 8, 8, 8)
    for mode in (True, False):
        model.train(mode), eager.train(mode)
        torch.testing.assert_close(model(x.clone()), eager(x.clone()), rtol=0, atol=0)
    torch.testing.assert_close(model.state_dict(), eager.state_dict(), rtol=0, atol=0)


def test_fuse_relu6_and_other_activations():
    torch.manual_seed(0)
    plain = nn.Sequential(
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU6(),  # fused, clipped ReLU
        nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), nn.Mish(inplace=True),  # Conv + BN fused, Mish after it
        nn.Conv2d(16, 16, 1), nn.ReLU6(),  # no BN: the conv graph has no clipped ReLU
        nn.BatchNorm2d(16), nn.ReLU(),  # BN + ReLU without a conv
        nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16), nn.SiLU(inplace=True),  # fused, SiLU included
        nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16), nn.Hardswish(),  # fused, Hardswish included
        nn.Conv2d(16, 16, 1), nn.SiLU(),  # no BN: the conv graphs have no SiLU
        nn.BatchNorm2d(16), nn.Hardswish(),  # Hardswish is fused after a conv + BatchNorm only
    )
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    rows = rows_by_path(report)
    assert rows["0"].module == "Conv2dBNReLU" and model.get_submodule("0").activation == "relu6"
    assert rows["3"].module == "Conv2dBN" and "Mish after it applied as before" in rows["3"].reason
    assert model.get_submodule("3").activation is None and type(model.get_submodule("5")) is nn.Mish
    assert not rows["6"].replaced and "ReLU6 without a BatchNorm" in rows["6"].reason
    assert rows["8"].module == "BatchNorm2dReLU"
    for path, name, activation in (("10", "SiLU", "silu"), ("13", "Hardswish", "hardswish")):
        assert rows[path].module == "Conv2dBN" and rows[path].reason == "", rows[path]
        assert rows[path].pattern == f"Conv2d -> BatchNorm2d -> {name}"
        assert model.get_submodule(path).activation == activation
    assert not rows["16"].replaced and "SiLU without a BatchNorm" in rows["16"].reason
    assert "18" not in rows and type(model.get_submodule("18")) is nn.BatchNorm2d
    for mode in (True, False):
        model.train(mode), eager.train(mode)
        x = torch.randn(2, 8, 6, 6) * 3
        torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)
    model.train()
    model(x).sum().backward()  # the in-place Mish after the fused Conv2dBN: its output is saved by nothing


def test_fuse_traced_silu_and_hardswish_functions_and_modules():
    """In a traced graph, F.silu / F.hardswish calls and nn.SiLU / nn.Hardswish modules after a conv + BatchNorm are
    fused into Conv2dBN (activation "silu" / "hardswish"); the fused model computes what the plain one does on the
    CPU (eager's composition), in training and eval."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(4, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8)
            self.conv3, self.bn3, self.act3 = nn.Conv2d(8, 8, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish()

        def forward(self, x):
            x = F.silu(self.bn1(self.conv1(x)), inplace=True)
            x = F.hardswish(self.bn2(self.conv2(x)))
            return self.act3(self.bn3(self.conv3(x)))

    torch.manual_seed(0)
    plain = Block()
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    rows = rows_by_path(report)
    assert [(rows[p].module, model.get_submodule(p).activation) for p in ("conv1", "conv2", "conv3")] == [
        ("Conv2dBN", "silu"), ("Conv2dBN", "hardswish"), ("Conv2dBN", "hardswish")]
    assert rows["conv1"].pattern == "Conv2d -> BatchNorm2d -> silu"
    for mode in (True, False):
        model.train(mode), eager.train(mode)
        x = torch.randn(2, 4, 6, 6) * 3
        torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)
    torch.testing.assert_close(model.state_dict(), eager.state_dict(), rtol=0, atol=0)


def test_conv_bn_takes_silu_hardswish_and_leaky_relu_the_relu_modules_do_not_and_bad_activations_are_named():
    conv, bn = nn.Conv2d(4, 8, 1), nn.BatchNorm2d(8)
    assert tcf.Conv2dBN.from_modules(conv, bn, activation="silu").activation == "silu"
    assert tcf.Conv2dBN(4, 8, 1, activation="hardswish").activation == "hardswish"
    leaky = tcf.Conv2dBN.from_modules(conv, bn, activation="leaky_relu", negative_slope=0.2)
    assert (leaky.activation, leaky.negative_slope) == ("leaky_relu", 0.2) and "negative_slope=0.2" in repr(leaky)
    assert tcf.Conv2dBN(4, 8, 1, activation="leaky_relu").negative_slope == 0.01  # nn.LeakyReLU's default
    with pytest.raises(TypeError, match="Conv2dBN: negative_slope must be a real number, got str"):
        tcf.Conv2dBN(4, 8, 1, activation="leaky_relu", negative_slope="0.1")
    with pytest.raises(ValueError, match="Conv2dBN: activation must be 'relu', 'relu6', 'silu', 'hardswish', "
                                         "'leaky_relu' or None, got 'gelu'"):
        tcf.Conv2dBN(4, 8, 1, activation="gelu")
    # the ReLU modules take what their names say: SiLU and Hardswish are Conv2dBN's (as fuse() makes them)
    for make, name in ((lambda a: tcf.Conv2dBNReLU(4, 8, 1, activation=a), "Conv2dBNReLU"),
                       (lambda a: tcf.Conv2dBNAddReLU.from_modules(conv, bn, activation=a), "Conv2dBNAddReLU"),
                       (lambda a: tcf.BatchNorm2dReLU.from_bn(bn, activation=a), "BatchNorm2dReLU")):
        assert make("relu6").activation == "relu6"
        for activation in ("silu", "hardswish", "leaky_relu"):
            with pytest.raises(ValueError, match=f"{name}: activation must be 'relu', 'relu6' or None, "
                                                 f"got '{activation}'"):
                make(activation)
    with pytest.raises(ValueError, match="activation must be 'relu', 'relu6', 'identity' or None, got 'silu'"):
        tcf.conv2d_bias_act(torch.randn(1, 4, 4, 4), torch.randn(8, 4, 1, 1), None, activation="silu")


def test_fuse_odd_channel_counts_fuses_modules_and_they_fall_back_at_run_time():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 13, 3, padding=1), nn.BatchNorm2d(13), nn.ReLU(),
                          nn.Conv2d(13, 13, 3, padding=1, groups=13), nn.BatchNorm2d(13), nn.ReLU())
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain, torch.randn(2, 3, 8, 8))
    assert len(report.replaced) == 2
    # on the CPU the layers run eager, and the report says so (from the example forward)
    assert all(row.runs_fused is False and "cpu" in row.implementation for row in report)
    assert "on the example input 0 ran fused, 2 eager" in str(report)
    torch.testing.assert_close(plain[1].running_mean, eager[1].running_mean, rtol=0, atol=0)  # example: restored
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)


def test_fuse_reports_modules_used_twice_and_sync_batchnorm():
    conv, bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn, self.relu = conv, bn, nn.ReLU()

        def forward(self, x):
            return self.relu(self.bn(self.conv(self.relu(self.bn(self.conv(x))))))

    _, report = tcf.fuse(Twice())
    assert report and not report.replaced
    assert all("called 2 times in forward: fusing it would change its other calls" in row.reason for row in report)
    sync = nn.Sequential(nn.Conv2d(8, 8, 1), nn.SyncBatchNorm(8), nn.ReLU())
    _, report = tcf.fuse(sync)
    assert not report.replaced and "SyncBatchNorm" in report[0].reason
    shared = nn.Sequential(conv, bn, nn.ReLU(), conv, bn, nn.ReLU())
    _, report = tcf.fuse(shared, use_fx=False)
    assert not report.replaced and "used more than once" in report[0].reason


class _SubclassConv(nn.Conv2d):
    """A Conv2d subclass (as timm's StdConv2d and Conv2dSame): fuse() leaves it, and counts it among the convs."""


@pytest.mark.parametrize("use_fx", [True, False], ids=["traced", "sequential"])
def test_the_report_counts_every_conv_and_only_convs(use_fx):
    model = nn.Sequential(_SubclassConv(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.SyncBatchNorm(8), nn.ReLU(), nn.BatchNorm2d(8), nn.ReLU())
    fused, report = tcf.fuse(model, use_fx=use_fx)
    replaced, total, why_not = report.conv_coverage()
    assert (replaced, total, list(why_not)) == (1, 2, ["0"]), str(report)
    assert [r.convs for r in report] == [1, 1] + [0] * (len(report) - 2), str(report)  # BatchNorm rows: none
    assert "(1 of 2 Conv2d layers)" in report.summary()
    assert tcf.fuse(fused, use_fx=use_fx)[1].conv_coverage()[:2] == (1, 2)


def test_a_conv_its_traced_forward_never_calls_is_reported_and_counted():
    class Spare(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = conv_bn_relu_seq()
            self.spare = nn.Conv2d(8, 8, 1)  # registered, never called

        def forward(self, x):
            return self.body(x)

    _, report = tcf.fuse(Spare())
    spare = [row for row in report if row.path == "spare"]
    assert len(spare) == 1, str(report)
    assert not spare[0].replaced and spare[0].reason == "not called in forward" and spare[0].convs == 1
    assert report.conv_coverage()[:2] == (1, 2)


def test_fuse_non_traceable_model_rewrites_its_children_and_says_why():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = conv_bn_relu_seq()

        def forward(self, x):
            if x.sum() > 0:  # control flow on a tensor value: torch.fx cannot trace it
                return self.body(x)
            return self.body(-x)

    class DataDependent(DataDependent):  # and a conv of its own, called from that forward
        def __init__(self):
            super().__init__()
            self.head = nn.Conv2d(16, 4, 1)

        def forward(self, x):
            return F.relu(self.head(super().forward(x)))

    plain = DataDependent()
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    assert report[0].path == "(model)" and "not traceable by torch.fx" in report[0].reason
    assert report[1].replaced and report[1].module == "Conv2dBNReLU" and report[1].path == "body.0"
    assert report[2].path == "head" and not report[2].replaced and report[2].convs == 1, str(report)
    assert "called from the forward of (model), which was not traced" in report[2].reason
    assert report.conv_coverage()[:2] == (1, 2)
    assert type(model) is DataDependent and type(plain.body) is nn.Sequential
    x = torch.randn(2, 8, 5, 5)
    torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)
    with pytest.raises(TypeError, match="model must be an nn.Module, got int"):
        tcf.fuse(3)


def test_fuse_keeps_training_and_eval_behaviour_of_a_forward_that_reads_self_training():
    """One torch.fx trace would freeze `if self.training` (stochastic depth, auxiliary heads): such a module keeps
    its forward and its children are rewritten."""

    class AuxInTraining(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = conv_bn_relu_seq()
            self.aux = nn.Conv2d(16, 4, 1)

        def forward(self, x):
            y = self.body(x)
            return (y, self.aux(y)) if self.training else y

    plain = AuxInTraining()
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    assert "differs between training and eval" in report[0].reason and report[0].path == "(model)"
    assert rows_by_path(report)["body.0"].module == "Conv2dBNReLU"
    x = torch.randn(2, 8, 5, 5)
    torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)
    model.eval(), eager.eval()
    torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)


class BatchNormAct2d(nn.BatchNorm2d):
    """A stand-in for timm's BatchNormAct2d, recognized by its class name and module (it has both)."""

    def __init__(self, channels, act):
        super().__init__(channels)
        self.drop, self.act = nn.Identity(), act

    def forward(self, x):
        return self.act(self.drop(F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                               self.training, self.momentum, self.eps)))


BatchNormAct2d.__module__ = "timm.layers.norm_act"


def test_fuse_timm_style_batchnorm_act_and_identity_in_the_chain():
    """timm's BatchNormAct2d is recognized by its class name and module (this stand-in has both), with its
    activation fused (ReLU, SiLU) or applied after the fused conv + BatchNorm (GELU)."""
    plain = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), BatchNormAct2d(16, nn.ReLU(inplace=True)),
                          nn.Conv2d(16, 16, 1, bias=False), BatchNormAct2d(16, nn.GELU()),
                          nn.Conv2d(16, 16, 1), nn.Identity(), nn.ReLU(),
                          nn.Conv2d(16, 16, 1, bias=False), BatchNormAct2d(16, nn.SiLU()))
    eager = copy.deepcopy(plain)
    for use_fx in (True, False):
        model, report = tcf.fuse(plain, use_fx=use_fx)
        rows = rows_by_path(report)
        assert rows["0"].module == "Conv2dBNReLU" and rows["0"].pattern == "Conv2d -> BatchNormAct2d(ReLU)"
        assert rows["2"].module == "Conv2dBN" and "GELU after it applied as before" in rows["2"].reason
        assert rows["4"].module == "Conv2dReLU" if use_fx else not rows["4"].replaced
        assert rows["7"].module == "Conv2dBN" and rows["7"].pattern == "Conv2d -> BatchNormAct2d(SiLU)"
        assert model.get_submodule("7").activation == "silu" and rows["7"].reason == ""
        assert set(model.state_dict()) == set(plain.state_dict())
        x = torch.randn(2, 8, 6, 6)
        for mode in (True, False):
            model.train(mode), eager.train(mode)
            torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)
        plain.load_state_dict(eager.state_dict())  # statistics were shared with the fused model: align again


def test_mobilenet_v1_shape_and_width():
    model = mobilenet_v1()
    assert model.classifier.out_features == 1000 and model.classifier.in_features == 1024
    assert sum(isinstance(m, nn.Conv2d) and m.groups > 1 for m in model.modules()) == 13
    small = mobilenet_v1(num_classes=5, width_multiplier=0.5)
    assert small(torch.randn(1, 3, 64, 64)).shape == (1, 5)
    with pytest.raises(ValueError, match="width_multiplier must be > 0"):
        mobilenet_v1(width_multiplier=0)


class _Readers(nn.Module):
    """A conv whose output is read by `readers` (each a callable of the conv's output), the results concatenated."""

    def __init__(self, *readers):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.readers = nn.ModuleList(r for r in readers if isinstance(r, nn.Module))
        self.functions = [r for r in readers if not isinstance(r, nn.Module)]

    def forward(self, x):
        y = self.conv(x)
        return torch.cat([r(y) for r in self.readers] + [f(y) for f in self.functions], 1)


@pytest.mark.parametrize("readers, reason", [
    # a reader that would have continued a pattern: the shared output is why
    ((nn.BatchNorm2d(8), torch.sigmoid), "its output goes to 2 operations (BatchNorm2d, sigmoid): its output is also "
                                         "used elsewhere"),
    ((nn.Identity(), torch.sigmoid), "also used elsewhere"),  # what follows an nn.Identity is not looked at
    ((nn.ReLU(), torch.sigmoid), "its output goes to 2 operations (ReLU, sigmoid): its output is also used elsewhere"),
    ((lambda y: F.relu(y + 1.0 * y.detach()), torch.tanh), "also used elsewhere"),
    # readers none of which is fusable after a conv: nothing fusable follows, whatever their number
    ((torch.sigmoid, torch.tanh, torch.sigmoid), "nothing fusable follows it (patterns: Conv2d -> BatchNorm2d / ReLU / "
                                                 "add -> ReLU); its output goes to 3 operations (sigmoid × 2, tanh)"),
    ((nn.GELU(), torch.sigmoid), "nothing fusable follows it"),
    ((lambda y: y + y.detach(), torch.tanh), "nothing fusable follows it"),  # an add with no ReLU after it
    ((nn.AvgPool2d(1),), "nothing fusable follows it (patterns: Conv2d -> BatchNorm2d / ReLU / add -> ReLU); its "
                         "output goes to AvgPool2d"),
], ids=["batchnorm", "identity", "relu", "add-relu", "three-unfusable", "gelu", "add-alone", "one-reader"])
def test_a_conv_left_alone_is_reported_shared_only_where_a_reader_would_fuse(readers, reason):
    model = _Readers(*readers)
    _, report = tcf.fuse(model)
    row = next(row for row in report if row.path == "conv")
    assert not row.replaced and reason in row.reason, row.reason
    assert ("also used elsewhere" in row.reason) != ("nothing fusable follows" in row.reason), row.reason


class _LeakyNet(nn.Module):
    """LeakyReLU after a conv + BatchNorm in the three forms models write it (an nn.LeakyReLU, F.leaky_relu with its
    slope, timm's BatchNormAct2d holding one), and after a conv alone."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.act1 = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), \
            nn.LeakyReLU(0.1, inplace=True)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.conv3, self.bn3 = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16)
        self.conv4 = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = F.leaky_relu(self.bn2(self.conv2(x)), negative_slope=0.2)
        x = F.leaky_relu(self.bn3(self.conv3(x)))  # the default slope, 0.01
        return F.leaky_relu(self.conv4(x), 0.3)  # no BatchNorm: not fused


def test_fuse_leaky_relu_after_conv_and_batch_norm_with_its_slope():
    torch.manual_seed(0)
    plain = _LeakyNet()
    eager = copy.deepcopy(plain)
    model, report = tcf.fuse(plain)
    rows = rows_by_path(report)
    for path, pattern, slope in (("conv1", "Conv2d -> BatchNorm2d -> LeakyReLU", 0.1),
                                 ("conv2", "Conv2d -> BatchNorm2d -> leaky_relu", 0.2),
                                 ("conv3", "Conv2d -> BatchNorm2d -> leaky_relu", 0.01)):
        fused = model.get_submodule(path)
        assert rows[path].module == "Conv2dBN" and rows[path].pattern == pattern and rows[path].reason == "", rows[path]
        assert (fused.activation, fused.negative_slope) == ("leaky_relu", slope), path
    assert not rows["conv4"].replaced and "LeakyReLU without a BatchNorm" in rows["conv4"].reason
    assert type(plain.act1) is nn.LeakyReLU and type(plain.conv1) is nn.Conv2d  # the original is untouched
    x = torch.randn(2, 8, 6, 6) * 3
    for mode in (True, False):  # on the CPU: the eager composition, so exactly eager's numbers
        model.train(mode), eager.train(mode)
        torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)
    model.train(), eager.train()
    model(x).sum().backward(), eager(x).sum().backward()
    for (name, got), want in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=0, atol=0, msg=name)


def test_fuse_leaky_relu_in_a_sequential_and_in_timm_batch_norm_act():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), BatchNormAct2d(16, nn.LeakyReLU(0.1)),
                          nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16), nn.LeakyReLU(0.05))
    eager = copy.deepcopy(plain)
    for use_fx in (True, False):
        model, report = tcf.fuse(plain, use_fx=use_fx)
        rows = rows_by_path(report)
        assert rows["0"].pattern == "Conv2d -> BatchNormAct2d(LeakyReLU)" and rows["0"].module == "Conv2dBN"
        assert rows["2"].pattern == "Conv2d -> BatchNorm2d -> LeakyReLU" and rows["2"].module == "Conv2dBN"
        assert [model.get_submodule(p).negative_slope for p in ("0", "2")] == [0.1, 0.05], use_fx
        x = torch.randn(2, 8, 6, 6)
        for mode in (True, False):
            model.train(mode), eager.train(mode)
            torch.testing.assert_close(model(x), eager(x), rtol=0, atol=0)
        plain.load_state_dict(eager.state_dict())  # statistics were shared with the fused model: align again
