"""GPU memory of a training step by phase, for eager, fused (tcf.fuse) and torch.compile in one run: batch 256,
224x224, bf16 autocast, channels_last, SGD with momentum, as profile_by_kind.py runs it. torch.cuda's allocator
statistics (memory_allocated, max_memory_allocated; the caching allocator's reserve is not counted), in MiB:

- build: the peak over building the variant alone (fuse()'s copy of the model included), everything allocated
  included (the plain model, the input batch);
- first step: the peak over building the variant and its first step (plans built and tuned, algorithms searched,
  compilation), everything allocated included;
- resident: allocated at the start of a later step, after zero_grad (parameters, optimizer state, input);
- then, above resident: the forward's peak, what the forward leaves allocated (the tensors saved for backward and
  the loss), the peak of backward and the SGD step, and the step's peak in all (also absolute).

    python benchmarks/memory_by_phase.py [--model resnet50|mobilenet_v1|mobilenet_v2] [--batch 256] [--no-compile]
                                         [--inference | --after-eval] [--json out.json]

--inference measures an eval forward under torch.no_grad instead (bench_mobilenet.inference_fn): its "fwd peak" is
the call's peak above resident, "after fwd" what the call leaves allocated; it has no backward.

--after-eval runs one eval forward (as --inference's) on the built model before its training steps, as a loop that
evaluates every epoch does: what the eval leaves cached shows in the training step's resident memory and peaks.

With --peak-tensors, instead: the caching allocator's trace of one training step of eager and of fused, the tensors
live at each one's peak of requested bytes, and those that only one of them holds (by size), with where each was
allocated (with --inference, of one eval forward).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mobilenet import inference_fn, train_step_fn  # noqa: E402
from profile_by_kind import model_arguments, run_header, setup  # noqa: E402

MIB = 2**20
COLUMNS = (("build_peak", "build"), ("first_step_peak", "first step"), ("resident", "resident"),
           ("forward_peak", "fwd peak"), ("after_forward", "after fwd"), ("backward_peak", "bwd peak"),
           ("step_peak", "step peak"), ("step_peak_absolute", "step peak abs"))


def measure(make, x, target, warmup: int, inference: bool = False, after_eval: bool = False) -> dict:
    marks: dict[str, int] = {}

    def between(phase: str) -> None:
        torch.cuda.synchronize()
        marks[phase] = torch.cuda.memory_allocated()
        marks[phase + "_peak"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()

    torch.cuda.reset_peak_memory_stats()
    model = make()
    torch.cuda.synchronize()
    build = torch.cuda.max_memory_allocated()
    if after_eval:
        model.eval()
        inference_fn(model, x)()
    model.train(not inference)
    if inference:
        forward = inference_fn(model, x)

        def step():
            between("start")
            forward()
            between("forward")
    else:
        step = train_step_fn(model, x, target, between)
    step()
    torch.cuda.synchronize()
    first = max(build, torch.cuda.max_memory_allocated(), *(v for k, v in marks.items() if k.endswith("_peak")))
    for _ in range(warmup):
        step()
    step()  # the measured step
    torch.cuda.synchronize()
    resident = marks["start"]
    row = {"build_peak": build, "first_step_peak": first, "resident": resident,
           "forward_peak": marks["forward_peak"] - resident, "after_forward": marks["forward"] - resident,
           "backward_peak": marks.get("backward_peak", resident) - resident,
           "step_peak": max(marks["forward_peak"], marks.get("backward_peak", 0),
                            torch.cuda.max_memory_allocated()) - resident}
    row["step_peak_absolute"] = row["step_peak"] + resident
    del model, step
    return {k: v / MIB for k, v in row.items()}


def tensors_at_peak(make, x, target, warmup: int, inference: bool = False) -> dict:
    """The requested bytes resident before a step (after warm-up) and the tensors live at the step's peak of requested
    bytes, from the caching allocator's trace of that step: {"base": bytes, "peak": bytes above base, "live": [(size,
    where it was allocated)]} ("where": the Python frames outside torch's internals; none for an allocation made in
    C++ with no Python caller, such as autograd's backward thread)."""
    model = make()
    model.train(not inference)
    step = inference_fn(model, x) if inference else train_step_fn(model, x, target)
    for _ in range(1 + warmup):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_stats()["requested_bytes.all.current"]
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=1_000_000)
    try:
        step()
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    live, current, peak, at_peak = {}, 0, 0, {}
    for event in trace:  # an alloc event's size is the bytes requested
        if event["action"] == "alloc":
            live[event["addr"]] = (event["size"], event.get("frames", []))
            current += event["size"]
            if current > peak:
                peak, at_peak = current, dict(live)
        elif event["action"] == "free_requested" and event["addr"] in live:
            current -= live.pop(event["addr"])[0]

    def where(frames) -> str:
        kept = [f"{f['filename'].split('/')[-1]}:{f['line']}:{f['name']}" for f in frames
                if "site-packages/torch/_" not in f["filename"]]
        return " < ".join(kept[:4])

    del model, step
    return {"base": base, "peak": peak, "live": [(size, where(frames)) for size, frames in at_peak.values()]}


