"""Module API, fallback decisions and argument errors. Runs on the CPU (the eager composition) everywhere."""

import copy
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops.conv import conv_padding

CONV_ARGS = [
    dict(in_channels=8, out_channels=16, kernel_size=3, padding=1),
    dict(in_channels=8, out_channels=16, kernel_size=1, bias=False),
    dict(in_channels=8, out_channels=8, kernel_size=3, stride=2, padding=(1, 0), dilation=(1, 2)),
    dict(in_channels=8, out_channels=8, kernel_size=4, padding="same"),
    dict(in_channels=8, out_channels=8, kernel_size=3, padding="valid", groups=2),
    dict(in_channels=8, out_channels=8, kernel_size=3, padding=1, padding_mode="reflect"),
]


@pytest.mark.parametrize("kwargs", CONV_ARGS)
def test_module_matches_conv2d_relu(kwargs):
    torch.manual_seed(0)
    conv = nn.Conv2d(**kwargs)
    fused = tcf.Conv2dReLU.from_conv(conv)
    x = torch.randn(2, 8, 11, 9)
    torch.testing.assert_close(fused(x), F.relu(conv(x)), rtol=0, atol=0)


def test_add_relu_module_matches_eager():
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1)
    fused = tcf.Conv2dAddReLU.from_conv(conv)
    x, residual = torch.randn(2, 8, 7, 7), torch.randn(2, 8, 7, 7)
    torch.testing.assert_close(fused(x, residual), F.relu(conv(x) + residual), rtol=0, atol=0)


def test_functional_identity_activation():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 8, 6, 6), torch.randn(4, 8, 3, 3), torch.randn(4)
    out = tcf.conv2d_bias_act(x, w, b, stride=1, padding=1, activation=None)
    torch.testing.assert_close(out, F.conv2d(x, w, b, 1, 1), rtol=0, atol=0)
    assert (out < 0).any(), "identity activation must keep negative values"


def test_functional_relu6_activation_off_cuda_is_eagers():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 8, 6, 6) * 4, torch.randn(4, 8, 3, 3), torch.randn(4)
    out = tcf.conv2d_bias_act(x, w, b, stride=1, padding=1, activation="relu6")
    torch.testing.assert_close(out, F.relu6(F.conv2d(x, w, b, 1, 1)), rtol=0, atol=0)
    assert (out == 6).any() and (out == 0).any(), "the inputs must reach both clips"


def test_state_dict_and_repr_are_conv2d_ones():
    conv = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=True)
    fused = tcf.Conv2dReLU(8, 16, 3, stride=2, padding=1, bias=True)
    assert list(fused.state_dict()) == list(conv.state_dict()) == ["weight", "bias"]
    assert [n for n, _ in fused.named_parameters()] == ["weight", "bias"]
    assert fused.extra_repr() == conv.extra_repr()
    fused.load_state_dict(conv.state_dict())
    torch.testing.assert_close(fused.weight, conv.weight)
    conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
    conv2.load_state_dict(fused.state_dict())  # and back
    torch.testing.assert_close(conv2.bias, fused.bias)


def test_from_conv_shares_parameters_and_reset_parameters_works():
    conv = nn.Conv2d(8, 16, 3)
    fused = tcf.Conv2dReLU.from_conv(conv)
    assert fused.weight is conv.weight and fused.bias is conv.bias
    before = fused.weight.detach().clone()
    fused.reset_parameters()
    assert not torch.equal(before, fused.weight.detach())
    assert fused.weight is conv.weight  # reset in place, still shared


def test_works_in_sequential_and_backward_on_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(tcf.Conv2dReLU(3, 8, 3, padding=1), tcf.Conv2dReLU(8, 8, 1))
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    model(x).sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in model.parameters())


def test_cpu_status_says_why_not_fused():
    layer = tcf.Conv2dReLU(8, 8, 3, padding=1)
    assert not layer.fusion_status.fused and layer.fusion_status.reason.startswith("not run yet")
    layer(torch.randn(1, 8, 5, 5))
    assert not layer.fusion_status.fused
    assert layer.fusion_status.reason == "x is on cpu: the fused path runs on CUDA tensors"
    assert str(layer.fusion_status).startswith("eager: x is on cpu")


@pytest.mark.parametrize(
    "make, dtype, expected",
    [
        (lambda: tcf.Conv2dReLU(8, 8, 3, padding=1, padding_mode="reflect"), torch.float32,
         "padding_mode='reflect': cuDNN graphs pad with zeros only"),
        (lambda: tcf.Conv2dReLU(8, 8, 3, padding=1), torch.float64, "dtype torch.float64"),
    ],
)
def test_policy_fallback_reasons(make, dtype, expected):
    layer = make().to(dtype)
    layer(torch.randn(1, layer.in_channels, 6, 6, dtype=dtype))
    assert not layer.fusion_status.fused
    assert layer.fusion_status.reason.startswith(expected), layer.fusion_status.reason


