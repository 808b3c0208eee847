"""BatchNorm with batch statistics (+ residual) (+ activation) fused, alone (batch_norm_act) or after the conv
that feeds it (conv2d_batch_norm_act); eager where it cannot be."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import _extension
from .._module_state import module_attributes
from .._cpp_enums import Activation, BatchNormImplementation
from ..policy import EnginePolicy, policy_id, resolve
from . import decide
from .conv import autocast_dtype, eager_activation, odd_residual, tensor_signature
from .decide import Decision
from .layer_call import LayerCall
from .library import conv_memory_format, conv_output_size


def _eager_batch_norm_act(x, running_mean, running_var, weight, bias, training, momentum, eps, activation, residual,
                          negative_slope=0.01):
    """The composition the fused BatchNorm stands for, as nn.BatchNorm2d + add + the activation module compute it."""
    y = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    if residual is not None:
        y = y + residual
    return eager_activation(y, Activation.from_name(activation), negative_slope)


_INFERENCE = Decision.eager("inference with running statistics: eager BatchNorm (Conv2dBN* fold it into the conv)")


def _eager_reason(x_size, dtype, device, residual: Optional[torch.Tensor]) -> str:
    """Why a batch-statistics BatchNorm (+ residual) call runs as eager's composition whatever the extension says (''
    when it need not): an empty batch, or a residual eager would broadcast or promote (inference is _INFERENCE)."""
    if len(x_size) > 0 and 0 in tuple(x_size):
        return "an empty batch: eager (it leaves the running statistics as they are)"
    if residual is not None:
        return odd_residual(residual, x_size, dtype, device)
    return ""


def _check_call(x, running_mean, running_var, activation) -> Activation:
    """The checks batch_norm_act makes before it runs a call, in training and inference; returns the activation's
    code."""
    act = Activation.from_name(activation)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if (running_mean is None) != (running_var is None):
        raise ValueError("running_mean and running_var must be given together (or both None)")
    return act


def _float32_affine(weight, bias) -> bool:
    """Whether the op can take the BatchNorm scale and shift as they are (float32, contiguous)."""
    return (weight is not None and bias is not None and weight.dtype == torch.float32 and bias.dtype == torch.float32
            and weight.is_contiguous() and bias.is_contiguous())


def _affine_as_is(weight, bias) -> bool:
    """Whether a C++ record can hand the op the BatchNorm's scale and shift as they are: float32 and contiguous, or
    neither (csrc/ops/recorded_call.h, RecordedAffine)."""
    return (weight is None and bias is None) or _float32_affine(weight, bias)


def _identity_affine(weight, bias, channels: int, device) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """1 and 0 per channel where the BatchNorm has no scale or shift (affine=False), made once per decision and
    kept with the recorded run, so a repeated call allocates nothing; None where it has both."""
    if weight is not None and bias is not None:
        return None
    return torch.ones(channels, device=device), torch.zeros(channels, device=device)


def _affine_or_identity(weight, bias, identity) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 scale and shift for the op: the module's (cast when they are not float32), or `identity`'s 1 and 0."""
    if _float32_affine(weight, bias):
        return weight, bias
    weight = identity[0] if weight is None else weight
    bias = identity[1] if bias is None else bias
    return weight.float().contiguous(), bias.float().contiguous()


def _implementation(decision: Decision) -> int:
    return int({"cudnn_legacy": BatchNormImplementation.CUDNN_LEGACY,
                "batch_norm_kernel": BatchNormImplementation.KERNEL}.get(decision.implementation,
                                                                         BatchNormImplementation.CUDNN_GRAPH))


def _where(channels, x_size) -> str:
    return f"the BatchNorm layer over {channels} channels, input {list(x_size)}"


