"""benchmarks/profile_gaps.py's trace analysis on a synthetic Chrome trace (no GPU needed): idle time split into the
host's lateness and queueing, steps cut at the marker kernels, launches labelled by what launched them, and pass 1's
kernels labelled from pass 2's through the aligned name sequences."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import profile_gaps  # noqa: E402


def span(category, name, ts, dur, tid=1, correlation=None, pid=0):
    event = {"ph": "X", "cat": category, "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": pid}
    if correlation is not None:
        event["args"] = {"correlation": correlation}
    return event


def launched(name, launch_ts, start, dur, correlation, tid=1):
    """A runtime launch call at launch_ts (1 µs long) and its kernel from start to start + dur on stream 7."""
    return [span("cuda_runtime", "cudaLaunchKernel", launch_ts, 1, tid=tid, correlation=correlation),
            span("kernel", name, start, dur, tid=7, pid=1, correlation=correlation)]


def two_steps():
    """Two steps, each a marker then kernels a and b. Step 1: a starts 2 µs after the marker, launched before;
    b's launch comes 30 µs after a ended. Step 2: b, launched early, starts 3 µs after a ended."""
    events = []
    events += launched(profile_gaps.MARKER, 0, 1, 1, 1)
    events += launched("a", 1, 4, 10, 2)           # queued 2 µs after the marker ended at 2
    events += launched("b", 44, 45, 5, 3)          # a ended at 14, launch at 44: 30 µs host late, then 1 queued
    events += launched(profile_gaps.MARKER, 46, 52, 1, 4)  # b ended at 50: 2 µs queued (launched at 46)
    events += launched("a", 47, 53, 10, 5)
    events += launched("b", 48, 66, 5, 6)          # a ended at 63: 3 µs queued
    return events


def test_idle_time_is_split_into_host_late_and_queued():
    activities = profile_gaps.with_gaps(profile_gaps.gpu_activities(two_steps()))
    by_start = {a["ts"]: a for a in activities}
    assert by_start[4.0]["idle"] == 2.0 and by_start[4.0]["host_late"] == 0.0
    b = by_start[45.0]
    assert b["idle"] == 31.0 and b["host_late"] == 30.0 and b["queued"] == 1.0
    assert by_start[66.0]["queued"] == 3.0 and by_start[66.0]["host_late"] == 0.0


def test_steps_are_cut_at_the_markers_and_keep_the_idle_time_before_them():
    steps = profile_gaps.split_steps(profile_gaps.with_gaps(profile_gaps.gpu_activities(two_steps())))
    assert [[a["name"] for a in step] for step in steps] == [["a", "b"], ["a", "b"]]
    # step 2's first kernel carries the 2 µs idle before its marker (b ended at 50, marker at 52), the marker's 1 µs
    # and its own 0 µs gap
    first = steps[1][0]
    assert first["idle"] == 2.0 and first["busy"] == 11.0
    summary = profile_gaps.gap_summary(steps[1:])
    assert summary["period_us"] == pytest.approx(2.0 + 11.0 + 3.0 + 5.0)
    assert summary["activities"] == 2 and summary["without_launch"] == 0


def test_a_launch_takes_its_labels_from_the_host_events_around_it():
    events = [span("user_annotation", "forward", 0, 100),
              span("python_function", "nn.Module: Conv2d_0", 1, 50),
              span("cpu_op", "aten::conv2d", 2, 20),
              span("cpu_op", "aten::cudnn_convolution", 3, 10),
              span("cpu_op", "autograd::engine::evaluate_function: ConvBackward", 200, 50, tid=2),
              span("cpu_op", "aten::copy_", 210, 10, tid=2)]
    events += launched("conv", 5, 8, 5, 1)
    events += launched("copy", 212, 214, 2, 2, tid=2)
    events += launched("late", 300, 301, 1, 3)  # no host event around it
    activities = profile_gaps.gpu_activities(events)
    profile_gaps.host_context(events, activities)
    labels = {a["name"]: (a["phase"], a["where"], a["op"]) for a in activities}
    assert labels["conv"] == ("forward", "nn.Module: Conv2d_0", "aten::cudnn_convolution")
    assert labels["copy"] == ("backward", "ConvBackward", "aten::copy_")
    assert labels["late"] == ("other", "?", "?")


def test_pass_one_kernels_take_the_labels_of_the_same_kernels_in_pass_two():
    acts = [{"name": n} for n in ("cast", "conv", "bn", "copy")]
    labelled = [{"name": n, "op": f"op {n}", "where": f"where {n}", "phase": "forward"}
                for n in ("cast", "conv", "extra", "bn", "copy")]
    assert profile_gaps.match_labels(acts, labelled) == 0
    assert [a["op"] for a in acts] == ["op cast", "op conv", "op bn", "op copy"]
    missing = [{"name": n} for n in ("cast", "other")]
    assert profile_gaps.match_labels(missing, labelled) == 1
    assert missing[1]["op"] == "?"
