"""Drop-in fused conv modules. They are nn.Conv2d subclasses: same constructor, parameters, state_dict keys,
extra_repr and reset_parameters, so checkpoints move between them and plain Conv2d in both directions."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .._module_state import module_attributes
from ..ops.conv import conv2d_bias_act
from ..ops.decide import FusionStatus
from ..ops.layer_call import LayerCall
from ..policy import EnginePolicy


class FusedConv2d(nn.Conv2d):
    """Base of the fused conv modules: nn.Conv2d whose forward runs conv (+ residual) + activation fused.

    Subclasses set `activation` ("relu" or None) and call `_fused_forward`. `strict` (None follows the global
    setting, see torch_cudnn_fusion.set_strict) makes a layer that cannot run fused raise instead of running eager.
    `policy` (an EnginePolicy; None follows the global one, see torch_cudnn_fusion.set_engine_policy) chooses its
    cuDNN plans. The layer keeps its decision in `_call` (a LayerCall), made on the first forward and again
    whenever its inputs' shapes, dtypes, layout or the global settings change.
    """

    activation: Optional[str] = "relu"

    def __init__(self, *args, strict: Optional[bool] = None, policy: Optional[EnginePolicy] = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.strict = strict
        self.policy = policy
        self._call = LayerCall()

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, *, strict: Optional[bool] = None,
                  policy: Optional[EnginePolicy] = None) -> "FusedConv2d":
        """A fused module sharing `conv`'s Parameters (an optimizer over `conv` updates this module too)."""
        if not isinstance(conv, nn.Conv2d):
            raise TypeError(f"conv must be an nn.Conv2d, got {type(conv).__name__}")
        module = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride,
                     padding=conv.padding, dilation=conv.dilation, groups=conv.groups, bias=conv.bias is not None,
                     padding_mode=conv.padding_mode, device="meta", strict=strict, policy=policy)
        module.weight = conv.weight
        module.bias = conv.bias
        module.train(conv.training)
        return module

    @property
    def fusion_status(self) -> FusionStatus:
        """How the last forward ran: fused, or eager and why (see torch_cudnn_fusion.fusion_report)."""
        return self._call.status

    def _fused_forward(self, x: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
        weight, bias = module_attributes(self, ("weight", "bias"))
        return conv2d_bias_act(x, weight, bias, residual, self.stride, self.padding, self.dilation,
                               self.groups, self.activation, padding_mode=self.padding_mode, strict=self.strict,
                               policy=self.policy, call=self._call)


class Conv2dReLU(FusedConv2d):
    """relu(conv2d(x)) — nn.Conv2d followed by nn.ReLU, as one cuDNN graph."""

    activation = "relu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fused_forward(x, None)


class Conv2dAddReLU(FusedConv2d):
    """relu(conv2d(x) + residual) — a ResNet block's last conv, the identity add and the ReLU as one graph."""

    activation = "relu"

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self._fused_forward(x, residual)
