"""Where a training loop's GPU waits: the idle time between a step's kernels, split into the time the GPU waited for
the host to launch the next kernel ("host late": the launch call began after the GPU had run out of work) and the
time a kernel already launched took to start ("queued"), and attributed to what launched each kernel.

Three passes over back-to-back training steps of each variant (the host runs ahead, as in a training loop):
1. CUDA activity only (CUPTI: kernels, memsets, copies and the runtime calls that launched them, no CPU operators, so
   the host is slowed least): the gaps, and the host's time between one launch and the next.
2. CPU operators, Python stacks and module names as well: what launched each kernel (the innermost operator, the
   module or autograd node around it). A kernel of pass 1 takes the labels of the same kernel in pass 2 (the two
   steps' kernel names aligned; a step launches the same kernels in the same order each time). A sleep kernel of a
   few cycles launched before each step marks where steps begin.
3. (--host-profile) cProfile of the step with the GPU held asleep behind a sleep kernel (pure issue time): the
   Python functions the host spends its time in. Backward is one C++ call there (the autograd engine); pass 2's
   labels split it.

The profiler costs host time of its own; pass 1's loop is printed beside the loop without any profiler (the
"loop ms" of profile_by_kind.py) to show how much.

    python benchmarks/profile_gaps.py [--model mobilenet_v1|mobilenet_v2|resnet50] [--variants fused eager]
                                      [--compile] [--host-profile] [--inventory] [--keep-traces DIR]
                                      [--json out.json]
"""

from __future__ import annotations

import argparse
import cProfile
import difflib
import gzip
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mobilenet import train_step_fn  # noqa: E402
from timing import SLEEP_CYCLES  # noqa: E402
from profile_by_kind import kind_of, model_arguments, run_header, setup  # noqa: E402
from timing import interleaved_median_ms  # noqa: E402

GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function")
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel, launched before each profiled step
MARKER_CYCLES = 100


# ---- the trace ----

def trace_events(prof, keep: str | None = None) -> list[dict]:
    """The profile's events as its Chrome trace holds them (keep: also written there, gzipped, for a later look)."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.json")
        prof.export_chrome_trace(path)
        if keep:
            with open(path, "rb") as source, gzip.open(keep, "wb") as kept:
                shutil.copyfileobj(source, kept)
        with open(path) as f:
            return json.load(f)["traceEvents"]


def correlation(event: dict):
    return (event.get("args") or {}).get("correlation")


def gpu_activities(events: list[dict]) -> list[dict]:
    """Kernels, memsets and copies by start time, each with the start of the runtime call that launched it and its
    thread ("launch_ts", "launch_tid"; None where the trace has no such call)."""
    launches = {correlation(e): e for e in events
                if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATEGORIES and correlation(e) is not None}
    out = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATEGORIES:
            continue
        launch = launches.get(correlation(e))
        out.append({"name": e["name"], "category": e["cat"], "ts": float(e["ts"]), "end": float(e["ts"]) + float(
            e.get("dur", 0.0)), "correlation": correlation(e),
            "launch_ts": None if launch is None else float(launch["ts"]),
            "launch_tid": None if launch is None else launch.get("tid")})
    out.sort(key=lambda a: (a["ts"], a["end"]))
    return out


def with_gaps(activities: list[dict]) -> list[dict]:
    """Each activity's idle time before it (µs: the GPU had nothing running since the last activity ended, on any
    stream), split into "host_late" (the part before its launch call began) and "queued" (the rest), and "busy" (the
    time it adds to the GPU's busy time: none of it where another activity already ran)."""
    covered = None
    for a in activities:
        idle = 0.0 if covered is None else max(0.0, a["ts"] - covered)
        late = 0.0
        if idle > 0.0 and a["launch_ts"] is not None:
            late = min(idle, max(0.0, a["launch_ts"] - covered))
        a["idle"], a["host_late"], a["queued"] = idle, late, idle - late
        a["busy"] = a["end"] - a["ts"] if covered is None else max(0.0, a["end"] - max(a["ts"], covered))
        covered = a["end"] if covered is None else max(covered, a["end"])
    return activities


def split_steps(activities: list[dict]) -> list[list[dict]]:
    """The activities of each step, split at the marker kernels run_profiled launches before each step (left out;
    the idle time before a marker, and the marker's own time of a few cycles, go to the activity after it)."""
    steps: list[list[dict]] = []
    carried = None
    for a in activities:
        if MARKER in a["name"]:
            steps.append([])
            carried = a
            continue
        if not steps:
            continue
        if carried is not None:
            a["idle"] += carried["idle"]
            a["host_late"] += carried["host_late"]
            a["queued"] += carried["queued"]
            a["busy"] += carried["busy"]
            carried = None
        steps[-1].append(a)
    return [step for step in steps if step]


def match_labels(acts: list[dict], labelled: list[dict]) -> int:
    """Gives each activity of a step of pass 1 the labels of the same kernel in a step of pass 2 (the two name
    sequences aligned, so that a kernel more or less in one of them shifts nothing); returns how many found none."""
    matcher = difflib.SequenceMatcher(a=[a["name"] for a in acts], b=[b["name"] for b in labelled], autojunk=False)
    unmatched = len(acts)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            source = labelled[block.b + k]
            acts[block.a + k].update(op=source["op"], where=source["where"], phase=source["phase"])
            unmatched -= 1
    unlabelled(acts)
    return unmatched


def host_context(events: list[dict], activities: list[dict]) -> None:
    """Labels each activity with what launched it: "op" (the innermost CPU operator around its launch call),
    "where" (the innermost module or Python function of this repo around it in forward; in backward, the autograd
    node) and "phase" ("forward", "backward", "optimizer" or "other", from the step's record_function marks)."""
    by_thread: dict = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES:
            by_thread[e.get("tid")].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e))
    pending: dict = defaultdict(list)
    for index, a in enumerate(activities):
        if a["launch_ts"] is not None:
            pending[a["launch_tid"]].append((a["launch_ts"], index))
    for tid, launches in pending.items():
        spans = sorted(by_thread.get(tid, ()), key=lambda s: (s[0], -s[1]))
        launches.sort()
        stack: list = []
        i = 0
        for ts, index in launches:
            while i < len(spans) and spans[i][0] <= ts:
                while stack and stack[-1][1] < spans[i][0]:
                    stack.pop()
                stack.append(spans[i])
                i += 1
            while stack and stack[-1][1] < ts:
                stack.pop()
            activities[index].update(label_of([s[2] for s in stack if s[0] <= ts <= s[1]]))
    unlabelled(activities)


