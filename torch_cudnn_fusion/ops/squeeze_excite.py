"""squeeze_excite: a squeeze-and-excitation block, x * gate(conv2(act(conv1(mean_hw(x))))), as one op call with one
autograd node (csrc/ops/squeeze_excite_ops.cpp), or eager's composition where it cannot run.

Eager runs the block as six modules and, under autocast, about ten autograd nodes; the small models that carry it
(efficientnet_b0, mobilenet_v3, regnet_y) wait on the host in a training step, and those calls are its time. The
op's kernels are ATen's (the two 1x1 convs on a 1x1 input are GEMMs): it saves host time, not GPU time.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import _extension
from .._compile import constant_under_compile
from .._cpp_enums import Activation
from . import decide
from .decide import SUPPORTED_DTYPES, Decision
from .layer_call import LayerCall

# What the block's activation and gate may be (torchvision's SqueezeExcitation and timm's SqueezeExcite / SEModule
# use these): the op's codes.
SQUEEZE_EXCITE_ACTIVATIONS = ("relu", "silu")
SQUEEZE_EXCITE_GATES = ("sigmoid", "hardsigmoid")
_EAGER_ACTIVATION = {"relu": F.relu, "silu": F.silu}
_EAGER_GATE = {"sigmoid": torch.sigmoid, "hardsigmoid": F.hardsigmoid}
FUSED = Decision(True, "", (), "squeeze_excite_op")


def check_squeeze_excite_names(activation: str, gate: str, where: str = "") -> Activation:
    """The activation's code; a ValueError naming what is accepted when `activation` or `gate` is not the block's
    (the activation's from Activation.from_name, as every module's)."""
    code = Activation.from_name(activation, SQUEEZE_EXCITE_ACTIVATIONS, where)
    if gate not in SQUEEZE_EXCITE_GATES:
        lead = f"{where}: " if where else ""
        raise ValueError(f"{lead}gate must be 'sigmoid' or 'hardsigmoid', got {gate!r}")
    return code


def _eager_reason(x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                  b2: Optional[torch.Tensor], conv_dtype: torch.dtype) -> str:
    """Why the block runs eager for these operands ('' when the op runs it)."""
    if x.device.type != "cuda":
        return f"x is on {x.device.type}: the fused path runs on CUDA tensors"
    if x.dim() != 4 or x.numel() == 0:
        return f"x has shape {list(x.shape)}: the op takes a non-empty [N, C, H, W]"
    if x.shape[1] != w1.shape[1] or tuple(w2.shape) != (w1.shape[1], w1.shape[0], 1, 1):
        return (f"x has {x.shape[1]} channels, the convs' weights shapes {list(w1.shape)} and {list(w2.shape)}: "
                "eager raises what it raises")
    if x.dtype != conv_dtype:
        return (f"x is {x.dtype} but the convs run in {conv_dtype}: eager promotes the product x * gate, so the "
                "block runs eager")
    if conv_dtype not in SUPPORTED_DTYPES:
        return f"dtype {conv_dtype} (the op takes {', '.join(SUPPORTED_DTYPES.values())})"
    if any(t is not None and t.device != x.device for t in (w1, b1, w2, b2)):
        return "a weight or bias is not on x's device: eager decides what happens"
    return _extension_problem()


@constant_under_compile
def _extension_problem() -> str:
    return "" if _extension.load() is not None else _extension.load_error()


def _conv_dtype(x: torch.Tensor, tensors: tuple) -> torch.dtype:
    """The dtype the block's convs run in: autocast's where it casts their operands, else that of the weights and
    biases when they agree with x's (else x's: eager's conv then raises its own error)."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type) and x.is_floating_point() and x.dtype != torch.float64:
        return torch.get_autocast_dtype(device_type)
    return x.dtype if all(t is None or t.dtype == x.dtype for t in tensors) else tensors[0].dtype


def squeeze_excite(x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                   b2: Optional[torch.Tensor], activation: str = "relu", gate: str = "sigmoid", *,
                   strict: Optional[bool] = None, call: Optional[LayerCall] = None) -> torch.Tensor:
    """x * gate(conv2d(act(conv2d(mean over H and W of x, w1, b1)), w2, b2)), the 1x1 convs' weights [R, C, 1, 1]
    and [C, R, 1, 1]: one op call with one autograd node on CUDA where x is in the convs' dtype (autocast's where it
    is on), else eager's composition. strict=True (or global strict mode) raises FusionError instead of running
    eager. call: the LayerCall of the module making the call, which keeps the decision."""
    tensors = (w1, b1, w2, b2)
    device_type = x.device.type
    autocast = torch.is_autocast_enabled(device_type)
    signature = None
    if call is not None and not torch.compiler.is_compiling():
        # what the decision reads, and nothing else: this runs on every call of the block
        signature = (activation, gate, strict, decide.is_strict(), x.device, x.dtype, x.shape[1:2], x.dim(),
                     x.numel() == 0, autocast and torch.get_autocast_dtype(device_type), w1.dtype, w1.device,
                     w1.shape, w2.dtype, w2.device, w2.shape, b1 is None or (b1.dtype, b1.device),
                     b2 is None or (b2.dtype, b2.device))
        if call.signature == signature:
            return _run(call.run, x, tensors, activation, gate)
    activation_code = check_squeeze_excite_names(activation, gate)
    reason = _eager_reason(x, w1, b1, w2, b2, _conv_dtype(x, tensors))
    decision = Decision.eager(reason) if reason else FUSED
    decide.raise_if_strict(decision, strict, f"the squeeze-and-excitation block of {w1.shape[1]} channels "
                                             f"(squeezed to {w1.shape[0]})")
    run = (decision.fused, int(activation_code), gate == "hardsigmoid")
    if call is not None:
        call.remember(decision, None, signature, run)
    return _run(run, x, tensors, activation, gate)


def _run(run: tuple, x: torch.Tensor, tensors: tuple, activation: str, gate: str) -> torch.Tensor:
    fused, activation_code, hard_gate = run
    if fused:
        return torch.ops.cudnn_fusion.squeeze_excite.default(x, *tensors, activation_code, hard_gate)
    return eager_squeeze_excite(x, *tensors, activation, gate)


def eager_squeeze_excite(x: torch.Tensor, w1: torch.Tensor, b1: Optional[torch.Tensor], w2: torch.Tensor,
                         b2: Optional[torch.Tensor], activation: str, gate: str) -> torch.Tensor:
    """The block as eager runs it (timm's form: the mean with keepdim, as torchvision's global pool computes it)."""
    scale = F.conv2d(x.mean((-2, -1), keepdim=True), w1, b1)
    scale = F.conv2d(_EAGER_ACTIVATION[activation](scale), w2, b2)
    return x * _EAGER_GATE[gate](scale)
