"""conv2d_bias_act: act(conv2d(x, weight) + bias + residual) as one cuDNN graph, or eager where it cannot be; the
argument checks and the eager composition the BatchNorm functions share."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .. import _extension
from .._cpp_enums import CONV_ACTIVATION_NAMES, Activation
from ..policy import EnginePolicy, policy_id, resolve
from . import decide
from .decide import Decision
from .layer_call import LayerCall
from .library import conv_output_size
from .stem import input_like, weight_like

_IntPair = Union[int, Sequence[int]]


def int_pair(value: _IntPair, name: str, minimum: int) -> tuple[int, int]:
    """(height, width) from an int or a pair, each at least `minimum` (checked here, before any C++ arithmetic: a
    stride of 0 reached a division there and killed the process)."""
    values = (value, value) if isinstance(value, int) else tuple(value)
    if len(values) == 1:
        values = (values[0], values[0])
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{name} must be an int or a pair of ints (height, width), got {value!r}")
    if min(values) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return values  # type: ignore[return-value]


def conv_padding(padding: Union[str, _IntPair], kernel_size: Sequence[int], dilation: Sequence[int],
                 stride: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(padding before, padding after) per spatial dim, as nn.Conv2d applies `padding`."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding != "same":
            raise ValueError(f"padding must be 'same', 'valid', an int or a pair of ints, got {padding!r}")
        if any(s != 1 for s in stride):
            raise ValueError(f"padding='same' is not supported for strided convolutions (stride={tuple(stride)})")
        total = [d * (k - 1) for d, k in zip(dilation, kernel_size)]
        pre = tuple(t // 2 for t in total)
        post = tuple(t - p for t, p in zip(total, pre))
        return pre, post  # type: ignore[return-value]
    pair = int_pair(padding, "padding", 0)
    return pair, pair


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], groups: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:  # F.conv2d's error type, as a drop-in for nn.Conv2d must raise it
        raise RuntimeError(f"x must be a 4-D tensor [N, C, H, W] (or 3-D [C, H, W]), got a {x.dim()}-D tensor of "
                           f"shape {list(x.shape)}")
    if weight.dim() != 4:
        raise ValueError(f"weight must be a 4-D tensor [out_channels, in_channels / groups, kH, kW], got shape "
                         f"{list(weight.shape)}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"groups must be an int >= 1, got {groups!r}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if t.device != x.device:
            raise ValueError(f"{name} must be on the same device as x ({x.device}), got {t.device}")
        if t.dtype != x.dtype:
            raise ValueError(f"{name} dtype must match x dtype ({x.dtype}), got {t.dtype}")
    if x.shape[1] != weight.shape[1] * groups:
        raise ValueError(f"x has {x.shape[1]} channels but weight of shape {list(weight.shape)} with groups={groups} "
                         f"expects {weight.shape[1] * groups}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape [{weight.shape[0]}] (out_channels), got {list(bias.shape)}")


def _autocast_casts(t: Optional[torch.Tensor]) -> bool:
    """Whether torch.autocast, when on, casts `t` as a conv's operand: floating point but not float64."""
    return t is not None and t.is_floating_point() and t.dtype != torch.float64


def autocast_dtype(t: Optional[torch.Tensor], device_type: str) -> Optional[torch.dtype]:
    """The dtype torch.autocast casts `t` to as a conv's operand on `device_type`, or None where it leaves `t` as it
    is."""
    if not torch.is_autocast_enabled(device_type) or not _autocast_casts(t):
        return None
    return torch.get_autocast_dtype(device_type)


def _autocast(tensors: Sequence[Optional[torch.Tensor]], device_type: str) -> list[Optional[torch.Tensor]]:
    """Under torch.autocast, the conv's operands in the autocast dtype, as F.conv2d casts them (the residual is not
    one: eager adds it to the conv's output as it is)."""
    if not torch.is_autocast_enabled(device_type):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device_type)
    return [t.to(dtype) if _autocast_casts(t) else t for t in tensors]


def _eager(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, activation, padding_mode):
    """The composition the fused graph stands for, as nn.Conv2d + add + ReLU / ReLU6 compute it (activation: an
    Activation value)."""
    if padding_mode != "zeros":
        pads = (padding_pre[1], padding_post[1], padding_pre[0], padding_post[0])
        x = F.pad(x, pads, mode=padding_mode)
        y = F.conv2d(x, weight, bias, stride, 0, dilation, groups)
    elif padding_pre == padding_post:
        y = F.conv2d(x, weight, bias, stride, padding_pre, dilation, groups)
    else:  # 'same' with an even kernel pads more after than before
        x = F.pad(x, (padding_pre[1], padding_post[1], padding_pre[0], padding_post[0]))
        y = F.conv2d(x, weight, bias, stride, 0, dilation, groups)
    if residual is not None:
        y = y + residual
    return eager_activation(y, activation)


