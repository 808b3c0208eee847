"""A/B of the fused model's one-launch weight casts (torch_cudnn_fusion/nn/weight_casts.py): the same fused model
with its forward hooks (one torch._foreach_copy_ casts every conv + BatchNorm weight before the forward) and a copy
without them (each layer's op casts its own), training steps under autocast, timed in turn in one run.

    python benchmarks/weight_casts_ab.py [--model mobilenet_v1|mobilenet_v2|resnet50] [--batch 256] [--json FILE]

Prints per variant: the loop (5 back-to-back steps, interleaved medians), the host's time to issue a step, the GPU
kernels per step (torch.profiler) and those of the casts (float32 -> bfloat16 copies and the foreach cast).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from bench_mobilenet import train_step_fn
from profile_by_kind import host_ms, kernel_ms_per_step, model_arguments, run_header, setup
from timing import interleaved_median_ms


def cast_ms(kernels: dict[str, float]) -> float:
    """The float32 -> bfloat16 copies and the foreach copies (the casts and the optimizer's) per step, ms."""
    return sum(ms for name, ms in kernels.items() if "bfloat16_copy" in name or "multi_tensor_apply" in name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(p, "mobilenet_v1", compile_option=False)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    _, x, target, variants = setup(args.model, args.batch)
    with_hooks = variants["fused"]().train()
    without = copy.deepcopy(with_hooks)
    without._forward_pre_hooks.clear()
    without._forward_hooks.clear()
    steps = {"one launch": train_step_fn(with_hooks, x, target), "per layer": train_step_fn(without, x, target)}
    loops = interleaved_median_ms(steps, warmup=3, repeats=args.repeats, calls=5)
    rows = []
    for name, step in steps.items():
        kernels = kernel_ms_per_step(step, args.steps)
        rows.append({"variant": name, "loop_ms": loops[name], "host_ms": host_ms(step, args.repeats),
                     "kernel_ms": sum(kernels.values()), "cast_and_foreach_ms": cast_ms(kernels)})
    print(f"{args.model}, batch {args.batch}, bfloat16 autocast, channels_last ({torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()})")
    print(f"{'variant':12s} {'loop ms':>8s} {'host ms':>8s} {'kernels':>8s} {'casts + foreach':>16s}")
    for r in rows:
        print(f"{r['variant']:12s} {r['loop_ms']:8.3f} {r['host_ms']:8.3f} {r['kernel_ms']:8.3f} "
              f"{r['cast_and_foreach_ms']:16.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**run_header(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