def test_strict_raises_with_the_reason():
    layer = tcf.Conv2dReLU(8, 8, 3, padding=1, groups=2, strict=True)
    with pytest.raises(tcf.FusionError, match="cannot run fused: x is on cpu"):
        layer(torch.randn(1, 8, 5, 5))
    loose = tcf.Conv2dReLU(8, 8, 3, padding=1)
    loose(torch.randn(1, 8, 5, 5))  # runs eager; the same input signature must not skip the check in strict mode
    with tcf.strict():
        assert tcf.is_strict()
        with pytest.raises(tcf.FusionError, match="x is on cpu"):
            loose(torch.randn(1, 8, 5, 5))
    assert not tcf.is_strict()
    loose(torch.randn(1, 8, 5, 5))  # runs eager again


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3, dtype=torch.float64)),
         r"weight dtype must match x dtype \(torch.float32\), got torch.float64"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3, device="meta")),
         r"weight must be on the same device as x \(cpu\), got meta"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 6, 5, 5), torch.randn(4, 8, 3, 3)),
         r"x has 6 channels but weight of shape \[4, 8, 3, 3\] with groups=1 expects 8"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), torch.randn(5)),
         r"bias must have shape \[4\] \(out_channels\), got \[5\]"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), stride=0),
         r"stride must be >= 1, got 0"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), stride=(1, 0)),
         r"stride must be >= 1, got \(1, 0\)"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), dilation=(0, 1)),
         r"dilation must be >= 1, got \(0, 1\)"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), padding=-1),
         r"padding must be >= 0, got -1"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), groups=0),
         r"groups must be an int >= 1, got 0"),
        (lambda: tcf.Conv2dReLU(8, 4, 3, stride=(1, 0))(torch.randn(1, 8, 5, 5)),
         r"stride must be >= 1, got \(1, 0\)"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), activation="gelu"),
         r"activation must be 'relu', 'relu6', 'identity' or None, got 'gelu'"),
        (lambda: tcf.conv2d_bias_act(torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3), stride=2, padding="same"),
         r"padding='same' is not supported for strided convolutions \(stride=\(2, 2\)\)"),
    ],
)
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("shape", [(8, 5), (1, 8, 5, 5, 5), (8, 5, 5)], ids=["2-D", "5-D", "3-D"])
def test_an_input_eager_refuses_raises_eagers_error_type(shape):
    """A drop-in raises what eager's modules raise where they refuse x's dimensions (an `except` written for eager
    must still catch it): nn.Conv2d a RuntimeError, nn.BatchNorm2d after it a ValueError for [C, H, W]."""
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 16, 3, padding=1)
    x = torch.randn(*shape)
    pairs = [
        (nn.Sequential(conv, nn.ReLU()), tcf.Conv2dReLU.from_conv(conv)),
        (nn.Sequential(conv, nn.BatchNorm2d(16), nn.ReLU()),
         tcf.Conv2dBNReLU.from_modules(conv, nn.BatchNorm2d(16))),
        (lambda t: F.relu(F.conv2d(t, conv.weight, conv.bias, padding=1)),
         lambda t: tcf.conv2d_bias_act(t, conv.weight, conv.bias, padding=1, activation="relu")),
    ]
    for eager, fused in pairs:
        try:
            expected = eager(x)
        except (RuntimeError, ValueError) as error:
            with pytest.raises(type(error), match=r"4-D tensor \[N, C, H, W\]|expected 4D input") as raised:
                fused(x)
            assert isinstance(raised.value, ValueError) == isinstance(error, ValueError)
        else:
            torch.testing.assert_close(fused(x), expected, rtol=0, atol=0)


def test_unbatched_input_runs_as_nn_conv2d_does():
    torch.manual_seed(0)
    layer = tcf.Conv2dReLU(8, 16, 3, padding=1)
    x = torch.randn(8, 5, 5)
    out = layer(x)
    assert out.shape == (16, 5, 5)
    torch.testing.assert_close(out, F.relu(F.conv2d(x, layer.weight, layer.bias, padding=1)), rtol=0, atol=0)
    add = tcf.Conv2dAddReLU.from_conv(layer)
    residual = torch.randn(16, 5, 5)
    torch.testing.assert_close(add(x, residual), F.relu(F.conv2d(x, layer.weight, layer.bias, padding=1) + residual),
                               rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"expected 4D input \(got 3D input\)"):  # as nn.BatchNorm2d after the conv
        tcf.Conv2dBNReLU(8, 16, 3)(x)