_IN_PLACE_ACTIVATIONS = {Activation.RELU: F.relu, Activation.RELU6: F.relu6, Activation.SILU: F.silu,
                         Activation.HARDSWISH: F.hardswish}


def eager_activation(y: torch.Tensor, activation: int, negative_slope: float = 0.01) -> torch.Tensor:
    """F.relu, F.relu6, F.silu, F.hardswish or F.leaky_relu (with negative_slope) of y in place, or y, by an
    Activation value: the activation of every eager composition here. y is always the composition's own fresh output
    (of a conv, a BatchNorm or an add, none of whose backwards reads it), as behind the models' nn.ReLU(inplace=True)
    and nn.SiLU(inplace=True): an out-of-place activation would hold a second tensor of y's size while y is alive,
    which raised densenet121's eval peak above eager's."""
    if activation == Activation.LEAKY_RELU:
        return F.leaky_relu(y, negative_slope, inplace=True)
    function = _IN_PLACE_ACTIVATIONS.get(activation)
    return y if function is None else function(y, inplace=True)


def odd_residual(residual: torch.Tensor, shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> str:
    """Why the fused add cannot take `residual` for an output of this shape, dtype and device ('' when it can):
    eager adds a residual that broadcasts, or has another dtype (promoting the sum), and so does the fallback."""
    if list(residual.shape) != list(shape):
        return (f"the residual's shape {list(residual.shape)} is not the output's {list(shape)}: eager broadcasts "
                "it, so the layer runs eager")
    if residual.dtype != dtype:
        return (f"the residual is {residual.dtype} but the output is {dtype}: eager promotes the sum, so the "
                "layer runs eager")
    if residual.device != device:
        return f"the residual is on {residual.device}, the output on {device}: eager decides what happens"
    return ""


def _signature(t: Optional[torch.Tensor]):
    """What of a tensor the decision depends on (the 16-byte alignment included)."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.data_ptr() % 16


def tensor_signature(t: Optional[torch.Tensor]):
    """What of a tensor a BatchNorm decision depends on (its layout through the strides; the op copies nothing it
    hands cuDNN from the caller, so alignment does not matter)."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.requires_grad


def conv2d_bias_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    residual: Optional[torch.Tensor] = None,
    stride: _IntPair = 1,
    padding: Union[str, _IntPair] = 0,
    dilation: _IntPair = 1,
    groups: int = 1,
    activation: Optional[str] = "relu",
    *,
    padding_mode: str = "zeros",
    strict: Optional[bool] = None,
    policy: Optional[EnginePolicy] = None,
    call: Optional[LayerCall] = None,
) -> torch.Tensor:
    """activation(conv2d(x, weight, bias, ...) + residual), arguments as F.conv2d's.

    activation: "relu", "relu6", or None / "identity". Runs as one cuDNN graph when the configuration allows (see
    torch_cudnn_fusion.ops.decide); otherwise as the eager composition. strict=True (or global strict mode) raises
    FusionError instead of running eager. policy: the EnginePolicy that chooses the cuDNN plans (None: the global
    one, see torch_cudnn_fusion.set_engine_policy). call: the LayerCall of the layer making the call (a module passes
    its own), which keeps the decision and lets a repeated call skip it; None decides this call alone.
    """
    if isinstance(x, torch.Tensor) and x.dim() == 3:  # unbatched [C, H, W], as nn.Conv2d takes it
        if residual is not None and residual.dim() == 3:
            residual = residual.unsqueeze(0)
        return conv2d_bias_act(x.unsqueeze(0), weight, bias, residual, stride, padding, dilation, groups, activation,
                               padding_mode=padding_mode, strict=strict, policy=policy, call=call).squeeze(0)
    device_type = x.device.type
    policy = resolve(policy)
    autocast = torch.is_autocast_enabled(device_type)
    signature = None
    if call is not None and not torch.compiler.is_compiling():
        settings = ("conv", stride, padding, dilation, groups, activation, padding_mode, strict, decide.is_strict(),
                    policy)
        if call.recorded is not None and call.signature[0] == settings:
            # C++ compares the tensors and the global state with the record: where the layer runs fused, it runs the
            # op when they match; where it runs eager, the composition runs here on the tensors as passed (autocast
            # casts them as it casts F.conv2d's)
            if call.run[0]:
                y = call.recorded.run(x, weight, bias, residual)
                if y is not None:
                    return y
            elif call.recorded.matches(x, weight, bias, residual):
                return _run(call.run, x, weight, bias, residual, padding_mode)
        signature = (settings, _signature(x), _signature(weight), _signature(bias), _signature(residual),
                     torch.is_grad_enabled(), torch.backends.cudnn.allow_tf32,
                     autocast and torch.get_autocast_dtype(device_type), torch.are_deterministic_algorithms_enabled())
        if call.signature == signature:
            if autocast:  # the space-to-depth form casts x and the weight as it rearranges them
                if call.run[2] is None:
                    x, weight, bias = _autocast((x, weight, bias), device_type)
                else:
                    bias, = _autocast((bias,), device_type)
            return _run(call.run, x, weight, bias, residual, padding_mode)
    passed = (x, weight, bias)  # as the caller passed them: what a record compares a repeat with

    act = int(Activation.from_name(activation, CONV_ACTIVATION_NAMES))
    if autocast:
        x, weight, bias = _autocast((x, weight, bias), device_type)
    _check_args(x, weight, bias, groups)
    stride_ = int_pair(stride, "stride", 1)
    dilation_ = int_pair(dilation, "dilation", 1)
    padding_pre, padding_post = conv_padding(padding, weight.shape[2:], dilation_, stride_)
    where = (f"the conv layer {x.shape[1]}->{weight.shape[0]} channels, kernel {weight.shape[2]}x{weight.shape[3]}, "
             f"input {list(x.shape)}")
    odd = ""
    if residual is not None:  # eager broadcasts or promotes the sum: the layer does exactly that
        expected = conv_output_size(x.shape, weight.shape, stride_, padding_pre, padding_post, dilation_)
        odd = odd_residual(residual, expected, x.dtype, x.device)
    config, stem = None, None
    if odd:
        decision = Decision.eager(odd)
    else:
        stem = decide.stem_plan(x, weight, stride_, padding_pre, padding_post, dilation_, groups, padding_mode, x.dtype)
        if stem is not None:  # decided on the form cuDNN will see; where it refuses that, on the conv as given
            config = decide.conv_config(input_like(passed[0], stem), weight_like(weight, stem), bias, residual, (1, 1),
                                        (0, 0), (0, 0), (1, 1), 1, act, padding_mode, policy.key)
            decision = decide.decide_conv(config)
            if decision.fused:
                decision = Decision(True, "; ".join(filter(None, (stem.note, decision.reason))), decision.backward,
                                    decision.implementation)
            else:
                stem = None
        if stem is None:
            config = decide.conv_config(x, weight, bias, residual, stride_, padding_pre, padding_post, dilation_,
                                        groups, act, padding_mode, policy.key)
            decision = decide.decide_conv(config)
    decide.raise_if_strict(decision, strict, where)
    geometry = (([1, 1], [0, 0], [0, 0], [1, 1], 1) if stem is not None
                else (list(stride_), list(padding_pre), list(padding_post), list(dilation_), groups))
    run = (decision.fused, (*geometry, act, policy_id(policy.key) if decision.fused else 0), stem)
    if call is not None:
        recorded = None
        # the record runs the op on x as given (or tells that a repeat matches an eager decision): not for an odd
        # residual, or an eager layer's call off CUDA or without the extension
        module = _extension.require() if decision.fused else _extension.load() if passed[0].is_cuda else None
        if signature is not None and not odd and module is not None:
            form = (stem.index, stem.inverse, stem.form) if stem is not None else ()
            recorded = module.ConvBiasActCall(*passed, residual, *run[1], *form)
        call.remember(decision, config, signature if not odd else None, run, recorded)
    return _run(run, *(passed[:2] if stem is not None else (x, weight)), bias, residual, padding_mode)


_fused_op = None  # torch.ops.cudnn_fusion.conv_bias_act.default, looked up once


def _run(run: tuple, x, weight, bias, residual, padding_mode):
    """The call as decided: run = (fused, (stride, padding_pre, padding_post, dilation, groups, activation, policy
    id), the space-to-depth form or None). x, weight and bias come in the conv's dtype, but for the form, which
    rearranges x and the weight as given into its dtype (the geometry is then the form's: the op
    cudnn_fusion::stem_conv_bias_act)."""
    global _fused_op
    fused, args, stem = run
    if fused:
        if stem is not None:
            return torch.ops.cudnn_fusion.stem_conv_bias_act.default(x, weight, bias, residual, stem.index,
                                                                      stem.inverse, stem.form, *args[5:], stem.dtype)
        if _fused_op is None:
            _fused_op = torch.ops.cudnn_fusion.conv_bias_act.default
        return _fused_op(x, weight, bias, residual, *args)
    stride, padding_pre, padding_post, dilation, groups, activation, _ = args
    return _eager(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, activation,
                  padding_mode)