def print_peak_difference(rows: dict) -> None:
    """The tensors live at the peak in one variant with no tensor of the same size to match in the other."""
    sizes = {name: collections.Counter(size for size, _ in row["live"]) for name, row in rows.items()}
    (a, row_a), (b, row_b) = rows.items()
    print(f"\ntensors at the step's peak of requested bytes: {a} base {row_a['base']} B + peak {row_a['peak']} B, "
          f"{b} base {row_b['base']} B + peak {row_b['peak']} B; {b} - {a}: "
          f"{row_b['base'] + row_b['peak'] - row_a['base'] - row_a['peak']} B")
    for name, other in ((a, b), (b, a)):
        unmatched = sizes[name] - sizes[other]
        print(f"live at the peak only in {name}: {sum(s * c for s, c in unmatched.items())} B in "
              f"{sum(unmatched.values())} tensors")
        for size, place in sorted(rows[name]["live"], key=lambda item: -item[0]):
            if unmatched[size] > 0:
                unmatched[size] -= 1
                print(f"  {size:>12}  {place or '(no Python frame)'}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_arguments(p, "resnet50")
    p.add_argument("--warmup", type=int, default=2, help="steps between the first and the measured one")
    p.add_argument("--peak-tensors", action="store_true",
                   help="instead: the tensors live at eager's and fused's peak, and those only one of them holds")
    p.add_argument("--inference", action="store_true", help="an eval forward under torch.no_grad, not a training step")
    p.add_argument("--after-eval", action="store_true", help="one eval forward before the training steps")
    args = p.parse_args()
    if args.after_eval and (args.inference or args.peak_tensors):
        p.error("--after-eval measures training steps: not with --inference or --peak-tensors")
    what = "eval forward" if args.inference else "training step after an eval forward" if args.after_eval else \
        "training step"
    if args.peak_tensors:
        _, x, target, variants = setup(args.model, args.batch)
        rows = {}
        for variant in ("eager", "fused"):
            rows[variant] = tensors_at_peak(variants[variant], x, target, args.warmup, args.inference)
            torch.cuda.empty_cache()
        header = run_header(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**header, "rows": rows}, f, indent=1)
        print(f"{args.model}, batch {args.batch}, {what}, bf16 autocast, channels_last ({header['gpu']}, torch "
              f"{header['torch']}, cuDNN {header['cudnn']})")
        print_peak_difference(rows)
        return
    _, x, target, variants = setup(args.model, args.batch, with_compile=not args.no_compile)
    out = {**run_header(args), "rows": []}
    for variant, make in variants.items():
        try:
            row = {"variant": variant, **measure(make, x, target, args.warmup, args.inference, args.after_eval)}
        except Exception as error:  # noqa: BLE001 — a variant that fails is reported, not fatal
            row = {"variant": variant, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        out["rows"].append(row)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"\n{args.model}, batch {args.batch}, {what}, bf16 autocast, channels_last ({out['gpu']}, torch "
          f"{out['torch']}, cuDNN {out['cudnn']}); MiB, torch.cuda.memory_allocated; 'first step' and 'step peak abs' "
          "absolute, the others above 'resident'" + ("; no backward" if args.inference else ""))
    print(f"{'variant':<15}" + "".join(f"{title:>15}" for _, title in COLUMNS))
    for row in out["rows"]:
        if "error" in row:
            print(f"{row['variant']:<15} failed: {row['error']}")
        else:
            print(f"{row['variant']:<15}" + "".join(f"{row[key]:>15.0f}" for key, _ in COLUMNS))


if __name__ == "__main__":
    main()