@pytest.mark.parametrize("residual_shape, dtype, why", [
    ((16, 1, 1), torch.float32, r"the residual's shape \[16, 1, 1\] is not the output's \[2, 16, 5, 5\]: eager broadcasts"),
    ((2, 16, 5, 5), torch.float64, r"the residual is torch.float64 but the output is torch.float32: eager promotes"),
])
def test_residual_eager_would_broadcast_or_promote_runs_eager_with_the_reason(residual_shape, dtype, why):
    torch.manual_seed(0)
    layer = tcf.Conv2dAddReLU(8, 16, 3, padding=1)
    x, residual = torch.randn(2, 8, 5, 5), torch.randn(*residual_shape, dtype=dtype)
    out = layer(x, residual)
    expected = F.relu(F.conv2d(x, layer.weight, layer.bias, padding=1) + residual)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert re.search(why, layer.fusion_status.reason), layer.fusion_status.reason
    with pytest.raises(tcf.FusionError, match=why):
        tcf.Conv2dAddReLU.from_conv(layer, strict=True)(x, residual)
    conv, norm = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
    fused = tcf.Conv2dBNAddReLU.from_modules(copy.deepcopy(conv), copy.deepcopy(norm))
    torch.testing.assert_close(fused(x, residual), F.relu(norm(conv(x)) + residual), rtol=0, atol=0)
    assert re.search(why, fused.fusion_status.reason), fused.fusion_status.reason
    torch.testing.assert_close(fused.bn.running_var, norm.running_var, rtol=0, atol=0)


def test_zero_size_batch_returns_empty():
    layer = tcf.Conv2dReLU(8, 16, 3, padding=1)
    out = layer(torch.randn(0, 8, 5, 5))
    assert out.shape == (0, 16, 5, 5)


@pytest.mark.parametrize("kernel, dilation", [(4, 1), (3, 1), (2, 3), (5, 2)])
def test_same_padding_matches_pytorch(kernel, dilation):
    pre, post = conv_padding("same", (kernel, kernel), (dilation, dilation), (1, 1))
    x, w = torch.randn(1, 2, 9, 9), torch.randn(2, 2, kernel, kernel)
    ours = F.conv2d(F.pad(x, (pre[1], post[1], pre[0], post[0])), w, dilation=dilation)
    torch.testing.assert_close(ours, F.conv2d(x, w, padding="same", dilation=dilation))


def test_fusion_report_lists_every_fused_layer():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), tcf.Conv2dReLU(8, 8, 3, padding=1),
                          nn.Sequential(tcf.Conv2dReLU(8, 8, 3, padding=1, groups=4)))
    model(torch.randn(1, 3, 8, 8))
    report = tcf.fusion_report(model)
    assert [row.path for row in report] == ["1", "2.0"]
    assert report[1].status.reason.startswith("x is on cpu")
    text = str(report)
    assert "Conv2dReLU" in text and "x is on cpu" in text and text.splitlines()[0].startswith("layer")


def test_copies_are_new_layers():
    layer = tcf.Conv2dReLU(8, 8, 3, padding=1)
    layer(torch.randn(1, 8, 5, 5))
    assert layer.fusion_status.reason.startswith("x is on cpu")
    clone = copy.deepcopy(layer)
    assert clone._call is not layer._call
    assert clone.fusion_status.reason.startswith("not run yet")
    restored = pickle.loads(pickle.dumps(layer))
    assert restored._call is not layer._call and restored.fusion_status.reason.startswith("not run yet")
    torch.testing.assert_close(restored.weight, layer.weight)


def test_autocast_on_cpu_runs_in_the_autocast_dtype():
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3, padding=1)
    fused = tcf.Conv2dReLU.from_conv(conv)
    x = torch.randn(2, 8, 6, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = fused(x), F.relu(conv(x))
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected)


def test_compiles_fullgraph_on_cpu():
    """The Python decision logic must trace: torch.compile(fullgraph=True) raises on any graph break."""
    torch.manual_seed(0)
    model = nn.Sequential(tcf.Conv2dReLU(8, 8, 3, padding=1), tcf.Conv2dReLU(8, 4, 1))
    x = torch.randn(2, 8, 6, 6)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), model(x))
    assert model[0].fusion_status.reason.startswith("x is on cpu")