_bn_op = None  # torch.ops.cudnn_fusion.batch_norm_act.default, looked up once
_bn_update_op = None  # torch.ops.cudnn_fusion.batch_norm_act_update.default, looked up once


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
    call: Optional[LayerCall] = None,
    num_batches_tracked: Optional[torch.Tensor] = None,
    negative_slope: float = 0.01,
) -> torch.Tensor:
    """activation(F.batch_norm(x, ...) + residual), arguments as F.batch_norm's; activation "relu", "relu6", "silu",
    "hardswish", "leaky_relu" (with negative_slope, as F.leaky_relu's) (SiLU, Hardswish and LeakyReLU without a
    residual: with one the call runs eager) or None.

    With batch statistics (training, or no running statistics) it runs as our NHWC kernel for channels_last x,
    otherwise as one cuDNN graph (or the legacy cuDNN BatchNorm API, where cuDNN refuses the graph), running
    statistics updated as F.batch_norm updates them; with running statistics (inference) it runs eager — fold it
    into the conv before it instead (Conv2dBNReLU does).
    policy: the EnginePolicy for its cuDNN graphs (None: the global one). call: the calling layer's LayerCall, which
    keeps the decision; where the call runs the op that writes float32 running statistics, its C++ record
    (csrc/ops/bn_call.h) runs a repeated call without returning to Python.

    num_batches_tracked: when given, this call counts the step in it (+1), as nn.BatchNorm2d's forward does — the
    caller passes a fixed `momentum`, not one derived from the count. Where the op updates float32 running statistics,
    it counts the step in the launch that writes them.
    """
    policy = resolve(policy)
    if not training and running_mean is not None:
        # inference with running statistics: eager's composition whatever the tensors are, so nothing to decide and no
        # signature to build (the layer remembers the one decision once)
        _check_call(x, running_mean, running_var, activation)
        if call is not None and call.decision is not _INFERENCE:
            call.remember(_INFERENCE)
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)
        return _eager_batch_norm_act(x, running_mean, running_var, weight, bias, False, momentum, eps, activation,
                                     residual, negative_slope)
    signature = None
    if call is not None and not torch.compiler.is_compiling() and isinstance(x, torch.Tensor):
        settings = ("batch_norm", training, eps, activation, negative_slope, strict, decide.is_strict(), policy)
        if call.recorded is not None and call.signature[0] == settings:
            # C++ compares the tensors and the global state with the record and runs the op when they match
            y = call.recorded.run(x, weight, bias, running_mean, running_var, num_batches_tracked, residual,
                                  float(momentum))
            if y is not None:
                return y
        signature = (settings, tensor_signature(x), tensor_signature(weight), tensor_signature(bias),
                     tensor_signature(running_mean), tensor_signature(running_var), tensor_signature(residual),
                     torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled())
        if call.signature == signature:
            return _run_batch_norm(call.run, x, running_mean, running_var, weight, bias, momentum, eps, activation,
                                   residual, num_batches_tracked, negative_slope)

    act = _check_call(x, running_mean, running_var, activation)
    eager_reason = _eager_reason(x.shape, x.dtype, x.device, residual)  # batch statistics from here on
    if eager_reason:
        if call is not None:
            call.remember(Decision.eager(eager_reason))
        decide.raise_if_strict(Decision.eager(eager_reason), strict, _where(x.shape[1], x.shape))
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)
        return _eager_batch_norm_act(x, running_mean, running_var, weight, bias, True, momentum, eps, activation,
                                     residual, negative_slope)
    if x.dim() >= 2 and weight is not None and x.shape[1] != weight.shape[0]:
        raise ValueError(f"weight must have shape [{x.shape[1]}] (x's channels), got {list(weight.shape)}")
    update = training and running_mean is not None
    config = decide.batch_norm_config_of(x, update, residual, act, eps, weight, policy.key)
    decision = decide.decide_batch_norm(config)
    decide.raise_if_strict(decision, strict, _where(x.shape[1] if x.dim() > 1 else "?", x.shape))
    identity = _identity_affine(weight, bias, x.shape[1], x.device) if decision.fused else None
    # the op that writes the running statistics itself runs where they are float32 (the signature keeps their dtype)
    update_op = (decision.fused and update and running_mean.dtype == torch.float32
                 and running_var.dtype == torch.float32)
    run = (decision.fused, _implementation(decision), update, policy_id(policy.key) if decision.fused else 0, int(act),
           identity, update_op)
    if call is not None:
        recorded = None
        if signature is not None and _batch_norm_recordable(run, x, weight, bias):
            recorded = _extension.require().BatchNormCall(x, weight, bias, running_mean, running_var,
                                                          num_batches_tracked, residual, float(eps), run[4], run[1],
                                                          run[3], float(negative_slope))
        call.remember(decision, config, signature, run, recorded)
    return _run_batch_norm(run, x, running_mean, running_var, weight, bias, momentum, eps, activation, residual,
                           num_batches_tracked, negative_slope)


def _batch_norm_recordable(run: tuple, x, weight, bias) -> bool:
    """Whether C++ can check and run a repeat of this call: BatchNormCall runs the op that writes the running
    statistics (run's update_op) and hands it the scale and shift as they are (float32, or neither)."""
    return run[6] and x.is_cuda and _affine_as_is(weight, bias)


