"""The host's side of a training step, by operator: torch.profiler's CPU time per step of the heaviest operators
(self time, and time including what they call), and the CUDA runtime calls, for eager and fused (tcf.fuse) in one
run, beside each step's kernel time. Where a step's host time exceeds its kernels' (profile_by_kind.py's "host ms"
and "loop ms"), this shows where the host spends it and whether it waits on the GPU (synchronizing calls, allocations).
The profiler adds its own cost to every operator: compare the variants with one another, not with untraced timings.
Untraced, each variant's host time to issue a step is taken from an idle GPU and with the GPU held asleep (no call
can wait on it): where the two differ, the step waits on the GPU somewhere. At 28x the idle-GPU figure alone said
fused issued timm:cspdarknet53's step slower than eager, where the profile said it did less.

    python benchmarks/profile_host.py [--model mobilenet_v1|mobilenet_v2|resnet50|timm:cspdarknet53] [--batch 256]
                                      [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mobilenet import train_step_fn  # noqa: E402
from profile_by_kind import host_ms, model_arguments, run_header, setup  # noqa: E402

RUNTIME_CALL = re.compile(r"cu(da)?[A-Z]")  # cudaLaunchKernel, cuLaunchKernelEx, ... (not cudnn_fusion::...)


def host_profile(fn, steps: int) -> dict:
    """Per step: CPU operators (self and total microseconds, calls), CUDA runtime calls, and kernel milliseconds."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    operators, runtime, kernel_us = {}, {}, 0.0
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernel_us += getattr(event, "self_device_time_total", 0.0)
            continue
        entry = {"self_us": event.self_cpu_time_total / steps, "total_us": event.cpu_time_total / steps,
                 "calls": event.count / steps}
        (runtime if RUNTIME_CALL.match(event.key) else operators)[event.key] = entry
    return {"operators": operators, "runtime": runtime, "kernel_ms": kernel_us / 1000.0 / steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_arguments(p, "mobilenet_v2", compile_option=False)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=3, help="profiled steps per variant")
    p.add_argument("--repeats", type=int, default=10, help="untraced steps timed for each host time")
    p.add_argument("--top", type=int, default=20, help="operators listed per variant")
    args = p.parse_args()
    _, x, target, variants = setup(args.model, args.batch)
    out = {**run_header(args), "variants": {}}
    # The untraced host times first, every variant's, then the profiles: a process that has run torch.profiler may
    # launch kernels slower after it (pytorch/pytorch#144455).
    for phase in ("untraced", "traced"):
        for name, make in variants.items():
            model = make().train()
            fn = train_step_fn(model, x, target)
            for _ in range(args.warmup):
                fn()
            if phase == "untraced":
                out["variants"][name] = {"host_ms": host_ms(fn, args.repeats),
                                         "host_asleep_ms": host_ms(fn, args.repeats, asleep=True)}
            else:
                out["variants"][name].update(host_profile(fn, args.steps))
            del model, fn
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"{args.model}, batch {args.batch}, training step, bf16 autocast, channels_last ({out['gpu']}, torch "
          f"{out['torch']}, cuDNN {out['cudnn']}); per step, under the profiler")
    for name, row in out["variants"].items():
        self_ms = sum(o["self_us"] for o in row["operators"].values()) / 1000.0
        runtime_ms = sum(r["self_us"] for r in row["runtime"].values()) / 1000.0
        print(f"\n{name}: host untraced {row['host_ms']:.2f} ms from an idle GPU, {row['host_asleep_ms']:.2f} ms with "
              f"the GPU asleep; traced: operators' self time {self_ms:.2f} ms, CUDA runtime calls {runtime_ms:.2f} ms; "
              f"kernels {row['kernel_ms']:.2f} ms")
        print(f"  {'operator (by self time)':<70}{'self us':>10}{'total us':>10}{'calls':>8}")
        for key, o in sorted(row["operators"].items(), key=lambda item: -item[1]["self_us"])[: args.top]:
            print(f"  {key[:68]:<70}{o['self_us']:>10.0f}{o['total_us']:>10.0f}{o['calls']:>8.1f}")
        print(f"  {'CUDA runtime call':<70}{'self us':>10}{'':>10}{'calls':>8}")
        for key, r in sorted(row["runtime"].items(), key=lambda item: -item[1]["self_us"]):
            print(f"  {key[:68]:<70}{r['self_us']:>10.0f}{'':>10}{r['calls']:>8.1f}")


if __name__ == "__main__":
    main()
