"""conv2d_bias_act: act(conv2d(x, weight) + bias + residual) as one cuDNN graph, or eager where it cannot be."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .. import _extension
from . import decide as fusion
from ..policy import EnginePolicy, policy_id, resolve

_IntPair = Union[int, Sequence[int]]
FUNCTIONAL_LAYER_ID = -1  # decisions of calls made without a module are recorded under this id


def _pair(value: _IntPair, name: str, minimum: int) -> tuple[int, int]:
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
    pair = _pair(padding, "padding", 0)
    return pair, pair


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], groups: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        got = f"{x.dim()}-D tensor of shape {list(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must be a 4-D tensor [N, C, H, W] (or 3-D [C, H, W]), got a {got}")
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


def _autocast(tensors: Sequence[Optional[torch.Tensor]], device_type: str) -> list[Optional[torch.Tensor]]:
    """Under torch.autocast, the conv's operands in the autocast dtype, as F.conv2d casts them (the residual is not
    one: eager adds it to the conv's output as it is)."""
    if not torch.is_autocast_enabled(device_type):
        return list(tensors)
    dtype = torch.get_autocast_dtype(device_type)
    return [t.to(dtype) if t is not None and t.is_floating_point() else t for t in tensors]


def _eager(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, relu, padding_mode):
    """The composition the fused graph stands for, as nn.Conv2d + add + ReLU compute it."""
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
    return F.relu(y) if relu else y


def _odd_residual(residual: torch.Tensor, expected: Sequence[int], out: torch.Tensor) -> str:
    """Why the fused add cannot take `residual` for an output of shape `expected` and out's dtype ('' when it can):
    eager adds a residual that broadcasts, or has another dtype (promoting the sum), and so does the fallback."""
    if list(residual.shape) != list(expected):
        return (f"the residual's shape {list(residual.shape)} is not the output's {list(expected)}: eager broadcasts "
                "it, so the layer runs eager")
    if residual.dtype != out.dtype:
        return (f"the residual is {residual.dtype} but the conv output is {out.dtype}: eager promotes the sum, so the "
                "layer runs eager")
    if residual.device != out.device:
        return f"the residual is on {residual.device}, the conv output on {out.device}: eager decides what happens"
    return ""


