"""Host time of a training BatchNorm2dReLU that follows no conv (densenet121's norm1 layers: BatchNorm, ReLU, then
the conv), against eager's BatchNorm2d + ReLU modules: microseconds a call, with grad, bfloat16 input, channels_last,
on four of densenet121's norm1 shapes, one from each dense block. Rows take turns within each round; a row's
figure is the median over the rounds. A sample times issuing its calls and waits for the GPU only after them
(timing.host_us), so the figures are the host's; at batch 128 the kernels take longer than the calls, and a sample
waits too wherever the GPU's launch queue fills.

--eval times both in eval under torch.no_grad instead (running statistics: the fused module runs eager's composition).

Run it once with each package on the same machine for an A/B (the package is whichever `torch_cudnn_fusion` imports).

    python benchmarks/bn_module_host_time.py [--batches 8 128] [--rounds 9] [--calls 200] [--eval]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

import torch
from torch import nn

import torch_cudnn_fusion as tcf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import host_us  # noqa: E402

# (channels, height = width) of the norm1 of denseblock1.denselayer5, denseblock2.denselayer8, denseblock3.denselayer13
# and denseblock4.denselayer16
SHAPES = ((192, 56), (352, 28), (640, 14), (992, 7))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--eval", action="store_true", help="both modules in eval, under torch.no_grad")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"package {os.path.dirname(tcf.__file__)}; host us a call, median of {args.rounds} rounds of "
          f"{args.calls} calls, {'eval, no_grad' if args.eval else 'training, with grad'}")
    print(f"{'batch':>5} {'layer':>8} {'eager modules':>14} {'BatchNorm2dReLU':>16}  status")
    for batch in args.batches:
        for channels, size in SHAPES:
            bn, relu = nn.BatchNorm2d(channels).cuda(), nn.ReLU(inplace=True)
            fused = tcf.BatchNorm2dReLU.from_bn(copy.deepcopy(bn))
            x = torch.randn(batch, channels, size, size, device="cuda", dtype=torch.bfloat16)
            x = x.to(memory_format=torch.channels_last).requires_grad_(not args.eval)
            bn.train(not args.eval), fused.train(not args.eval)
            rows = {"eager": lambda: relu(bn(x)), "fused": lambda: fused(x)}
            if args.eval:
                rows = {name: torch.no_grad()(fn) for name, fn in rows.items()}
            samples = {name: [] for name in rows}
            for fn in rows.values():
                fn(), fn()
            for _ in range(args.rounds):
                for name, fn in rows.items():
                    samples[name].append(host_us(fn, calls=args.calls, repeats=1, warmup=0))
            eager, ours = (statistics.median(samples[name]) for name in rows)
            print(f"{batch:>5} {f'{channels}@{size}':>8} {eager:>14.1f} {ours:>16.1f}  {fused.fusion_status}",
                  flush=True)


if __name__ == "__main__":
    main()
