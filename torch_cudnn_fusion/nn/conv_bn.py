"""Conv2d + BatchNorm2d (+ residual add) (+ ReLU / ReLU6) as drop-in modules; Conv2dBN also with SiLU, Hardswish or
LeakyReLU.

Training (batch statistics): conv and BatchNorm (+ add + activation) run as one op with two autograd nodes from the
first call on (ops.batch_norm.conv2d_batch_norm_act): inside it the conv is PyTorch's own cuDNN call, or for a
depthwise 3x3 layer our NHWC kernels where they are faster (the forward in bfloat16 and float16; dgrad at stride 2,
and at stride 1 as the forward kernel with the filter turned 180 degrees; wgrad in bfloat16 and float16, and in
float32 at stride 2) — BatchNorm needs the whole conv output for its statistics before it can normalize any of it — and
BatchNorm + add + activation run fused (our NHWC kernel for a channels_last conv output; otherwise the cuDNN graph,
or the legacy cuDNN BatchNorm API where the graph is refused).
Eval (running statistics): BatchNorm folds into the conv's weight and bias and the layer runs as one fused
conv + bias (+ residual) + ReLU graph (SiLU, Hardswish and LeakyReLU, which the conv graphs do not express, are
applied to its output in place); the fold is recomputed whenever a parameter or statistic changes.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch._prims_common import suggest_memory_format

from .._cpp_enums import CONV_ACTIVATION_NAMES, Activation
from .._module_state import module_attributes
from ..ops import decide
from ..ops.batch_norm import _eager_batch_norm_act, conv2d_batch_norm_act
from ..ops.conv import autocast_dtype, conv2d_bias_act, eager_activation
from ..ops.decide import Decision, FusionStatus
from ..policy import EnginePolicy
from .batchnorm import ANY_ACTIVATION, RELU_ACTIVATIONS, batch_norm_arguments, check_activation, check_negative_slope
from .conv import FusedConv2d

_CONV_TENSORS = ("weight", "bias")
_FOLDED_BN_TENSORS = ("weight", "bias", "running_mean", "running_var")


class Conv2dBN(FusedConv2d):
    """batch_norm(conv2d(x)) — nn.Conv2d followed by nn.BatchNorm2d (no activation); with activation="silu",
    "hardswish" or "leaky_relu", followed by nn.SiLU, nn.Hardswish or nn.LeakyReLU(negative_slope) too (in training
    the op applies them to the BatchNorm's output and our BatchNorm backward kernel takes their backward: no module
    and no autograd node of their own).

    Constructor: nn.Conv2d's arguments (bias defaults to False, as before a BatchNorm) and nn.BatchNorm2d's (eps,
    momentum, affine, track_running_stats). The BatchNorm is the child `bn`: state_dict keys are the conv's
    ("weight", "bias") and "bn.*". `from_modules(conv, bn)` shares existing Parameters and buffers.
    """

    activation: Optional[str] = None
    accepted_activations: tuple = ANY_ACTIVATION
    negative_slope: float = 0.01  # LeakyReLU's (activation="leaky_relu"), as nn.LeakyReLU's default

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias: bool = False, padding_mode: str = "zeros", device=None, dtype=None, *, eps: float = 1e-5,
                 momentum: Optional[float] = 0.1, affine: bool = True, track_running_stats: bool = True,
                 activation: Optional[str] = "default", strict: Optional[bool] = None,
                 policy: Optional[EnginePolicy] = None, negative_slope: float = 0.01) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, padding_mode,
                         device=device, dtype=dtype, strict=strict, policy=policy)
        self.bn = nn.BatchNorm2d(out_channels, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        if activation != "default":
            self.activation = check_activation(activation, self.accepted_activations, type(self).__name__)
        self.negative_slope = check_negative_slope(negative_slope, type(self).__name__)

    @classmethod
    def from_modules(cls, conv: nn.Conv2d, bn: nn.BatchNorm2d, *, activation: Optional[str] = "default",
                     strict: Optional[bool] = None, bn_registered_elsewhere: bool = False,
                     policy: Optional[EnginePolicy] = None, negative_slope: float = 0.01) -> "Conv2dBN":
        """A fused module sharing `conv`'s and `bn`'s Parameters and buffers; negative_slope: the nn.LeakyReLU's, with
        activation="leaky_relu".

        bn_registered_elsewhere (used by fuse()): `bn` stays where it is in the model, so its state_dict keys do not
        change, and this module applies it without registering it as a child.
        """
        if not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"bn must be an nn.BatchNorm2d, got {type(bn).__name__}")
        if bn.num_features != conv.out_channels:
            raise ValueError(f"bn.num_features ({bn.num_features}) must equal conv.out_channels ({conv.out_channels})")
        module = cls.from_conv(conv, strict=strict, policy=policy)
        if activation != "default":
            module.activation = check_activation(activation, cls.accepted_activations, cls.__name__)
        module.negative_slope = check_negative_slope(negative_slope, cls.__name__)
        if bn_registered_elsewhere:
            del module._modules["bn"]
            module.__dict__["bn"] = bn  # applied here, registered (and saved) at its own place in the model
        else:
            module.bn = bn
        return module

    @property
    def fusion_status(self) -> FusionStatus:
        """How the last forward ran: in training the conv + BatchNorm + activation (the reason names what runs the
        conv inside the op), in eval the conv with the BatchNorm folded in."""
        status = self._call.status
        note = {"batch statistics": "training: conv and BatchNorm as one op",
                "folded": "eval: BatchNorm folded into the conv"}.get(self._call.mode)
        if note is None:
            return status
        reason = f"{note}; {status.reason}" if status.reason else note
        return FusionStatus(status.fused, reason, status.backward, status.implementation_name)

    def extra_repr(self) -> str:
        slope = f", negative_slope={self.negative_slope}" if self.activation == "leaky_relu" else ""
        return super().extra_repr() + f", activation={self.activation}{slope}"

    def train(self, mode: bool = True) -> "Conv2dBN":
        """nn.Module.train; entering training also lets go of the cached eval fold (a copy of the conv's weight, see
        _fold), which training does not read: a loop that evaluates every epoch would otherwise hold it through
        training. eval() keeps it, for loops that call eval() before every batch."""
        if mode:
            self._call.fold = None
        return super().train(mode)

    def _apply(self, fn, recurse=True):
        """nn.Module._apply (.to(), .cuda(), .half(), ...); the cached eval fold is let go first: it was computed
        from the tensors as they were, possibly on the device they leave."""
        self._call.fold = None
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None) -> torch.Tensor:
        if x.dim() != 4:  # what eager raises: nn.Conv2d takes [C, H, W] too, and nn.BatchNorm2d then refuses it
            if x.dim() == 3:
                raise ValueError(f"expected 4D input (got {x.dim()}D input)")
            raise RuntimeError(f"x must be a 4-D tensor [N, C, H, W], got a {x.dim()}-D tensor of shape "
                               f"{list(x.shape)}")
        bn = self.bn  # a child, or in __dict__ where fuse() left it registered elsewhere (read past __getattr__)
        weight, bias, running_mean, running_var, batch_stats, momentum, uncounted = batch_norm_arguments(bn)
        call = self._call
        if batch_stats:
            if call.mode != "batch statistics":
                call.mode = "batch statistics"
            return conv2d_batch_norm_act(x, self, running_mean, running_var, weight, bias, momentum, bn.eps,
                                         self.activation, residual, strict=self.strict, policy=self.policy,
                                         call=call, num_batches_tracked=uncounted, negative_slope=self.negative_slope)
        if call.mode != "folded":
            call.mode = "folded"
        conv_weight, conv_bias = module_attributes(self, _CONV_TENSORS)
        if not x.is_cuda:
            # nothing runs fused off CUDA: eager's own composition (conv, BatchNorm on running statistics,
            # activation), whose numbers are eager's exactly, rather than the fold
            decision = Decision.eager(f"x is on {x.device.type}: the fused path runs on CUDA tensors")
            call.remember(decision)
            decide.raise_if_strict(decision, self.strict, f"the conv + BatchNorm layer {self.in_channels}->"
                                                          f"{self.out_channels} channels")
            z = self._conv_forward(x, conv_weight, conv_bias)
            return _eager_batch_norm_act(z, running_mean, running_var, weight, bias, False, momentum, bn.eps,
                                         self.activation, residual, self.negative_slope)
        tensors = (conv_weight, conv_bias, weight, bias, running_mean, running_var)
        folded_weight, folded_bias = self._fold(tensors, bn.eps, autocast_dtype(conv_weight, x.device.type))
        activation = self.activation
        in_graph = activation in CONV_ACTIVATION_NAMES  # SiLU, Hardswish, LeakyReLU: applied to the conv's output
        y = conv2d_bias_act(x, folded_weight, folded_bias, residual, self.stride, self.padding, self.dilation,
                            self.groups, activation if in_graph else None, padding_mode=self.padding_mode,
                            strict=self.strict, policy=self.policy, call=call)
        return y if in_graph else eager_activation(y, Activation.from_name(activation), self.negative_slope)

    def _folded_weight_and_bias(self, dtype: Optional[torch.dtype] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The conv's weight and bias with the BatchNorm's running statistics, scale and shift folded in, in `dtype`
        (None: the weight's)."""
        bn = self.bn
        tensors = (*module_attributes(self, _CONV_TENSORS), *module_attributes(bn, _FOLDED_BN_TENSORS))
        return self._fold(tensors, bn.eps, dtype)

    def _fold(self, tensors: tuple, eps: float, dtype: Optional[torch.dtype]) -> tuple[torch.Tensor, torch.Tensor]:
        """The fold of `tensors` (the conv's weight and bias, the BatchNorm's weight, bias, running mean and running
        variance) in `dtype` (None: the weight's; under autocast the caller passes autocast's, so the cached fold is
        already what autocast would cast it to, and no call casts it again). Cached while no tensor it reads changed:
        the same tensor objects (the cache holds them, so a tensor put in one's place is another object, also where it
        reuses the freed one's address with a fresh version counter), the same storage, the same version counter
        (in-place updates such as optimizer steps and load_state_dict bump it); recomputed under autograd or
        torch.compile."""
        conv_weight, conv_bias, bn_weight, bn_bias, running_mean, running_var = tensors
        cacheable = not torch.compiler.is_compiling() and not (
            torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
        )
        key = None
        if cacheable:
            # id() names the object: the cached fold holds the tensors, so no other one can have its id meanwhile.
            # The address names the storage: `.data =` (Module.to, .half(), .cuda()) swaps it and leaves the version,
            # and the new storage is allocated while the old is alive; a copy to another dtype or device is such a
            # swap too (device and host addresses never coincide, CUDA maps both into one address space).
            key = [None if t is None else (id(t), t.data_ptr(), t._version) for t in tensors]
            key.append((eps, dtype))
            fold = self._call.fold
            if fold is not None and fold[0] == key:
                return fold[1], fold[2]
        scale = torch.rsqrt(running_var.float() + eps)
        if bn_weight is not None:
            scale = scale * bn_weight.float()
        dtype = dtype or conv_weight.dtype
        weight = (conv_weight.float() * scale.view(-1, 1, 1, 1)).to(dtype)
        weight = weight.contiguous(memory_format=suggest_memory_format(conv_weight))
        conv_bias = conv_bias.float() if conv_bias is not None else torch.zeros_like(scale)
        bias = (conv_bias - running_mean.float()) * scale
        if bn_bias is not None:
            bias = bias + bn_bias.float()
        bias = bias.to(dtype)
        if cacheable:
            self._call.fold = (key, weight, bias, tensors)
        return weight, bias


class Conv2dBNReLU(Conv2dBN):
    """relu(batch_norm(conv2d(x))) — nn.Conv2d, nn.BatchNorm2d and nn.ReLU (activation="relu6": nn.ReLU6)."""

    activation: Optional[str] = "relu"
    accepted_activations = RELU_ACTIVATIONS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class Conv2dBNAddReLU(Conv2dBN):
    """relu(batch_norm(conv2d(x)) + residual) — a ResNet block's last conv, its BatchNorm, the add and the ReLU."""

    activation: Optional[str] = "relu"
    accepted_activations = RELU_ACTIVATIONS

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return super().forward(x, residual)