def _run_batch_norm(run: tuple, x, running_mean, running_var, weight, bias, momentum, eps, activation, residual,
                    num_batches_tracked=None, negative_slope=0.01):
    """Batch-statistics BatchNorm (+ residual) (+ activation) as decided: (fused, implementation, update, policy id,
    activation code, identity scale and shift or None, update_op). With update_op (fused, float32 running
    statistics) the one op writes them and counts the step in num_batches_tracked (when given); otherwise they are
    copied back and the step counted here."""
    global _bn_op, _bn_update_op
    fused, implementation, update, policy, activation_code, identity, update_op = run
    if update_op:
        if _bn_update_op is None:
            _bn_update_op = torch.ops.cudnn_fusion.batch_norm_act_update.default
        scale, shift = _affine_or_identity(weight, bias, identity)
        return _bn_update_op(x, scale, shift, running_mean, running_var, num_batches_tracked, residual,
                             float(momentum), float(eps), activation_code, implementation, policy,
                             float(negative_slope))[0]
    if num_batches_tracked is not None:
        num_batches_tracked.add_(1)
    if not fused:
        return _eager_batch_norm_act(x, running_mean, running_var, weight, bias, True, momentum, eps, activation,
                                     residual, negative_slope)
    if _bn_op is None:
        _bn_op = torch.ops.cudnn_fusion.batch_norm_act.default
    scale, shift = _affine_or_identity(weight, bias, identity)
    stats_in = (None, None)
    if update:
        stats_in = (running_mean, running_var)
        if running_mean.dtype != torch.float32:
            stats_in = (running_mean.float(), running_var.float())
    y, _, _, new_mean, new_var, _ = _bn_op(x, scale, shift, stats_in[0], stats_in[1], residual, float(momentum),
                                           float(eps), activation_code, implementation, policy, float(negative_slope))
    if update:
        with torch.no_grad():
            running_mean.copy_(new_mean)
            running_var.copy_(new_var)
    return y


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
    call: Optional[LayerCall] = None,
    num_batches_tracked: Optional[torch.Tensor] = None,
    negative_slope: float = 0.01,
) -> torch.Tensor:
    """activation(F.batch_norm(conv(x), ...) + residual) with batch statistics (training), `conv` an nn.Conv2d;
    negative_slope: LeakyReLU's (activation "leaky_relu"), which the others ignore.

    Decided once per configuration, from x and the layer (the conv's output is not needed to decide): where the
    BatchNorm runs fused, every call, the first included, runs conv and BatchNorm as the one op
    cudnn_fusion::conv_batch_norm_act with two autograd nodes (csrc/ops/bn_autograd.cpp; the conv is ATen's, so its
    numbers are F.conv2d's); otherwise the eager composition. A conv with padding_mode other than 'zeros' or
    padding='same'/'valid' runs its own conv, then batch_norm_act. The layer's `call` keeps the decision; its C++
    record (csrc/ops/conv_bn_call.h) runs a repeated call without returning to Python.

    num_batches_tracked: when given, this call counts the step in it (+1), as nn.BatchNorm2d's forward does before
    normalizing — the caller passes a fixed `momentum`, not one derived from the count. The op counts it in the
    launch that writes the running statistics.
    """
    if conv.padding_mode != "zeros" or isinstance(conv.padding, str):
        return batch_norm_act(conv._conv_forward(x, conv.weight, conv.bias), running_mean, running_var, weight, bias,
                              True, momentum, eps, activation, residual, strict=strict, policy=policy, call=call,
                              num_batches_tracked=num_batches_tracked, negative_slope=negative_slope)
    conv_weight, conv_bias = module_attributes(conv, ("weight", "bias"))  # once per call, past __getattr__
    policy = resolve(policy)
    signature = None
    if call is not None and not torch.compiler.is_compiling():
        settings = (strict, decide.is_strict(), policy, eps, activation, negative_slope, conv.stride, conv.padding,
                    conv.dilation, conv.groups)
        if call.recorded is not None and call.signature[0] == settings:
            # C++ compares the tensors and the global state with the record and runs the op when they match
            y = call.recorded.run(x, conv_weight, conv_bias, weight, bias, running_mean, running_var,
                                  num_batches_tracked, residual, float(momentum))
            if y is not None:
                return y
        device_type = x.device.type
        autocast = torch.is_autocast_enabled(device_type)
        signature = (settings, tensor_signature(x), tensor_signature(conv_weight), tensor_signature(conv_bias),
                     tensor_signature(weight), tensor_signature(bias), tensor_signature(running_mean),
                     tensor_signature(running_var), tensor_signature(residual), torch.is_grad_enabled(),
                     torch.are_deterministic_algorithms_enabled(), autocast and torch.get_autocast_dtype(device_type),
                     torch.backends.cudnn.allow_tf32)
        if call.signature == signature:
            return _run_conv_batch_norm(call.run, x, conv, conv_weight, conv_bias, running_mean, running_var,
                                        num_batches_tracked, weight, bias, momentum, eps, activation, residual,
                                        negative_slope)

    decision, config, run = _decide_conv_batch_norm(x, conv, conv_weight, conv_bias, running_mean, weight, bias, eps,
                                                    activation, residual, strict, policy)
    recorded = None
    if (signature is not None and decision.fused
            and _recordable(run, weight, bias, running_mean, num_batches_tracked, x)):
        recorded = _extension.require().ConvBatchNormCall(
            x, conv_weight, conv_bias, weight, bias, running_mean if run[2] else None,
            running_var if run[2] else None, num_batches_tracked, residual, list(conv.stride), list(conv.padding),
            list(conv.dilation), conv.groups, float(eps), run[5], run[1], run[3], float(negative_slope),
            *((run[7].index, run[7].inverse, run[7].form) if run[7] is not None else ()))
    if call is not None:
        call.remember(decision, config, signature, run, recorded)
    return _run_conv_batch_norm(run, x, conv, conv_weight, conv_bias, running_mean, running_var, num_batches_tracked,
                                weight, bias, momentum, eps, activation, residual, negative_slope)