def unlabelled(activities: list[dict]) -> None:
    """"?" for the labels of an activity that found none."""
    for a in activities:
        for key in ("op", "where", "phase"):
            a.setdefault(key, "?")


def label_of(enclosing: list[dict]) -> dict:
    """(op, where, phase) from the host events around a launch call, outermost first."""
    op, where, phase = "?", "?", "other"
    for e in enclosing:
        name, category = e["name"], e["cat"]
        if category == "user_annotation" and name in ("forward", "backward", "optimizer"):
            phase = name
        elif category == "cpu_op":
            op = name
            if name.startswith("autograd::engine::evaluate_function: "):
                where = name.split(": ", 1)[1]
                phase = "backward"
        elif category == "python_function" and (name.startswith("nn.Module: ") or "torch_cudnn_fusion" in name):
            where = name
    return {"op": op, "where": where, "phase": phase}


# ---- the passes ----

def run_profiled(fn, steps: int, activities, keep: str | None = None, **kwargs) -> list[dict]:
    """The trace of `steps` back-to-back calls of fn, each after a marker kernel (a sleep of a few cycles) that
    split_steps cuts the steps at."""
    torch.cuda.synchronize()
    with profile(activities=activities, **kwargs) as prof:
        for _ in range(steps):
            torch.cuda._sleep(MARKER_CYCLES)
            fn()
        torch.cuda.synchronize()
    return trace_events(prof, keep)


def gap_summary(step_activities: list[list[dict]]) -> dict:
    """Per step (µs, medians over the steps): its period (busy and idle time, the idle time before its first
    activity included: the steps run back to back), busy time, idle time and its host-late and queued parts, the
    activities' count, those without a launch call in the trace, and the host's span from its first launch call to
    its last."""
    rows = []
    for acts in step_activities:
        launches = [a["launch_ts"] for a in acts if a["launch_ts"] is not None]
        rows.append({
            "period_us": sum(a["busy"] + a["idle"] for a in acts),
            "busy_us": sum(a["busy"] for a in acts),
            "idle_us": sum(a["idle"] for a in acts),
            "host_late_us": sum(a["host_late"] for a in acts),
            "queued_us": sum(a["queued"] for a in acts),
            "activities": len(acts),
            "without_launch": len(acts) - len(launches),
            "launch_span_us": (max(launches) - min(launches)) if launches else float("nan"),
        })
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]}


