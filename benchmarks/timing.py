"""CUDA-event timing shared by the benchmark scripts, and the host's time a call."""

from __future__ import annotations

import statistics
import time

import torch

# A sleep kernel's length in clock cycles (torch.cuda._sleep), about 0.3 s at an H100's clock: queued before a step,
# it holds the GPU busy for longer than any step here takes the host to issue, so no call in the step waits on the GPU.
SLEEP_CYCLES = 600_000_000


def graph_replay_ms(fn, calls: int = 10, replays: int = 11) -> float:
    """GPU time per call of `fn()` with no host cost: `calls` calls captured in one CUDA graph, the median of
    `replays` replays. Warms up (plans built and tuned) outside the capture first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls)
    return statistics.median(samples)


def stream_ms(fn, calls: int = 20, repeats: int = 11, sleep_cycles: int = 40_000_000) -> float:
    """GPU time per call of `fn()` as a training step's stream runs it: `calls` calls issued back to back behind a
    sleep kernel of `sleep_cycles` (about 20 ms on an H100), which outlasts the host's time to issue them, so that
    the host's cost is not timed; CUDA events around the calls, the median of `repeats` samples, after 3 warm-up
    calls. Unlike graph_replay_ms, every kernel is launched as eager launches it, one after another on the stream."""
    samples = interleaved_samples_ms({"fn": fn}, warmup=3, repeats=repeats, calls=calls, sleep_cycles=sleep_cycles)
    return statistics.median(samples["fn"])


def median_ms(fn, warmup: int = 5, repeats: int = 20) -> float:
    """Median of `repeats` CUDA-event timings of one `fn()` call (host cost included), after `warmup` calls."""
    return interleaved_median_ms({"fn": fn}, warmup=warmup, repeats=repeats)["fn"]


def interleaved_median_ms(fns: dict, warmup: int = 5, repeats: int = 30, calls: int = 1) -> dict:
    """Medians like median_ms for several functions compared with one another, their samples taken in turn (one of
    each per round), so that a drift of the host's or the GPU's speed during the run weighs on all of them alike.
    calls > 1: each sample times `calls` back-to-back calls (the host runs ahead, as in a training loop) and is
    divided by `calls`."""
    return {name: statistics.median(values) for name, values in interleaved_samples_ms(fns, warmup, repeats,
                                                                                        calls).items()}


def interleaved_samples_ms(fns: dict, warmup: int = 5, repeats: int = 30, calls: int = 1,
                           sleep_cycles: int = 0) -> dict:
    """The samples behind interleaved_median_ms: name -> `repeats` milliseconds per call. sleep_cycles > 0: each
    sample's calls wait behind a sleep kernel of that many cycles (see stream_ms)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if sleep_cycles > 0:
                torch.cuda._sleep(sleep_cycles)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / calls)
    return samples


def quartiles(values: list) -> tuple[float, float, float]:
    """(25th percentile, median, 75th percentile)."""
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def host_us(fn, calls: int = 300, repeats: int = 5, warmup: int = 1, cuda: bool = True) -> float:
    """The host's microseconds a call of `fn()`: the median over `repeats` samples of `calls` back-to-back calls, after
    `warmup` calls. cuda: wait for the GPU before the first sample and after each (outside the timed span)."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        if cuda:
            torch.cuda.synchronize()
    return statistics.median(samples)