def _signature(t: Optional[torch.Tensor]):
    """What of a tensor the decision depends on (the 16-byte alignment included)."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.data_ptr() % 16


# The last call of each layer: (signature, fused, the op's conv arguments). A forward whose signature repeats
# skips the checks and the decision, which cost more host time than a small layer's GPU time.
_last_call: dict[int, tuple] = {}


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
    layer_id: int = FUNCTIONAL_LAYER_ID,
) -> torch.Tensor:
    """activation(conv2d(x, weight, bias, ...) + residual), arguments as F.conv2d's.

    activation: "relu", or None / "identity". Runs as one cuDNN graph when the configuration allows (see
    torch_cudnn_fusion.fusion); otherwise as the eager composition, with the reason recorded for `layer_id`.
    strict=True (or global strict mode) raises FusionError instead of running eager. policy: the EnginePolicy that
    chooses the cuDNN plans (None: the global one, see torch_cudnn_fusion.set_engine_policy).
    """
    if isinstance(x, torch.Tensor) and x.dim() == 3:  # unbatched [C, H, W], as nn.Conv2d takes it
        if residual is not None and residual.dim() == 3:
            residual = residual.unsqueeze(0)
        return conv2d_bias_act(x.unsqueeze(0), weight, bias, residual, stride, padding, dilation, groups, activation,
                               padding_mode=padding_mode, strict=strict, policy=policy, layer_id=layer_id).squeeze(0)
    device_type = x.device.type
    policy = resolve(policy)
    autocast = torch.is_autocast_enabled(device_type)
    signature = None
    if not torch.compiler.is_compiling():
        signature = (_signature(x), _signature(weight), _signature(bias), _signature(residual), stride, padding,
                     dilation, groups, activation, padding_mode, strict, fusion.is_strict(), torch.is_grad_enabled(),
                     torch.backends.cudnn.allow_tf32, autocast and torch.get_autocast_dtype(device_type), policy,
                     torch.are_deterministic_algorithms_enabled())
        last = _last_call.get(layer_id)
        if last is not None and last[0] == signature:
            if autocast:
                x, weight, bias = _autocast((x, weight, bias), device_type)
            return _run(last[1], x, weight, bias, residual, last[2], padding_mode)

    if activation not in ("relu", "identity", None):
        raise ValueError(f"activation must be 'relu', 'identity' or None, got {activation!r}")
    relu = activation == "relu"
    if autocast:
        x, weight, bias = _autocast((x, weight, bias), device_type)
    _check_args(x, weight, bias, groups)
    stride_ = _pair(stride, "stride", 1)
    dilation_ = _pair(dilation, "dilation", 1)
    padding_pre, padding_post = conv_padding(padding, weight.shape[2:], dilation_, stride_)
    where = (f"the conv layer {x.shape[1]}->{weight.shape[0]} channels, kernel {weight.shape[2]}x{weight.shape[3]}, "
             f"input {list(x.shape)}")
    conv_args = (list(stride_), list(padding_pre), list(padding_post), list(dilation_), groups, relu, 0)
    if residual is not None:
        from .library import conv_output_size

        expected = conv_output_size(x.shape, weight.shape, stride_, padding_pre, padding_post, dilation_)
        odd = _odd_residual(residual, expected, x)
        if odd:  # eager broadcasts or promotes the sum: do exactly that
            decision = (False, odd, ())
            fusion.record_decision(layer_id, decision)
            fusion.raise_if_strict(decision, strict, where)
            return _run(False, x, weight, bias, residual, conv_args, padding_mode)

    config = fusion.layer_config(x, weight, bias, residual, stride_, padding_pre, padding_post, dilation_, groups,
                                 relu, padding_mode, policy.key)
    decision = fusion.decide_and_record(layer_id, config)
    fusion.raise_if_strict(decision, strict, where)
    conv_args = (list(stride_), list(padding_pre), list(padding_post), list(dilation_), groups, relu,
                 policy_id(policy.key) if decision[0] else 0)
    if signature is not None:
        _last_call[layer_id] = (signature, decision[0], conv_args)
    return _run(decision[0], x, weight, bias, residual, conv_args, padding_mode)


_fused_op = None  # torch.ops.cudnn_fusion.conv_bias_act.default, looked up once


def _run(fused: bool, x, weight, bias, residual, conv_args, padding_mode):
    global _fused_op
    if fused:
        if _fused_op is None:
            _fused_op = torch.ops.cudnn_fusion.conv_bias_act.default
        return _fused_op(x, weight, bias, residual, *conv_args)
    stride, padding_pre, padding_post, dilation, groups, relu, _ = conv_args
    return _eager(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, relu, padding_mode)


def _eager_batch_norm_act(x, running_mean, running_var, weight, bias, training, momentum, eps, activation, residual):
    """The composition the fused BatchNorm stands for, as nn.BatchNorm2d + add + ReLU / ReLU6 compute it."""
    y = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    if residual is not None:
        y = y + residual
    if activation == "relu":
        return F.relu(y)
    if activation == "relu6":
        return F.relu6(y)
    return y


def _eager_batch_norm_reason(x: torch.Tensor, residual: Optional[torch.Tensor], batch_stats: bool) -> str:
    """Why a BatchNorm (+ residual) call runs as eager's composition whatever the rules below say ('' when it need
    not): inference, an empty batch, or a residual eager would broadcast or promote."""
    if not batch_stats:
        return "inference with running statistics: eager BatchNorm (Conv2dBN* fold it into the conv)"
    if x.dim() > 0 and x.numel() == 0:
        return "an empty batch: eager (it leaves the running statistics as they are)"
    if residual is not None:
        return _odd_residual(residual, x.shape, x)
    return ""


_ones_zeros: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _float32_affine(weight, bias) -> bool:
    """Whether the op can take the module's BatchNorm scale and shift as they are (float32, contiguous)."""
    return (weight is not None and bias is not None and weight.dtype == torch.float32 and bias.dtype == torch.float32
            and weight.is_contiguous() and bias.is_contiguous())


