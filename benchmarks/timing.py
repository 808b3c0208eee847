"""CUDA-event timing shared by the benchmark scripts."""

from __future__ import annotations

import statistics

import torch


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


def median_ms(fn, warmup: int = 5, repeats: int = 20) -> float:
    """Median of `repeats` CUDA-event timings of one `fn()` call (host cost included), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)
