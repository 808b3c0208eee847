"""One launch for the autocast casts of a fused model's conv weights.

Under autocast each training conv + BatchNorm layer casts its float32 conv weight to the autocast dtype inside its
op (csrc/ops/bn_ops.cpp, cast_conv_operands): one small kernel a layer, 27 in MobileNet v1, each a launch of a few
microseconds for a few kilobytes. fuse() registers a WeightCasts on the model it returns. Before the model's forward
it casts, with one torch._foreach_copy_, every weight a layer will cast (as its last call decided); each layer's op
takes its cast in place of casting, after checking that the cast is its weight's and the weight was not modified
since (version counter). After the forward it drops them: what autograd saved keeps each cast, as the op's own
cast would be kept, until that layer's backward. A layer called on its own, outside the model's forward, casts as
before; so does every layer under torch.compile, which fuses the casts itself.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class WeightCasts:
    """The forward hooks of a fused model (see the module docstring); `layers` are its conv + BatchNorm modules."""

    def __init__(self, layers) -> None:
        self.layers = tuple(layers)

    @classmethod
    def attach(cls, model: nn.Module) -> Optional["WeightCasts"]:
        """Registers one on `model` (a model fuse() made), replacing one it already has; None where it holds no conv +
        BatchNorm layer."""
        from .conv_bn import Conv2dBN

        for hooks in (model._forward_pre_hooks, model._forward_hooks):
            for key in [key for key, hook in hooks.items() if isinstance(getattr(hook, "__self__", None), cls)]:
                del hooks[key]
        layers = [m for m in model.modules() if isinstance(m, Conv2dBN)]
        if not layers:
            return None
        casts = cls(layers)
        model.register_forward_pre_hook(casts.before)
        model.register_forward_hook(casts.after, always_call=True)
        return casts

    def before(self, model: nn.Module, args) -> None:
        if torch.compiler.is_compiling() or not torch.is_autocast_enabled("cuda"):
            return
        dtype = torch.get_autocast_dtype("cuda")
        layers, weights = [], []
        for layer in self.layers:
            weight = layer.weight_to_cast(dtype)
            if weight is not None:
                layers.append(layer)
                weights.append(weight)
        if len(weights) < 2:  # one cast gains nothing over the layer's own
            return
        with torch.no_grad():
            casts = [torch.empty_like(w, dtype=dtype) for w in weights]
            torch._foreach_copy_(casts, weights)
        for layer, weight, cast in zip(layers, weights, casts):
            if cast.stride() == weight.stride():  # the op takes a cast with its weight's strides only
                layer._call.weight_cast = (weight, weight._version, cast)

    def after(self, model: nn.Module, args, output) -> None:
        if torch.compiler.is_compiling():
            return
        for layer in self.layers:
            layer._call.weight_cast = None

    def __repr__(self) -> str:
        return f"WeightCasts({len(self.layers)} conv + BatchNorm layers)"
