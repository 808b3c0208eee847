"""Where a stem conv's space-to-depth form (torch_cudnn_fusion/ops/stem.py) pays: a stem layer's training step
(forward + backward) in the form, as the plain fused conv (the same layer without the form) and eager, over batch
sizes, for MobileNet's 3x3/2 3->32 and ResNet's 7x7/2 3->64 stems at 224x224, as Conv2dReLU (conv + bias + ReLU)
and Conv2dBNReLU (conv + BatchNorm + ReLU, training). bf16 autocast, channels_last, cudnn.benchmark on; x is the
float32 image batch, which needs no gradient.

The form runs the conv's sums faster on the GPU, but costs the host more per call than the plain fused conv (our
kernels rearrange x and the filter forward, and x again and the filter's gradient backward). Where a step waits on
the host (small batches), the plain conv is faster; where it waits on the GPU, the form is. The decision's threshold,
decide.STEM_FORM_MIN_MACS (the conv's multiply-adds a call), is set from this benchmark's crossover; the script sets
it to 0 (always the form) and to infinity (never) for the two fused variants.

Columns (ms a step): host included (CUDA events around back-to-back steps, the median of 11 repeats of 10) and GPU
alone (the same steps replayed from a CUDA graph), for the form, the plain fused conv and eager; MACs: the conv's
multiply-adds a call.

    python benchmarks/stem_form_batches.py [--batches 8 16 32 64 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
from pathlib import Path

import torch
from torch import nn

import torch_cudnn_fusion as tcf
from bench_conv_layers import environment, time_ms
from timing import graph_replay_ms
from torch_cudnn_fusion.ops import decide

STEMS = [("mbv1 stem 3x3/2 3->32", 3, 32, 3), ("rn50 stem 7x7/2 3->64", 3, 64, 7)]
SIZE = 224


def layers(kind: str, cin: int, cout: int, k: int) -> dict:
    """{variant: module}: the form, the plain fused conv and eager, from one conv (and BatchNorm)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(cin, cout, k, 2, k // 2, bias=kind == "Conv2dReLU").cuda().to(memory_format=torch.channels_last)
    if kind == "Conv2dReLU":
        return {"form": tcf.Conv2dReLU.from_conv(copy.deepcopy(conv)),
                "plain": tcf.Conv2dReLU.from_conv(copy.deepcopy(conv)),
                "eager": nn.Sequential(copy.deepcopy(conv), nn.ReLU())}
    bn = nn.BatchNorm2d(cout).cuda()
    return {"form": tcf.Conv2dBNReLU.from_modules(copy.deepcopy(conv), copy.deepcopy(bn)),
            "plain": tcf.Conv2dBNReLU.from_modules(copy.deepcopy(conv), copy.deepcopy(bn)),
            "eager": nn.Sequential(copy.deepcopy(conv), copy.deepcopy(bn), nn.ReLU())}


def bench(kind: str, cin: int, cout: int, k: int, batch: int) -> dict:
    modules = layers(kind, cin, cout, k)
    out = (SIZE + 2 * (k // 2) - k) // 2 + 1
    input_sets = [(torch.randn(batch, cin, SIZE, SIZE, device="cuda").contiguous(memory_format=torch.channels_last),
                   torch.randn(batch, cout, out, out, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]

    def step(module):
        def run(x, g):
            with torch.autocast("cuda", torch.bfloat16):
                y = module(x)
            y.backward(g)
        return run

    row = {"kind": kind, "batch": batch, "macs": batch * out * out * cout * cin * k * k}
    threshold = decide.STEM_FORM_MIN_MACS
    try:
        for variant, setting in (("form", 0), ("plain", math.inf)):  # decided (and recorded) on the first call
            decide.STEM_FORM_MIN_MACS = setting
            step(modules[variant])(*input_sets[0])
    finally:
        decide.STEM_FORM_MIN_MACS = threshold
    assert "stem:" in modules["form"].fusion_status.reason, modules["form"].fusion_status
    assert "stem:" not in modules["plain"].fusion_status.reason, modules["plain"].fusion_status
    row["plain_fused"] = modules["plain"].fusion_status.fused
    for variant, module in modules.items():
        row[f"{variant}_ms"] = time_ms(step(module), input_sets)
    for variant, module in modules.items():
        calls = iter(range(10**9))
        row[f"{variant}_gpu_ms"] = graph_replay_ms(lambda: step(module)(*input_sets[next(calls) % len(input_sets)]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    env = environment()
    print(f"{env['gpu']}, torch {env['torch']}, cuDNN {env['cudnn']}, cudnn-frontend {env['cudnn_frontend']}; "
          f"a stem layer's forward + backward, bf16 autocast, channels_last; ms a step; threshold now "
          f"{decide.STEM_FORM_MIN_MACS / 1e9:g} G multiply-adds")
    print(f"{'layer':<22} {'module':<13} {'batch':>5} {'GMACs':>6} | {'form':>6} {'plain':>6} {'eager':>6} | GPU alone "
          f"{'form':>6} {'plain':>6} {'eager':>6} | decided")
    rows = []
    for name, cin, cout, k in STEMS:
        for kind in ("Conv2dReLU", "Conv2dBNReLU"):
            for batch in args.batches:
                row = {"layer": name, **bench(kind, cin, cout, k, batch)}
                rows.append(row)
                decided = "form" if row["macs"] >= decide.STEM_FORM_MIN_MACS else "plain"
                print(f"{name:<22} {kind:<13} {batch:>5} {row['macs'] / 1e9:6.2f} | {row['form_ms']:6.3f} "
                      f"{row['plain_ms']:6.3f} {row['eager_ms']:6.3f} | {'':9} {row['form_gpu_ms']:6.3f} "
                      f"{row['plain_gpu_ms']:6.3f} {row['eager_gpu_ms']:6.3f} | {decided}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