def test_decisions_stay_constant_under_compile(monkeypatch):
    """torch.compile keeps the decision it traced: the compiled code decides nothing again, and the module still
    reports the decision (kept in its own LayerCall)."""
    from torch_cudnn_fusion.ops import decide

    asked = []
    python_reason = decide._python_reason
    monkeypatch.setattr(decide, "_python_reason", lambda *args: asked.append(args) or python_reason(*args))
    model = nn.Sequential(tcf.Conv2dReLU(8, 8, 3, padding=1), tcf.Conv2dReLU(8, 4, 1))
    import torch._dynamo

    torch._dynamo.reset()  # code compiled by another test for the same layers would be reused, decisions included
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 8, 6, 6)
    compiled(x)
    traced = len(asked)
    assert traced >= 2  # one decision per layer, made while tracing
    expected = F.relu(F.conv2d(F.relu(F.conv2d(x, model[0].weight, model[0].bias, padding=1)), model[1].weight,
                               model[1].bias))
    for _ in range(3):
        torch.testing.assert_close(compiled(x), expected)
    assert len(asked) == traced
    assert all(layer.fusion_status.reason.startswith("x is on cpu") for layer in model)


def test_training_conv_batch_norm_decision_traces_where_it_fuses(monkeypatch):
    """The training conv + BatchNorm decision traces under torch.compile(fullgraph=True) also where it fuses: it once
    used namedtuple._replace, which dynamo cannot trace, and compiling any model with a training Conv2dBN* failed on a
    GPU. On the CPU the layer never fuses, so the extension's verdicts are stood in for."""
    from torch_cudnn_fusion._compile import constant_under_compile
    from torch_cudnn_fusion.ops import batch_norm, decide

    monkeypatch.setattr(batch_norm, "_eager_reason", lambda *args: "")
    monkeypatch.setattr(batch_norm, "policy_id", lambda key: 0)
    # as the real verdict: a Decision from a function marked constant under compile
    verdict = constant_under_compile(lambda values: decide.Decision(True, "", (), "cudnn_graph"))
    monkeypatch.setattr(decide, "_decide_batch_norm", verdict)
    conv, bn = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)

    def decide_and_scale(x):
        decision, _, run = batch_norm._decide_conv_batch_norm(
            x, conv, conv.weight, None, bn.running_mean, bn.weight, bn.bias, bn.eps, "relu", None, None,
            tcf.policy.resolve(None))
        assert decision.fused and decision.reason == "conv: PyTorch's cuDNN call"
        return x * 2 if run[0] else x

    x = torch.randn(2, 8, 6, 6)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(decide_and_scale, fullgraph=True, backend="eager")(x), x * 2)


def test_compiles_fullgraph_with_dynamic_shapes_on_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(tcf.Conv2dReLU(8, 8, 3, padding=1), tcf.Conv2dReLU(8, 4, 1))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for size in (6, 7, 9):
        x = torch.randn(2, 8, size, size)
        torch.testing.assert_close(compiled(x), model(x))


def test_environment_variable_turns_strict_on():
    code = "import torch_cudnn_fusion as t; print(t.is_strict())"
    env = dict(os.environ, TORCH_CUDNN_FUSION_STRICT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_explain_on_cpu_reports_each_fallback():
    model = nn.Sequential(tcf.Conv2dReLU(8, 8, 3, padding=1), nn.Sequential(tcf.Conv2dReLU(8, 8, 3, padding=1, groups=2)),
                          tcf.Conv2dReLU(8, 8, 1))
    report = tcf.explain(model[:2], torch.randn(1, 8, 6, 6))
    assert [row.path for row in report] == ["0", "1.0"]
    assert not report[0].fused and report[0].reason.startswith("x is on cpu")
    assert report[1].reason.startswith("x is on cpu")
    assert report[0].median_ms is None  # timed on CUDA only
    assert "eager: x is on cpu" in str(report)


def test_import_is_cheap_and_writes_no_environment_variable():
    code = ("import os, sys, torch; before = dict(os.environ); import torch_cudnn_fusion; "
            "print('torch._dynamo' in sys.modules, dict(os.environ) == before)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr


def test_compile_mark_is_what_torch_compiler_assume_constant_result_sets():
    """_compile.constant_under_compile marks without importing torch._dynamo; if torch's decorator ever did more
    than set attributes, this fails."""
    from torch_cudnn_fusion._compile import constant_under_compile

    def ours():
        return 1

    def theirs():
        return 1

    import torch._dynamo  # noqa: F401 — after this import constant_under_compile defers to torch's decorator
    marked = torch.compiler.assume_constant_result(theirs)
    assert marked is theirs and vars(theirs)
    saved = sys.modules.pop("torch._dynamo")
    try:
        assert constant_under_compile(ours) is ours
    finally:
        sys.modules["torch._dynamo"] = saved
    assert vars(ours) == vars(theirs), (vars(ours), vars(theirs))
