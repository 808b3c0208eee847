"""BatchNorm modules: BatchNorm2dReLU (BatchNorm2d + ReLU / ReLU6 fused in training), and the placeholder a
BatchNorm2d becomes when fuse() moves its work into the conv before it."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .._cpp_enums import Activation
from .._module_state import module_attributes
from ..ops.batch_norm import batch_norm_act
from ..ops.decide import FusionStatus
from ..ops.layer_call import LayerCall
from ..policy import EnginePolicy

# What each module accepts: Conv2dBN every activation its op fuses; the *ReLU modules what they took before SiLU,
# Hardswish and LeakyReLU were fused (fuse() gives those to Conv2dBN only).
ANY_ACTIVATION = ("relu", "relu6", "silu", "hardswish", "leaky_relu", None)
RELU_ACTIVATIONS = ("relu", "relu6", None)
_BATCH_NORM_TENSORS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def batch_norm_arguments(bn: nn.BatchNorm2d) -> tuple:
    """(weight, bias, running_mean, running_var, use batch statistics, momentum, uncounted) as nn.BatchNorm2d.forward
    computes them. In training, num_batches_tracked counts the step: with a fixed momentum the caller counts it (in the
    op's launch that writes the running statistics), and `uncounted` is num_batches_tracked; with momentum=None, which
    is derived from the count, it is counted here and `uncounted` is None (as it is where nothing is counted)."""
    weight, bias, running_mean, running_var, counter = module_attributes(bn, _BATCH_NORM_TENSORS)
    training, momentum = bn.training, bn.momentum
    uncounted = None
    if training and bn.track_running_stats and counter is not None:
        if momentum is None:  # derived from the count: count now
            counter.add_(1)
            momentum = 1.0 / float(counter)
        else:
            uncounted = counter
    momentum = 0.0 if momentum is None else momentum
    batch_stats = training or (running_mean is None and running_var is None)
    if training and not bn.track_running_stats:
        running_mean = running_var = None
    return weight, bias, running_mean, running_var, batch_stats, momentum, uncounted


def check_activation(activation: Optional[str], accepted: tuple, module: str) -> Optional[str]:
    """`activation` if it is one of `accepted` (the module's), else a ValueError that names them."""
    Activation.from_name(activation, accepted, module)
    return activation


def check_negative_slope(negative_slope, module: str) -> float:
    """LeakyReLU's negative slope as a float (nn.LeakyReLU takes any real number), else a TypeError naming it."""
    if isinstance(negative_slope, bool) or not isinstance(negative_slope, (int, float)):
        raise TypeError(f"{module}: negative_slope must be a real number, got {type(negative_slope).__name__}")
    return float(negative_slope)


class BatchNorm2dReLU(nn.BatchNorm2d):
    """relu(batch_norm(x)) — nn.BatchNorm2d followed by nn.ReLU (or nn.ReLU6 with activation="relu6").

    Same constructor, parameters, buffers and state_dict keys as nn.BatchNorm2d. With batch statistics (training)
    it runs as our NHWC kernel (channels_last x), else one cuDNN graph, or the legacy cuDNN BatchNorm API where the
    graph is refused, or eager; with running statistics (eval) it runs eager. `fusion_status` says which, and why.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device=None, dtype=None, *, activation: Optional[str] = "relu",
                 strict: Optional[bool] = None, policy: Optional[EnginePolicy] = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)
        self.activation = check_activation(activation, RELU_ACTIVATIONS, type(self).__name__)
        self.strict = strict
        self.policy = policy
        self._call = LayerCall()

    @classmethod
    def from_bn(cls, bn: nn.BatchNorm2d, *, activation: Optional[str] = "relu",
                strict: Optional[bool] = None, policy: Optional[EnginePolicy] = None) -> "BatchNorm2dReLU":
        """A fused module sharing `bn`'s Parameters and buffers."""
        if not isinstance(bn, nn.BatchNorm2d):
            raise TypeError(f"bn must be an nn.BatchNorm2d, got {type(bn).__name__}")
        module = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, device="meta",
                     activation=activation, strict=strict, policy=policy)
        for name in ("weight", "bias"):
            setattr(module, name, getattr(bn, name))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            module._buffers[name] = bn._buffers.get(name)
        module.train(bn.training)
        return module

    @property
    def fusion_status(self) -> FusionStatus:
        return self._call.status

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        weight, bias, running_mean, running_var, batch_stats, momentum, uncounted = batch_norm_arguments(self)
        return batch_norm_act(x, running_mean, running_var, weight, bias, batch_stats, momentum, self.eps,
                              self.activation, strict=self.strict, policy=self.policy, call=self._call,
                              num_batches_tracked=uncounted)


class BatchNorm2dFused(nn.BatchNorm2d):
    """A BatchNorm2d whose work fuse() moved into the fused conv layer before it (`fused_into`). It keeps its
    parameters, buffers and state_dict keys in place, so checkpoints of the plain model load unchanged, and passes
    its input through (applying timm's BatchNormAct2d activation where that was not fused and `applies_act`)."""

    fused_into: str = ""
    applies_act: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x) if self.applies_act else x

    def extra_repr(self) -> str:
        return super().extra_repr() + f", applied by {self.fused_into or 'the fused layer before it'}"


class ActivationFused(nn.Identity):
    """An activation module whose work fuse() moved into the fused layer before it; passes its input through."""

    def __init__(self, original: nn.Module, fused_into: str) -> None:
        super().__init__()
        self.original_type = type(original).__name__
        self.fused_into = fused_into

    def extra_repr(self) -> str:
        return f"{self.original_type}, applied by {self.fused_into}"