def _decide_conv_batch_norm(x, conv, conv_weight, conv_bias, running_mean, weight, bias, eps, activation, residual,
                            strict, policy) -> tuple:
    """(decision, config, run) for a training conv + BatchNorm call, from x and the layer: the conv's output size,
    dtype (autocast's, where on) and layout (channels_last when x or the weight is, as PyTorch's cuDNN conv) are
    known before it runs. run = (fused, implementation, update running statistics, policy id, conv dtype, activation
    code, identity scale and shift or None, the conv's space-to-depth form (ops/stem.py) or None)."""
    act = Activation.from_name(activation)
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"expected 4D input (got {x.dim() if isinstance(x, torch.Tensor) else type(x).__name__}D "
                         "input)")
    device_type = x.device.type
    conv_dtype = autocast_dtype(x, device_type)
    z_dtype = conv_dtype or x.dtype
    z_size = conv_output_size(x.shape, conv_weight.shape, conv.stride, conv.padding, conv.padding, conv.dilation)
    update = running_mean is not None
    where = _where(conv_weight.shape[0], z_size)
    reason = _eager_reason(z_size, z_dtype, x.device, residual)
    if reason:
        decision, config = Decision.eager(reason), None
    else:
        needs_grad = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, conv_weight, conv_bias, weight, residual))
        channels_last = conv_memory_format(x, conv_weight) == torch.channels_last
        config = decide.batch_norm_config(x.device, z_dtype, channels_last, z_size, update, residual is not None, act,
                                          eps, needs_grad, policy.key)
        decision = decide.decide_batch_norm(config)
    stem = None
    if decision.fused:
        stem = decide.stem_plan(x, conv_weight, conv.stride, conv.padding, conv.padding, conv.dilation, conv.groups,
                                conv.padding_mode, z_dtype)
        # a new Decision, not decision._replace: dynamo cannot trace namedtuple._replace (torch 2.11)
        reason = "; ".join(filter(None, (conv_note(conv, conv_weight, channels_last, z_dtype, config.x_size),
                                            stem.note if stem is not None else "", decision.reason)))
        decision = Decision(decision.fused, reason, decision.backward, decision.implementation)
    decide.raise_if_strict(decision, strict, where)
    identity = _identity_affine(weight, bias, conv_weight.shape[0], x.device) if decision.fused else None
    run = (decision.fused, _implementation(decision), update, policy_id(policy.key) if decision.fused else 0,
           conv_dtype, int(act), identity, stem)
    return decision, config, run


def depthwise_steps(conv, conv_weight, channels_last: bool, dtype: torch.dtype,
                    z_size: tuple) -> tuple[str, str, str]:
    """(forward, dgrad, wgrad): what runs the training conv + BatchNorm op's conv of output size z_size (N, C, H, W;
    TRACED under torch.compile) (the extension's rule, for the conv's dtype; the conv has no epilogue there:
    BatchNorm follows). forward and wgrad: "ours" (our depthwise kernel), "pytorch" (PyTorch's cuDNN call), or
    "ours_small" where the size is traced and the rule depends on it; dgrad: "ours", "turned_forward" (PyTorch's
    forward kernel with the filter turned 180 degrees) or "pytorch" (PyTorch's own dgrad, as its forward)."""
    if isinstance(conv.padding, str):  # such a conv runs its own forward and backward, not the op's
        return "pytorch", "pytorch", "pytorch"
    groups = int(conv.groups)
    return decide.depthwise_kernel_steps(int(conv_weight.shape[1]) * groups, tuple(conv_weight.shape),
                                         tuple(conv.stride), tuple(conv.padding), tuple(conv.dilation), groups,
                                         channels_last, dtype, False, tuple(z_size[2:]))


