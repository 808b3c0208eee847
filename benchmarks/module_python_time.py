"""The host cost of a fused module's own Python: microseconds a call of a training Conv2dBNReLU, Conv2dBNAddReLU and
Conv2dReLU whose recorded C++ call is replaced by a stub that returns at once, so what is timed is the module's
Python from nn.Module.__call__ to the record (the reads of its parameters and buffers, BatchNorm's arguments, the
settings check), not the op. Runs on the CPU, no GPU or extension needed. A layer's full host time on the GPU is
layer_host_time.py's; there a host's drift between runs can hide a few microseconds, here it cannot.

The stub is installed as a layer's record would be after its first call (LayerCall.recorded, with the settings the
op compares first); a first call asserts that the stub answered, so a change of the record's check fails here
instead of timing another path.

    python benchmarks/module_python_time.py [--calls 20000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import torch

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops import decide
from torch_cudnn_fusion.policy import resolve

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import host_us  # noqa: E402


class StubRecord:
    """Answers a recorded call with a fixed tensor, as a record that matched would answer with the op's output."""

    def __init__(self, y: torch.Tensor) -> None:
        self.y = y

    def run(self, *args) -> torch.Tensor:
        return self.y


def conv_bn_layer(cls) -> tuple:
    """A training conv + BatchNorm layer (fuse()'s layout: the BatchNorm kept in __dict__) with a stubbed record."""
    from torch import nn
    module = cls.from_modules(nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                              bn_registered_elsewhere=True).train()
    call = module._call
    settings = (module.strict, decide.is_strict(), resolve(module.policy), module.bn.eps, module.activation,
                module.stride, module.padding, module.dilation, module.groups)
    call.recorded, call.signature, call.mode = StubRecord(torch.empty(0)), (settings,), "batch statistics"
    return module, call.recorded.y


def conv_layer() -> tuple:
    module = tcf.Conv2dReLU(16, 16, 3, padding=1)
    call = module._call
    settings = ("conv", module.stride, module.padding, module.dilation, module.groups, module.activation,
                module.padding_mode, module.strict, decide.is_strict(), resolve(module.policy))
    call.recorded, call.signature, call.run = StubRecord(torch.empty(0)), (settings,), (True,)
    return module, call.recorded.y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    x, residual = torch.empty(2, 16, 8, 8), torch.empty(2, 16, 8, 8)
    layers = {}
    for name, (module, y) in (("Conv2dBNReLU, training", conv_bn_layer(tcf.Conv2dBNReLU)),
                              ("Conv2dBNAddReLU, training", conv_bn_layer(tcf.Conv2dBNAddReLU)),
                              ("Conv2dReLU", conv_layer())):
        inputs = (x, residual) if "Add" in name else (x,)
        assert module(*inputs) is y, f"{name}: the stub record was not called; the benchmark would time another path"
        layers[name] = (lambda module=module, inputs=inputs: module(*inputs))
    stub = StubRecord(x)
    layers["the stub record alone (floor)"] = lambda: stub.run(x, x, x, x, x, x, x, x, x, 0.1)
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}"
          f"; host us a call, median of {args.rounds} rounds of {args.calls} calls")
    for name, fn in layers.items():
        us = host_us(fn, calls=args.calls, repeats=args.rounds, warmup=1000, cuda=False)
        print(f"{name:<36}{us:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
