"""Where a training Conv2d+BatchNorm2d+ReLU layer's time goes, fused vs eager: host microseconds per forward+backward
(no GPU wait), GPU microseconds per forward+backward (CUDA-graph replay, no host cost), and the kernels of one fused
forward+backward from the profiler.

    python benchmarks/profile_bn_layer.py [--batch 256] [--profile "1x1 1024->1024 @7"]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cudnn_fusion as tcf  # noqa: E402
from timing import graph_replay_ms, host_us  # noqa: E402

# (in, out, kernel, stride, groups, input size): MobileNet v1 layers at 28x28 and below, where fused ran slower.
LAYERS = [
    (256, 256, 3, 2, 256, 28),
    (256, 512, 1, 1, 1, 14),
    (512, 512, 3, 1, 512, 14),
    (512, 512, 1, 1, 1, 14),
    (512, 512, 3, 2, 512, 14),
    (512, 1024, 1, 1, 1, 7),
    (1024, 1024, 3, 1, 1024, 7),
    (1024, 1024, 1, 1, 1, 7),
]


def name(cin, cout, k, s, g, size):
    return f"{k}x{k} {cin}->{cout} s{s} g{g} @{size}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--profile", default=name(*LAYERS[5]))
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    cl = torch.channels_last
    rows = []
    for cin, cout, k, s, g, size in LAYERS:
        conv = torch.nn.Conv2d(cin, cout, k, s, k // 2, groups=g, bias=False)
        seq = torch.nn.Sequential(conv, torch.nn.BatchNorm2d(cout), torch.nn.ReLU()).cuda().to(memory_format=cl)
        fused = tcf.Conv2dBNReLU.from_modules(copy.deepcopy(seq[0]), copy.deepcopy(seq[1]))
        x = torch.randn(args.batch, cin, size, size, device="cuda", dtype=torch.bfloat16).to(memory_format=cl)
        x.requires_grad_()
        row = {"layer": name(cin, cout, k, s, g, size)}
        steps = {}
        for label, module in (("eager", seq), ("fused", fused)):
            with torch.autocast("cuda", torch.bfloat16):
                grad = torch.randn_like(module(x))

            def step(module=module, grad=grad):
                with torch.autocast("cuda", torch.bfloat16):
                    y = module(x)
                y.backward(grad)

            steps[label] = step
        # host time in turns (eager, fused, eager, ...): the lent machine's host speed drifts within a run
        host = {label: [] for label in steps}
        for _ in range(5):
            for label, step in steps.items():
                host[label].append(host_us(step, calls=50, repeats=1))
        for label, step in steps.items():
            row[f"{label}_host_us"] = statistics.median(host[label])
            row[f"{label}_gpu_us"] = graph_replay_ms(step) * 1e3
            if label == "fused" and row["layer"] == args.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        step()
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60))
                print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=60))
        row["status"] = str(fused.fusion_status)
        rows.append(row)
        print(row, flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"batch {args.batch}, bf16, channels_last; per forward+backward of one Conv2d+BatchNorm2d+ReLU (training)")
    print(f"{'layer':<26}{'eager host us':>14}{'fused host us':>14}{'eager GPU us':>13}{'fused GPU us':>13}")
    for r in rows:
        print(f"{r['layer']:<26}{r['eager_host_us']:>14.1f}{r['fused_host_us']:>14.1f}{r['eager_gpu_us']:>13.1f}"
              f"{r['fused_gpu_us']:>13.1f}")


if __name__ == "__main__":
    main()
