"""The host cost of a fused module's own Python: microseconds a call of a training Conv2dBNReLU, Conv2dBNAddReLU and
Conv2dReLU whose recorded C++ call is replaced by a stub that returns at once, so what is timed is the module's
Python from nn.Module.__call__ to the record (the reads of its parameters and buffers, BatchNorm's arguments, the
settings check), not the op. Runs on the CPU, no GPU or extension needed. A layer's full host time on the GPU is
layer_host_time.py's; there a host's drift between runs can hide a few microseconds, here it cannot.

Timed two ways: back to back (the module's code and data stay in the processor's caches), and one call at a time
after copying 1, 4 or 16 MiB on the same core, which leaves the caches holding the copy, as a real call's C++ work
(the conv's and BatchNorm's launches, the allocator) leaves them holding its own.

The stub is installed as a layer's record would be after its first call (LayerCall.recorded, with the settings the
op compares first); a first call asserts that the stub answered, so a change of the record's check fails here
instead of timing another path.

    python benchmarks/module_python_time.py [--calls 20000] [--rounds 9] [--evict 1 4 16]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
from torch import nn

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


def cold_us(fn, evict, calls: int) -> float:
    """The median µs of single calls of `fn()`, each after `evict()` (outside the timed span)."""
    samples = []
    for _ in range(calls):
        evict()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--evict", type=int, nargs="*", default=[1, 4, 16], metavar="MIB",
                        help="also time single calls, each after copying this many MiB (the caches then hold the "
                             "copy, not the module's Python: as after the C++ work of a real call)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the copy on this thread's core, whose caches the timed call then finds cold
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
          f"; host us a call: back to back, the median of {args.rounds} rounds of {args.calls} calls; after an "
          f"eviction, the median of {args.calls // 4} single calls")
    buffers = {mib: (torch.randn(mib << 18), torch.empty(mib << 18)) for mib in args.evict}
    print(f"{'':<36}{'back to back':>13}" + "".join(f"{f'after {mib} MiB':>14}" for mib in args.evict))
    for name, fn in layers.items():
        row = [host_us(fn, calls=args.calls, repeats=args.rounds, warmup=1000, cuda=False)]
        for src, dst in buffers.values():
            row.append(cold_us(fn, lambda src=src, dst=dst: dst.copy_(src), args.calls // 4))
        print(f"{name:<36}{row[0]:>13.2f}" + "".join(f"{us:>14.2f}" for us in row[1:]), flush=True)


if __name__ == "__main__":
    main()