def _kernel_note(step: str) -> str:
    """The words for a step's kernel (depthwise_steps' values); '' for PyTorch's own."""
    if step == "ours_small":
        small = _extension.require().depthwise_small_output
        return f"our depthwise kernel where the output is at most {small} x {small}, else PyTorch's"
    return {"ours": "our depthwise kernel",
            "turned_forward": "PyTorch's forward kernel with the filter turned 180 degrees"}.get(step, "")


def conv_notes(conv, conv_weight, channels_last: bool, dtype: torch.dtype, z_size: tuple) -> list[str]:
    """What runs the conv (output size z_size) inside the training conv + BatchNorm op: its forward ("our depthwise
    kernel" or "PyTorch's cuDNN call"), then "dgrad: ..." and "wgrad: ..." where those are not PyTorch's own
    kernels."""
    forward, dgrad, wgrad = depthwise_steps(conv, conv_weight, channels_last, dtype, z_size)
    notes = [_kernel_note(forward) or "PyTorch's cuDNN call"]
    return notes + [f"{name}: {note}" for name, note in (("dgrad", _kernel_note(dgrad)), ("wgrad", _kernel_note(wgrad)))
                    if note]


def conv_note(conv, conv_weight, channels_last: bool, dtype: torch.dtype, z_size: tuple) -> str:
    """What runs the conv inside the training conv + BatchNorm op, for the layer's status."""
    forward, *rest = conv_notes(conv, conv_weight, channels_last, dtype, z_size)
    return "; ".join([f"conv: {forward}"] + [f"its {note}" for note in rest])


def _recordable(run: tuple, weight, bias, running_mean, num_batches_tracked, x) -> bool:
    """Whether C++ can check and run a repeat of this call: ConvBatchNormCall hands the op the tensors as they are,
    so the BatchNorm's scale, shift and running statistics must be float32 already."""
    update = run[2]
    stats_as_is = running_mean.dtype == torch.float32 if update else num_batches_tracked is None
    return x.is_cuda and _affine_as_is(weight, bias) and stats_as_is


def _run_conv_batch_norm(run: tuple, x, conv, conv_weight, conv_bias, running_mean, running_var, num_batches_tracked,
                         weight, bias, momentum, eps, activation, residual, negative_slope=0.01):
    """The call as decided: the one op where fused (it casts the conv's operands under autocast itself, writes the
    running statistics and counts the step in one launch), else the eager composition."""
    fused, implementation, update, policy, conv_dtype, activation_code, identity, stem = run
    if not fused:
        if num_batches_tracked is not None:
            num_batches_tracked.add_(1)
        return _eager_batch_norm_act(conv._conv_forward(x, conv_weight, conv_bias), running_mean, running_var, weight,
                                     bias, True, momentum, eps, activation, residual, negative_slope)
    global _conv_bn_op
    if _conv_bn_op is None:
        _conv_bn_op = torch.ops.cudnn_fusion.conv_batch_norm_act.default
    stats = (running_mean, running_var) if update else (None, None)
    if not update and num_batches_tracked is not None:
        num_batches_tracked.add_(1)  # no running statistics for the op to write, so it counts nothing either
        num_batches_tracked = None
    if update and running_mean.dtype != torch.float32:  # the op updates float32 statistics: a copy, written back
        stats = (running_mean.float(), running_var.float())
    weight, bias = _affine_or_identity(weight, bias, identity)
    if stem is None:
        y = _conv_bn_op(x, conv_weight, conv_bias, conv.stride, conv.padding, conv.dilation, conv.groups, weight, bias,
                        stats[0], stats[1], num_batches_tracked, residual, float(momentum), float(eps),
                        activation_code, implementation, conv_dtype, policy, float(negative_slope))[0]
    else:  # the same sums as a stride-1 conv of the rearranged x and filter (ops/stem.py)
        y = torch.ops.cudnn_fusion.stem_conv_batch_norm_act.default(
            x, conv_weight, conv_bias, stem.index, stem.inverse, stem.form, weight, bias, stats[0], stats[1],
            num_batches_tracked, residual, float(momentum), float(eps), activation_code, implementation, conv_dtype,
            policy, float(negative_slope))[0]
    if stats[0] is not running_mean:
        with torch.no_grad():
            running_mean.copy_(stats[0])
            running_var.copy_(stats[1])
    return y
