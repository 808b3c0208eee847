"""The host's time to issue a training step, eager and fused (tcf.fuse) interleaved step by step in one process, in
two conditions: with the GPU held asleep (a long sleep kernel queued first, so that no call can wait on the GPU: pure
issue time) and from an idle GPU (profile_by_kind.py's "host ms"). Per phase (forward with the loss, backward, SGD
step), the median and the minimum over the rounds. Interleaving matters: host times drift within a process and differ
between processes and hosts by more than the gaps measured here.

    python benchmarks/host_issue.py [--model mobilenet_v1|mobilenet_v2|resnet50] [--batch 256] [--rounds 20]
                                    [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mobilenet import train_step_fn  # noqa: E402
from profile_by_kind import model_arguments, run_header, setup  # noqa: E402
from timing import SLEEP_CYCLES  # noqa: E402

PHASES = ("forward", "backward", "step", "all")


def timed_step(step, marks: dict, asleep: bool) -> dict[str, float]:
    """One call of `step` from an idle GPU (asleep: behind a queued sleep kernel); ms per phase."""
    torch.cuda.synchronize()
    if asleep:
        torch.cuda._sleep(SLEEP_CYCLES)
    start = time.perf_counter()
    step()
    end = time.perf_counter()
    return {"forward": (marks["forward"] - marks["start"]) * 1e3,
            "backward": (marks["backward"] - marks["forward"]) * 1e3,
            "step": (end - marks["backward"]) * 1e3, "all": (end - start) * 1e3}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_arguments(p, "mobilenet_v2", compile_option=False)
    p.add_argument("--rounds", type=int, default=20, help="interleaved steps per variant and condition")
    p.add_argument("--warmup", type=int, default=8)
    args = p.parse_args()
    _, x, target, variants = setup(args.model, args.batch)
    steps, marks = {}, {}
    for name in ("eager", "fused"):
        marks[name] = {}
        steps[name] = train_step_fn(variants[name]().train(), x, target,
                                    lambda phase, m=marks[name]: m.__setitem__(phase, time.perf_counter()))
        for _ in range(args.warmup):
            steps[name]()
    samples = {(name, asleep): {phase: [] for phase in PHASES} for name in steps for asleep in (True, False)}
    for _ in range(args.rounds):
        for asleep in (True, False):
            for name in steps:
                for phase, ms in timed_step(steps[name], marks[name], asleep).items():
                    samples[(name, asleep)][phase].append(ms)
    torch.cuda.synchronize()
    out = {**run_header(args), "rounds": args.rounds, "rows": []}
    print(f"{args.model}, batch {args.batch}, training step, bf16 autocast, channels_last ({out['gpu']}, torch "
          f"{out['torch']}, cuDNN {out['cudnn']}); host ms to issue, eager and fused interleaved, {args.rounds} "
          "rounds: median (minimum)")
    print(f"{'condition':<12}{'variant':<8}" + "".join(f"{phase:>18}" for phase in PHASES))
    for (name, asleep), by_phase in samples.items():
        row = {"variant": name, "condition": "asleep" if asleep else "idle",
               **{phase: {"median_ms": statistics.median(v), "min_ms": min(v)} for phase, v in by_phase.items()}}
        out["rows"].append(row)
    for row in sorted(out["rows"], key=lambda r: (r["condition"], r["variant"])):
        print(f"{row['condition']:<12}{row['variant']:<8}" + "".join(
            f"{row[phase]['median_ms']:>10.2f} ({row[phase]['min_ms']:5.2f})" for phase in PHASES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