def _affine_or_identity(weight, bias, channels: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 scale and shift for the op: the module's (cast when they are not float32), or 1 and 0 (affine=False)."""
    if weight is None or bias is None:
        key = (channels, device)
        if key not in _ones_zeros:
            _ones_zeros[key] = (torch.ones(channels, device=device), torch.zeros(channels, device=device))
        ones, zeros = _ones_zeros[key]
        weight = ones if weight is None else weight
        bias = zeros if bias is None else bias
    return weight.float().contiguous(), bias.float().contiguous()


_bn_op = None  # torch.ops.cudnn_fusion.batch_norm_act.default, looked up once


def _bn_signature(t: Optional[torch.Tensor]):
    """What of a tensor a BatchNorm decision depends on (its layout through the strides)."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.requires_grad


# The last call of each BatchNorm layer: (signature, (fused, implementation, update running statistics)). A training
# step whose signature repeats skips the checks and the decision, as conv2d_bias_act does.
_last_bn_call: dict[int, tuple] = {}


def batch_norm_act(
    x: torch.Tensor,
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    weight: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    activation: Optional[str] = "relu",
    residual: Optional[torch.Tensor] = None,
    *,
    strict: Optional[bool] = None,
    policy: Optional[EnginePolicy] = None,
    layer_id: int = FUNCTIONAL_LAYER_ID,
) -> torch.Tensor:
    """activation(F.batch_norm(x, ...) + residual), arguments as F.batch_norm's; activation "relu", "relu6" or None.

    With batch statistics (training, or no running statistics) it runs as one cuDNN graph (or the legacy cuDNN
    BatchNorm API, where cuDNN refuses the graph), running statistics updated as F.batch_norm updates them; with
    running statistics (inference) it runs eager — fold it into the conv before it instead (Conv2dBNReLU does).
    policy: the EnginePolicy for its cuDNN graphs (None: the global one).
    """
    policy = resolve(policy)
    signature = None
    if not torch.compiler.is_compiling() and isinstance(x, torch.Tensor):
        signature = (_bn_signature(x), _bn_signature(weight), _bn_signature(bias), _bn_signature(running_mean),
                     _bn_signature(running_var), _bn_signature(residual), training, eps, activation, strict,
                     fusion.is_strict(), torch.is_grad_enabled(), policy, torch.are_deterministic_algorithms_enabled())
        last = _last_bn_call.get(layer_id)
        if last is not None and last[0] == signature:
            return _run_batch_norm(last[1], x, running_mean, running_var, weight, bias, momentum, eps, activation,
                                   residual)

    if activation not in fusion.ACTIVATIONS:
        raise ValueError(f"activation must be 'relu', 'relu6', 'identity' or None, got {activation!r}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together (or both None)")
    batch_stats = training or running_mean is None
    eager_reason = _eager_batch_norm_reason(x, residual, batch_stats)
    if eager_reason:
        decision = (False, eager_reason, (), "eager")
        fusion.record_decision(layer_id, decision)
        _last_bn_call.pop(layer_id, None)  # nothing for conv2d_batch_norm_act to record as this layer's run
        if batch_stats:
            fusion.raise_if_strict(decision, strict, f"the BatchNorm layer over {x.shape[1]} channels, input "
                                                     f"{list(x.shape)}")
        return _eager_batch_norm_act(x, running_mean, running_var, weight, bias, batch_stats, momentum, eps,
                                     activation, residual)
    if x.dim() >= 2 and x.shape[1] != (weight.shape[0] if weight is not None else x.shape[1]):
        raise ValueError(f"weight must have shape [{x.shape[1]}] (x's channels), got {list(weight.shape)}")
    update = training and running_mean is not None
    config = fusion.batch_norm_config(x, update, residual, activation, eps, weight, policy.key)
    decision = fusion.decide_batch_norm_and_record(layer_id, config)
    where = f"the BatchNorm layer over {x.shape[1] if x.dim() > 1 else '?'} channels, input {list(x.shape)}"
    fusion.raise_if_strict(decision, strict, where)
    run = (decision[0], fusion.LEGACY if decision[3] == "cudnn_legacy" else fusion.GRAPH, update,
           policy_id(policy.key) if decision[0] else 0)
    if signature is not None:
        _last_bn_call[layer_id] = (signature, run)
    return _run_batch_norm(run, x, running_mean, running_var, weight, bias, momentum, eps, activation, residual)


def _run_batch_norm(run: tuple, x, running_mean, running_var, weight, bias, momentum, eps, activation, residual):
    """Batch-statistics BatchNorm (+ residual) (+ activation) as decided: (fused, implementation, update, policy id)."""
    fused, implementation, update, policy = run
    if not fused:
        return _eager_batch_norm_act(x, running_mean, running_var, weight, bias, True, momentum, eps, activation,
                                     residual)
    global _bn_op
    if _bn_op is None:
        _bn_op = torch.ops.cudnn_fusion.batch_norm_act.default
    scale, shift = _affine_or_identity(weight, bias, x.shape[1], x.device)
    stats_in = (None, None)
    if update:
        stats_in = (running_mean, running_var)
        if running_mean.dtype != torch.float32:
            stats_in = (running_mean.float(), running_var.float())
    y, _, _, new_mean, new_var, _ = _bn_op(x, scale, shift, stats_in[0], stats_in[1], residual, float(momentum),
                                           float(eps), fusion.ACTIVATIONS[activation], implementation, policy)
    if update:
        with torch.no_grad():
            running_mean.copy_(new_mean)
            running_var.copy_(new_var)
    return y


# The last training call of each Conv2d + BatchNorm layer: (signature, BatchNorm run as in _last_bn_call, one op,
# the call recorded in C++ or None, the Python settings it was recorded under). A call whose signature repeats skips
# the checks and the decision; where the BatchNorm runs fused on float32 statistics, the conv and the BatchNorm run
# as one op (one autograd node), and a call that matches the C++ record (csrc/conv_bn_call.h) skips the signature too.
_last_conv_bn_call: dict[int, tuple] = {}
_conv_bn_op = None  # torch.ops.cudnn_fusion.conv_batch_norm_act.default, looked up once


def conv2d_batch_norm_act(
    x: torch.Tensor,
    conv: "torch.nn.Conv2d",
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    momentum: float,
    eps: float,
    activation: Optional[str],
    residual: Optional[torch.Tensor] = None,
    *,
    strict: Optional[bool] = None,
    policy: Optional[EnginePolicy] = None,
    layer_id: int = FUNCTIONAL_LAYER_ID,
    num_batches_tracked: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """activation(F.batch_norm(conv(x), ...) + residual) with batch statistics (training), `conv` an nn.Conv2d.

    The first call of a layer (and any call whose tensors' shapes, strides, dtypes or the global settings changed)
    runs the conv as its own call and BatchNorm through batch_norm_act, which decides and records how. Later calls
    of a layer whose BatchNorm ran fused run both as one op with one autograd node (csrc/bn_autograd.cpp): the conv
    is still ATen's, so the numbers are the same; only the host time of the second call and node is saved. Later
    calls of other layers skip the checks and the decision and run as decided.

    num_batches_tracked: when given, this call counts the step in it (+1), as nn.BatchNorm2d's forward does before
    normalizing — the caller passes a fixed `momentum`, not one derived from the count. The one op counts it in the
    launch that writes the running statistics.
    """
    signature = None
    if not torch.compiler.is_compiling() and conv.padding_mode == "zeros" and not isinstance(conv.padding, str):
        conv_weight, conv_bias = conv.weight, conv.bias  # a module's attribute lookups are slow: once per call
        last = _last_conv_bn_call.get(layer_id)
        if last is not None and last[3] is not None and last[4] == (
                strict, fusion.is_strict(), resolve(policy), eps, activation, conv.stride, conv.padding, conv.dilation,
                conv.groups):
            # the recorded one-op call: C++ checks the tensors and the global state, and runs the op if they match
            y = last[3].run(x, conv_weight, conv_bias, weight, bias, running_mean, running_var, num_batches_tracked,
                            residual, float(momentum))
            if y is not None:
                return y
        device_type = x.device.type
        autocast = torch.is_autocast_enabled(device_type)
        signature = (_bn_signature(x), _bn_signature(conv_weight), _bn_signature(conv_bias), _bn_signature(weight),
                     _bn_signature(bias), _bn_signature(running_mean), _bn_signature(running_var),
                     _bn_signature(residual), eps, activation, strict, fusion.is_strict(), torch.is_grad_enabled(),
                     resolve(policy), torch.are_deterministic_algorithms_enabled(),
                     autocast and torch.get_autocast_dtype(device_type))
        if last is not None and last[0] == signature:
            run, one_op = last[1], last[2]
            if one_op:
                return _run_conv_batch_norm(run, x, conv, conv_weight, conv_bias, running_mean, running_var,
                                            num_batches_tracked, weight, bias, momentum, eps, activation, residual,
                                            autocast)
            if num_batches_tracked is not None:
                num_batches_tracked.add_(1)
            return _run_batch_norm(run, conv._conv_forward(x, conv_weight, conv_bias), running_mean, running_var,
                                   weight, bias, momentum, eps, activation, residual)

    if num_batches_tracked is not None:
        num_batches_tracked.add_(1)
    z = conv._conv_forward(x, conv.weight, conv.bias)
    y = batch_norm_act(z, running_mean, running_var, weight, bias, True, momentum, eps, activation, residual,
                       strict=strict, policy=policy, layer_id=layer_id)
    bn_call = _last_bn_call.get(layer_id)  # this call's decision: batch_norm_act made it or found it unchanged
    if signature is not None and bn_call is not None:
        fused, implementation, update, policy_number = bn_call[1]
        one_op = fused and (not update or running_mean.dtype == torch.float32)  # the op takes float32 statistics
        call = key = None
        direct_affine = (weight is None and bias is None) or _float32_affine(weight, bias)
        if one_op and direct_affine and (update or num_batches_tracked is None):
            call = _extension.require().ConvBatchNormCall(
                x, conv.weight, conv.bias, weight, bias, running_mean if update else None,
                running_var if update else None, num_batches_tracked, residual, list(conv.stride), list(conv.padding),
                list(conv.dilation), conv.groups, float(eps), fusion.ACTIVATIONS[activation], implementation,
                policy_number)
            key = (strict, fusion.is_strict(), resolve(policy), eps, activation, conv.stride, conv.padding,
                   conv.dilation, conv.groups)
        _last_conv_bn_call[layer_id] = (signature, bn_call[1], one_op, call, key)
    return y


def _run_conv_batch_norm(run: tuple, x, conv, conv_weight, conv_bias, running_mean, running_var, num_batches_tracked,
                         weight, bias, momentum, eps, activation, residual, autocast: bool):
    """The conv and the fused batch-statistics BatchNorm as one op: run = (True, implementation, update, policy id).
    Under autocast the op casts the conv's operands itself (its one autograd node then includes the casts). The op
    writes the running statistics and counts the step in num_batches_tracked in one launch."""
    _, implementation, update, policy = run
    global _conv_bn_op
    if _conv_bn_op is None:
        _conv_bn_op = torch.ops.cudnn_fusion.conv_batch_norm_act.default
    if not update:  # no running statistics for the op to write
        running_mean = running_var = None
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)
            num_batches_tracked = None
    if not _float32_affine(weight, bias):
        weight, bias = _affine_or_identity(weight, bias, conv.out_channels, x.device)
    conv_dtype = torch.get_autocast_dtype(x.device.type) if autocast else None
    return _conv_bn_op(x, conv_weight, conv_bias, conv.stride, conv.padding, conv.dilation, conv.groups, weight, bias,
                       running_mean, running_var, num_batches_tracked, residual, float(momentum), float(eps),
                       fusion.ACTIVATIONS[activation], implementation, conv_dtype, policy)[0]
