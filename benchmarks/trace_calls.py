"""CUDA runtime and driver calls in a torch.profiler chrome trace, split by whether the GPU was busy when each call
began (a kernel, memset or copy running on it then): calls and median microseconds per API name. Reads the traces
the device runs wrote (benchmarks/results/trace_*.json.gz); needs no GPU.

    python benchmarks/trace_calls.py benchmarks/results/trace_regnet_y_400mf_fused_h100_2026-11-27c.json.gz [...]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import statistics

GPU_WORK = ("kernel", "gpu_memset", "gpu_memcpy")
API_CALLS = ("cuda_runtime", "cuda_driver")


def busy_intervals(events: list) -> list[list[float]]:
    """The GPU's busy spans, merged, in trace microseconds."""
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e.get("cat") in GPU_WORK)
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def calls_by_state(events: list) -> dict:
    """API name -> {True: durations of the calls that began while the GPU was busy, False: the others}."""
    merged = busy_intervals(events)
    starts = [span[0] for span in merged]

    def busy(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and merged[i][1] > t

    by_name: dict = collections.defaultdict(lambda: {True: [], False: []})
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in API_CALLS:
            by_name[e["name"]][busy(e["ts"])].append(e["dur"])
    return by_name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+")
    p.add_argument("--top", type=int, default=10)
    args = p.parse_args()
    for path in args.traces:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        print(path)
        print(f"  {'API call':<34}{'GPU busy: calls x median us':>30}{'GPU idle: calls x median us':>30}")
        rows = sorted(calls_by_state(events).items(), key=lambda kv: -sum(kv[1][True]) - sum(kv[1][False]))
        for name, by_state in rows[:args.top]:
            cells = [f"{len(d):>10} x {statistics.median(d):8.1f}" if d else f"{'-':>21}"
                     for d in (by_state[True], by_state[False])]
            print(f"  {name[:34]:<34}" + "".join(f"{c:>30}" for c in cells))


if __name__ == "__main__":
    main()
