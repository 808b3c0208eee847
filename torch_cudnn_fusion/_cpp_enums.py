"""The C++ enums the ops and the extension's functions take as integers, by name.

C++ defines them (csrc/ops/bindings.cpp exports each as torch_cudnn_fusion._C.<name>); Python needs them where the
extension is not loaded too (argument checks, CPU-only installs), so this module restates them, and
tests/test_gpu_features.py checks every member against the extension's.
"""

from __future__ import annotations

import enum


class Activation(enum.IntEnum):
    """The activation argument of the conv ops (IDENTITY, RELU, RELU6) and the BatchNorm ops (all six; LEAKY_RELU's
    negative slope is an argument of its own) (csrc/core/graph_key.h)."""

    IDENTITY = 0
    RELU = 1
    RELU6 = 2
    SILU = 3
    HARDSWISH = 4
    LEAKY_RELU = 5

    @classmethod
    def from_name(cls, name: str | None, accepted: tuple | None = None, where: str = "") -> "Activation":
        """The code of `name` ("relu", "relu6", "silu", "hardswish", "leaky_relu", "identity" or None, the modules' and
        functions' spelling); a ValueError naming what is accepted when `name` is not one of `accepted` (default: all of them).
        `where` (a module's name) leads the message."""
        accepted = ACTIVATION_NAMES if accepted is None else accepted
        if name not in accepted:
            names = ", ".join(repr(a) for a in accepted[:-1]) + f" or {accepted[-1]!r}"
            raise ValueError(f"{where + ': ' if where else ''}activation must be {names}, got {name!r}")
        return _ACTIVATION_NAMES[name]


_ACTIVATION_NAMES = {"relu": Activation.RELU, "relu6": Activation.RELU6, "silu": Activation.SILU,
                     "hardswish": Activation.HARDSWISH, "leaky_relu": Activation.LEAKY_RELU,
                     "identity": Activation.IDENTITY, None: Activation.IDENTITY}
# What the BatchNorm ops and the conv + BatchNorm modules take: SiLU, Hardswish and LeakyReLU are applied to the
# BatchNorm's output, their backward folded into our BatchNorm backward kernel.
ACTIVATION_NAMES = tuple(_ACTIVATION_NAMES)
# What the conv ops (conv + bias (+ residual) + activation graphs) take.
CONV_ACTIVATION_NAMES = ("relu", "relu6", "identity", None)


class BatchNormImplementation(enum.IntEnum):
    """Which implementation a BatchNorm op runs (csrc/ops/bn_ops.h): KERNEL, our NHWC forward kernel with the graph
    implementation's backward."""

    CUDNN_GRAPH = 0
    CUDNN_LEGACY = 1
    KERNEL = 2


class PolicyMode(enum.IntEnum):
    """How an engine policy chooses plans (csrc/core/graph_key.h)."""

    HEURISTIC = 0
    AUTOTUNE = 1
    PINNED = 2


class Graph(enum.IntEnum):
    """The graphs a layer's plans are built for (csrc/core/graph_key.h, GraphKind)."""

    FORWARD = 0
    RELU_BIAS_BACKWARD = 1
    DGRAD = 2
    WGRAD = 3
    BATCHNORM_FORWARD = 4
    BATCHNORM_BACKWARD = 5
