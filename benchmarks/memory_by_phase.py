"""GPU memory of a training step by phase, for eager, fused (tcf.fuse) and torch.compile in one run: batch 256,
224x224, bf16 autocast, channels_last, SGD with momentum, as profile_by_kind.py runs it. torch.cuda's allocator
statistics (memory_allocated, max_memory_allocated; the caching allocator's reserve is not counted), in MiB:

- first step: the peak over building the variant and its first step (plans built and tuned, algorithms searched,
  compilation), everything allocated included (the plain model, the input batch);
- resident: allocated at the start of a later step, after zero_grad (parameters, optimizer state, input);
- then, above resident: the forward's peak, what the forward leaves allocated (the tensors saved for backward and
  the loss), the peak of backward and the SGD step, and the step's peak in all (also absolute).

    python benchmarks/memory_by_phase.py [--model resnet50|mobilenet_v1|mobilenet_v2] [--batch 256] [--no-compile]
                                         [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mobilenet import train_step_fn  # noqa: E402
from profile_by_kind import model_arguments, run_header, setup  # noqa: E402

MIB = 2**20
COLUMNS = (("first_step_peak", "first step"), ("resident", "resident"), ("forward_peak", "fwd peak"),
           ("after_forward", "after fwd"), ("backward_peak", "bwd peak"), ("step_peak", "step peak"),
           ("step_peak_absolute", "step peak abs"))


def measure(make, x, target, warmup: int) -> dict:
    marks: dict[str, int] = {}

    def between(phase: str) -> None:
        torch.cuda.synchronize()
        marks[phase] = torch.cuda.memory_allocated()
        marks[phase + "_peak"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    torch.cuda.reset_peak_memory_stats()
    model = make()
    model.train()
    step = train_step_fn(model, x, target, between)
    step()
    torch.cuda.synchronize()
    first = max(torch.cuda.max_memory_allocated(), *(v for k, v in marks.items() if k.endswith("_peak")))
    for _ in range(warmup):
        step()
    step()  # the measured step
    torch.cuda.synchronize()
    resident = marks["start"]
    row = {"first_step_peak": first, "resident": resident, "forward_peak": marks["forward_peak"] - resident,
           "after_forward": marks["forward"] - resident, "backward_peak": marks["backward_peak"] - resident,
           "step_peak": max(marks["forward_peak"], marks["backward_peak"], torch.cuda.max_memory_allocated()) - resident}
    row["step_peak_absolute"] = row["step_peak"] + resident
    del model, step
    return {k: v / MIB for k, v in row.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_arguments(p, "resnet50")
    p.add_argument("--warmup", type=int, default=2, help="steps between the first and the measured one")
    args = p.parse_args()
    _, x, target, variants = setup(args.model, args.batch, with_compile=not args.no_compile)
    out = {**run_header(args), "rows": []}
    for variant, make in variants.items():
        try:
            row = {"variant": variant, **measure(make, x, target, args.warmup)}
        except Exception as error:  # noqa: BLE001 — a variant that fails is reported, not fatal
            row = {"variant": variant, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        out["rows"].append(row)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"\n{args.model}, batch {args.batch}, training step, bf16 autocast, channels_last ({out['gpu']}, torch "
          f"{out['torch']}, cuDNN {out['cudnn']}); MiB, torch.cuda.memory_allocated; 'first step' and 'step peak abs' "
          "absolute, the others above 'resident'")
    print(f"{'variant':<15}" + "".join(f"{title:>15}" for _, title in COLUMNS))
    for row in out["rows"]:
        if "error" in row:
            print(f"{row['variant']:<15} failed: {row['error']}")
        else:
            print(f"{row['variant']:<15}" + "".join(f"{row[key]:>15.0f}" for key, _ in COLUMNS))


if __name__ == "__main__":
    main()
