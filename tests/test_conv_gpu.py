"""Numerics of the fused layer on the GPU: forward and every gradient against eager PyTorch and a float64
reference, with outputs poisoned (NaN) before each graph runs, and a check of which path ran and why."""

import pytest
import torch

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops import LayerCall

from conftest import assert_as_accurate_as_eager, gpu, reference_conv_bias_act, without_ambiguous_relu6_gradient

pytestmark = gpu

# name, in_channels, out_channels, kernel, stride, padding, dilation, (N, H, W)
CONFIGS = [
    ("1x1", 16, 32, 1, 1, 0, 1, (2, 14, 14)),
    ("3x3-odd-spatial", 32, 32, 3, 1, 1, 1, (2, 15, 17)),
    ("3x3-stride2-batch1", 32, 64, 3, 2, 1, 1, (1, 16, 16)),
    ("5x5", 16, 16, 5, 1, 2, 1, (2, 13, 13)),
    ("7x7-stride2", 8, 16, 7, 2, 3, 1, (2, 23, 23)),
    ("3x3-dilation2", 16, 16, 3, 1, 2, 2, (2, 12, 12)),
    ("4x4-same", 16, 16, 4, 1, "same", 1, (2, 10, 10)),
    ("3x3-padding(0,1)", 16, 24, 3, 1, (0, 1), 1, (2, 9, 11)),
    ("3x3-channels12to20", 12, 20, 3, 1, 1, 1, (2, 10, 10)),
]
VARIANTS = {  # name: (bias, residual, activation)
    "bias+relu": (True, False, "relu"),
    "relu": (False, False, "relu"),
    "bias+residual+relu": (True, True, "relu"),
    "bias+identity": (True, False, None),
    "bias+relu6": (True, False, "relu6"),  # inputs scaled by 4: outputs of std about 4, some clip at 6
}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _policy_allows(dtype, cin, cout):
    multiple = 4 if dtype == torch.float32 else 8
    return cin % multiple == 0 and cout % multiple == 0


def _check_path(status, dtype, channels_last, cin, cout, activation):
    """Which path must have run, and for a fallback, that its reason is the expected one."""
    if not _policy_allows(dtype, cin, cout):
        assert not status.fused and "multiple" in status.reason, status
        return
    refusals = ([] if status.fused else [status.reason]) + [why for _, why in status.backward if why]
    if channels_last and dtype != torch.float32:
        assert status.fused and not refusals, f"NHWC {dtype} must run fused end to end: {status}"
    if status.fused and activation == "relu6":
        assert status.reason.startswith("ReLU6 runs as a clamp after the graph"), status
    if activation == "relu6" and not channels_last and status.fused:  # ReLU6's backward: no cuDNN graph, eager's
        backward = dict(status.backward)["relu_bias_backward"]
        assert "ReLU6's backward runs in our kernel for channels_last" in backward, status
        refusals.remove(backward)
    for reason in refusals:
        # Anything cuDNN refused must be traced to a requirement this configuration does not meet.
        expected = "layout: tensors are NCHW" if not channels_last else "allow_tf32=False"
        assert reason.startswith("cuDNN refused") and expected in reason, reason


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_forward_and_gradients_match_eager_and_float64(extension, no_tf32, config, variant, dtype, layout):
    name, cin, cout, kernel, stride, padding, dilation, (n, h, w) = config
    has_bias, has_residual, activation = VARIANTS[variant]
    channels_last = layout == "channels_last"
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(hash((name, variant, str(dtype), layout)) % 2**31)

    def make(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda") * scale).to(dtype)

    x = make(n, cin, h, w, scale=4.0 if activation == "relu6" else 1.0).contiguous(memory_format=memory_format)
    weight = make(cout, cin, kernel, kernel, scale=(cin * kernel * kernel) ** -0.5)
    weight = weight.contiguous(memory_format=memory_format)
    bias = make(cout) if has_bias else None
    out_shape = reference_conv_bias_act(x, weight, None, None, stride, padding, dilation, 1, False).shape
    residual = make(*out_shape).contiguous(memory_format=memory_format) if has_residual else None
    leaves = [t.requires_grad_() for t in (x, weight, bias, residual) if t is not None]

    fallbacks_before = extension.plan_cache_stats()["runtime_fallbacks"]
    call = LayerCall()  # keeps the decision of this functional call
    y = tcf.conv2d_bias_act(x, weight, bias, residual, stride, padding, dilation, 1, activation, call=call)
    status = call.status
    grad_y = torch.randn_like(y)
    if activation == "relu6":
        inputs64 = [t.detach().double() if t is not None else None for t in (x, weight, bias, residual)]
        z64 = reference_conv_bias_act(*inputs64, stride, padding, dilation, 1, False)
        grad_y = without_ambiguous_relu6_gradient(grad_y, z64, dtype)
    grads = torch.autograd.grad(y, leaves, grad_y)
    _check_path(status, dtype, channels_last, cin, cout, activation)
    if status.fused and not any(why for _, why in status.backward):
        # The fused graphs ran: no op fell back to ATen at run time.
        assert extension.plan_cache_stats()["runtime_fallbacks"] == fallbacks_before

    relu = activation if activation == "relu6" else activation == "relu"
    eager_y = reference_conv_bias_act(x, weight, bias, residual, stride, padding, dilation, 1, relu)
    eager_grads = torch.autograd.grad(eager_y, leaves, grad_y)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(leaves64)
    x64, w64 = next(it), next(it)
    b64 = next(it) if has_bias else None
    r64 = next(it) if has_residual else None
    ref_y = reference_conv_bias_act(x64, w64, b64, r64, stride, padding, dilation, 1, relu)
    ref_grads = torch.autograd.grad(ref_y, leaves64, grad_y.double())

    assert y.shape == eager_y.shape and y.dtype == eager_y.dtype
    assert y.is_contiguous(memory_format=memory_format) == eager_y.is_contiguous(memory_format=memory_format)
    assert_as_accurate_as_eager("y", y, eager_y, ref_y, dtype)
    names = ["grad_x", "grad_weight", "grad_bias", "grad_residual"]
    present = [nm for nm, t in zip(names, (x, weight, bias, residual)) if t is not None]
    for nm, got, eager, ref in zip(present, grads, eager_grads, ref_grads):
        assert got.shape == ref.shape and got.dtype == dtype, nm
        assert_as_accurate_as_eager(nm, got, eager, ref, dtype)
