"""SqueezeExcite: a squeeze-and-excitation block (torchvision's SqueezeExcitation, timm's SqueezeExcite and SEModule)
as one op call with one autograd node (torch_cudnn_fusion/ops/squeeze_excite.py says why)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .._module_state import module_attributes
from ..ops.squeeze_excite import check_squeeze_excite_names, squeeze_excite
from ..policy import EnginePolicy
from .conv import FusedConv2d


class SqueezeExcite(FusedConv2d):
    """x * gate(fc2(act(fc1(x.mean((2, 3), keepdim=True))))), fc1 and fc2 1x1 convs: the module is fc1 (an nn.Conv2d
    from `channels` to `squeeze_channels`, its Parameters `weight` and `bias`), and `fc2` is its child.

    activation: "relu" or "silu"; gate: "sigmoid" or "hardsigmoid". On CUDA with x in the convs' dtype (autocast's
    where it is on) the block runs as cudnn_fusion::squeeze_excite: ATen's kernels, one op call and one autograd node,
    where eager makes six module calls and about ten nodes. Elsewhere it runs eager's composition; `fusion_status`
    says which, and why. `from_modules(fc1, fc2, ...)` shares existing Parameters (fuse() uses it, leaving fc2
    registered at its own place in the model so that state_dict keys do not change).
    """

    activation: str = "relu"
    gate: str = "sigmoid"

    def __init__(self, channels: int, squeeze_channels: int, bias: bool = True, device=None, dtype=None, *,
                 activation: str = "relu", gate: str = "sigmoid", strict: Optional[bool] = None,
                 policy: Optional[EnginePolicy] = None) -> None:
        check_squeeze_excite_names(activation, gate, type(self).__name__)
        super().__init__(channels, squeeze_channels, 1, bias=bias, device=device, dtype=dtype, strict=strict,
                         policy=policy)
        self.fc2 = nn.Conv2d(squeeze_channels, channels, 1, bias=bias, device=device, dtype=dtype)
        self.activation, self.gate = activation, gate

    @classmethod
    def from_modules(cls, fc1: nn.Conv2d, fc2: nn.Conv2d, *, activation: str = "relu", gate: str = "sigmoid",
                     fc2_registered_elsewhere: bool = False, strict: Optional[bool] = None,
                     policy: Optional[EnginePolicy] = None) -> "SqueezeExcite":
        """A fused block sharing `fc1`'s and `fc2`'s Parameters. fc2_registered_elsewhere (used by fuse()): fc2 stays
        where it is in the model, and this module applies it without registering it as a child."""
        problem = block_problem(fc1, fc2)
        if problem:
            raise ValueError(f"{cls.__name__}.from_modules: {problem}")
        module = cls(fc1.in_channels, fc1.out_channels, fc1.bias is not None, device="meta", activation=activation,
                     gate=gate, strict=strict, policy=policy)
        module.weight, module.bias = fc1.weight, fc1.bias
        if fc2_registered_elsewhere:
            del module._modules["fc2"]
            module.__dict__["fc2"] = fc2  # applied here, registered (and saved) at its own place in the model
        else:
            module.fc2 = fc2
        module.train(fc1.training)
        return module

    @classmethod
    def from_conv(cls, conv, **kwargs):
        raise TypeError(f"{cls.__name__} is built from both its convs: use {cls.__name__}.from_modules(fc1, fc2, ...)")

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation}, gate={self.gate}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, b1, fc2 = module_attributes(self, ("weight", "bias", "fc2"))
        w2, b2 = module_attributes(fc2, ("weight", "bias"))
        return squeeze_excite(x, w1, b1, w2, b2, self.activation, self.gate, strict=self.strict, call=self._call)


def _is_plain_1x1(conv: nn.Module) -> bool:
    return (type(conv) is nn.Conv2d and conv.kernel_size == (1, 1) and conv.stride == (1, 1)
            and conv.padding in ((0, 0), "valid") and conv.dilation == (1, 1) and conv.groups == 1)


def block_problem(fc1: nn.Module, fc2: nn.Module) -> str:
    """Why fc1 and fc2 cannot be a squeeze-and-excitation block's convs ('' when they can): plain nn.Conv2d, 1x1,
    stride 1, no padding, no dilation or groups, fc2 mapping fc1's output channels back to its input channels."""
    for name, conv in (("fc1", fc1), ("fc2", fc2)):
        if not _is_plain_1x1(conv):
            return (f"{name} must be an nn.Conv2d with a 1x1 kernel, stride 1, no padding, dilation 1 and groups 1, "
                    f"got {conv!r}")
    if (fc2.in_channels, fc2.out_channels) != (fc1.out_channels, fc1.in_channels):
        return (f"fc2 must map fc1's {fc1.out_channels} channels back to its {fc1.in_channels}, got "
                f"{fc2.in_channels} -> {fc2.out_channels}")
    return ""