def by_label(step_activities: list[list[dict]], key: str, value: str, top: int) -> list[tuple[str, float, int]]:
    """The labels (activity[key]) with the most `value` per step, µs, with how many activities a step has there."""
    totals: dict = defaultdict(float)
    counts: dict = defaultdict(int)
    for acts in step_activities:
        for a in acts:
            totals[a[key]] += a[value] / len(step_activities)
            counts[a[key]] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
    return [(label, us, counts[label] // len(step_activities)) for label, us in ranked]


def inventory(step_activities: list[list[dict]]) -> list[dict]:
    """Every kind of GPU activity of a step, by phase, launching operator and kernel name (its first 80 characters):
    how many a step, and their busy and idle µs a step (medians over the steps: each step launches the same ones)."""
    rows: dict = {}
    for step, acts in enumerate(step_activities):
        for a in acts:
            key = (a["phase"], a["op"], a["name"].removeprefix("void ")[:80])
            row = rows.setdefault(key, {"phase": key[0], "op": key[1], "kernel": key[2],
                                        **{f: [0.0] * len(step_activities) for f in ("count", "busy_us", "idle_us")}})
            row["count"][step] += 1
            row["busy_us"][step] += a["busy"]
            row["idle_us"][step] += a["idle"]
    out = [{**row, **{f: statistics.median(row[f]) for f in ("count", "busy_us", "idle_us")}} for row in rows.values()]
    return sorted(out, key=lambda r: -(r["busy_us"] + r["idle_us"]))


def launch_intervals(acts: list[dict]) -> None:
    """Each activity's "host_us": the host's time from the previous launch call's start to its own (what the host
    spent issuing it and what ran between the two calls)."""
    previous = None
    for a in acts:
        a["host_us"] = 0.0 if previous is None or a["launch_ts"] is None else a["launch_ts"] - previous
        if a["launch_ts"] is not None:
            previous = a["launch_ts"]


def host_profile(fn, steps: int, top: int) -> list[dict]:
    """cProfile of `steps` calls of fn, each issued with the GPU held asleep: the functions with the most own time,
    ms per step."""
    profiler = cProfile.Profile()
    for _ in range(steps):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        profiler.enable()
        fn()
        profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, function), (_, calls, own, cumulative, _) in stats.stats.items():
        where = function if filename == "~" else f"{'/'.join(filename.split('/')[-2:])}:{line}({function})"
        rows.append({"function": where, "calls": calls / steps, "own_ms": own * 1e3 / steps,
                     "cumulative_ms": cumulative * 1e3 / steps})
    rows.sort(key=lambda r: -r["own_ms"])
    return rows[:top]


def loop_ms(model, x, target, args) -> float:
    """A step's median time among back-to-back steps, no profiler running (profile_by_kind.py's "loop ms")."""
    plain = train_step_fn(model, x, target)
    for _ in range(args.warmup):
        plain()
    return interleaved_median_ms({"step": plain}, warmup=1, repeats=args.repeats, calls=5)["step"]


def measure(name: str, model, x, target, args) -> dict:
    marks = {"start": None}

    def between(phase: str) -> None:  # record_function marks around forward, backward and the optimizer step
        if marks["start"] is not None:
            marks["start"].__exit__(None, None, None)
        following = {"start": "forward", "forward": "backward", "backward": "optimizer"}.get(phase)
        marks["start"] = record_function(following) if following else None
        if marks["start"] is not None:
            marks["start"].__enter__()

    plain = train_step_fn(model, x, target)
    step = train_step_fn(model, x, target, between)

    def marked():
        step()
        if marks["start"] is not None:  # the optimizer's mark ends with the step
            marks["start"].__exit__(None, None, None)
            marks["start"] = None

    for _ in range(args.warmup):
        plain()
        marked()

    # pass 1: CUDA activity only
    keep = (lambda suffix: os.path.join(args.keep_traces, f"{args.model}_{name.replace(' ', '')}_{suffix}.json.gz")
            if args.keep_traces else None)
    events = run_profiled(plain, args.steps, [ProfilerActivity.CUDA], keep("pass1"))
    quiet = split_steps(with_gaps(gpu_activities(events)))[1:]  # the first step starts from an idle GPU
    for acts in quiet:
        launch_intervals(acts)
    # pass 2: with CPU operators, Python stacks and modules, for the labels
    events = run_profiled(marked, 2, [ProfilerActivity.CPU, ProfilerActivity.CUDA], keep("pass2"), with_stack=True,
                          with_modules=True)
    labelled = gpu_activities(events)
    host_context(events, labelled)
    labelled = split_steps(with_gaps(labelled))[-1]
    del events
    unmatched = [match_labels(acts, labelled) for acts in quiet]
    for acts in quiet:
        for a in acts:
            a["kind"] = kind_of(a["name"])
            a["phase_op"] = f"{a['phase']}: {a['op']}"
            a["phase_where"] = f"{a['phase']}: {a['where']}"
    summary = gap_summary(quiet)
    row = {"variant": name, **summary, "unlabelled": statistics.median(unmatched),
           "host_late_by_op": by_label(quiet, "phase_op", "host_late", args.top),
           "host_late_by_where": by_label(quiet, "phase_where", "host_late", args.top),
           "queued_by_kind": by_label(quiet, "kind", "queued", args.top),
           "host_by_phase": by_label(quiet, "phase", "host_us", 6),
           "host_by_where": by_label(quiet, "phase_where", "host_us", args.top),
           "copies": sorted({(a["name"][:90], a["phase_where"], a["op"], round(a["end"] - a["ts"], 2))
                             for a in quiet[0] if a["category"] != "kernel" or "copy" in a["name"]
                             or "elementwise" in a["name"]}, key=lambda c: -c[3]),
           "inventory": inventory(quiet)}
    if args.host_profile:
        row["host_profile"] = host_profile(plain, 3, args.top)
    return row


def print_row(row: dict, show_inventory: bool = False) -> None:
    ms = 1e-3
    print(f"\n== {row['variant']}: loop {row['loop_ms']:.2f} ms a step without a profiler; in pass 1 a step took "
          f"{row['period_us'] * ms:.2f} ms: {row['busy_us'] * ms:.2f} busy, {row['idle_us'] * ms:.2f} idle "
          f"({row['host_late_us'] * ms:.2f} waiting for the host to launch, {row['queued_us'] * ms:.2f} launched and "
          f"queued); {row['activities']:.0f} GPU activities a step ({row['without_launch']:.0f} without a launch "
          f"call in the trace); the host issued a step's launches over {row['launch_span_us'] * ms:.2f} ms; labels "
          f"unmatched: {row['unlabelled']:.0f} a step")
    for title, key in (("idle waiting for the host, by launching operator", "host_late_by_op"),
                             ("idle waiting for the host, by module or autograd node", "host_late_by_where"),
                             ("idle with the kernel launched (queued), by kind", "queued_by_kind"),
                             ("host time between launches, by phase", "host_by_phase"),
                             ("host time between launches, by module or autograd node", "host_by_where")):
        print(f"  {title} (µs a step, activities a step):")
        for label, us, count in row[key]:
            print(f"    {us:9.1f} {count:5d}  {label[:150]}")
    print("  copies, memsets and elementwise kernels of one step (µs each):")
    for name, where, op, us in row["copies"][:25]:
        print(f"    {us:8.2f}  {name[:70]:<70}  {op[:40]:<40}  {where[:90]}")
    if show_inventory:
        print("  every GPU activity of a step, by phase, launching operator and kernel (a step: count, busy µs, idle "
              "µs before them):")
        for r in row["inventory"]:
            print(f"    {r['count']:4.0f} {r['busy_us']:9.1f} {r['idle_us']:7.1f}  {r['phase']:<9} {r['op'][:45]:<45} "
                  f"{r['kernel']}")
    if row.get("host_profile"):
        print("  host functions with the most own time, GPU asleep (ms a step: own, cumulative; calls a step):")
    for entry in row.get("host_profile", ()):
        print(f"    {entry['own_ms']:8.3f} {entry['cumulative_ms']:8.3f} {entry['calls']:7.0f}  "
              f"{entry['function'][:130]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_arguments(p, "mobilenet_v1", compile_option=False)
    p.add_argument("--variants", nargs="+", default=["fused"], choices=["eager", "fused"])
    p.add_argument("--compile", action="store_true", help="torch.compile of the plain model as a variant too")
    p.add_argument("--host-profile", action="store_true", help="pass 3: cProfile of the step, GPU asleep")
    p.add_argument("--steps", type=int, default=6, help="back-to-back steps in pass 1 (the first is left out)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--repeats", type=int, default=10, help="samples of 5 back-to-back steps for the loop time")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--inventory", action="store_true", help="print every kind of GPU activity of a step")
    p.add_argument("--keep-traces", default=None, metavar="DIR", help="write each pass's Chrome trace there, gzipped")
    args = p.parse_args()
    _, x, target, variants = setup(args.model, args.batch, with_compile=args.compile)
    names = list(args.variants) + (["torch.compile"] if args.compile else [])
    out = {**run_header(args), "rows": []}
    print(f"{args.model}, batch {args.batch}, training step, bf16 autocast, channels_last ({out['gpu']}, torch "
          f"{out['torch']}, cuDNN {out['cudnn']})", flush=True)
    # every variant's loop timed before any profiler runs (profiler state that outlives a profile can slow the host:
    # docs/benchmarks.md, "Every variant timed before any is profiled"); each phase builds the variant afresh
    loops = {}
    for name in names:
        model = variants[name]().train()
        loops[name] = loop_ms(model, x, target, args)
        print(f"{name}: loop {loops[name]:.2f} ms", flush=True)
        del model
        torch.cuda.empty_cache()
    for name in names:
        model = variants[name]().train()
        try:
            row = {"loop_ms": loops[name], **measure(name, model, x, target, args)}
        except Exception as error:  # noqa: BLE001 — a variant that fails is reported, not fatal
            row = {"variant": name, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
            print(f"\n== {name}: {row['error']}", flush=True)
        else:
            print_row(row, args.inventory)
        out["rows"].append(row)
        del model
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
