"""Engine policies: how each fused layer's cuDNN plans are chosen, globally or per module.

    EnginePolicy()                                      heuristic: cuDNN's first buildable candidate (the default)
    EnginePolicy("autotune")                            time every candidate once per configuration, the ATen
                                                        composition included, and keep the fastest
    EnginePolicy("pinned", engines={"forward": "eng0_k..."})  the named engine (or {"forward": 3}: the 4th candidate of
                                                        torch_cudnn_fusion.engines()), for reproducibility
    EnginePolicy(deterministic=True)                    only engines without cuDNN's NONDETERMINISTIC note
    EnginePolicy(workspace_limit=1 << 20)               only engines needing at most that many workspace bytes

Modes combine with the two limits. The policy is part of every plan's cache key. torch.use_deterministic_algorithms
(True) makes every policy deterministic. Global: set_engine_policy() / engine_policy() / the environment variable
TORCH_CUDNN_FUSION_POLICY (heuristic, autotune or deterministic); per module: the `policy` argument or attribute.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional, Union

from . import _extension
from ._compile import constant_under_compile
from ._cpp_enums import Graph, PolicyMode

MODES = tuple(mode.name.lower() for mode in PolicyMode)
GRAPHS = tuple(graph.name.lower() for graph in Graph)


@dataclass(frozen=True)
class EnginePolicy:
    """How a layer's cuDNN plans are chosen (see the module docstring). Hashable; equal policies share plans."""

    mode: str = "heuristic"
    engines: Union[Mapping[str, Union[int, str]], tuple] = field(default=())
    deterministic: bool = False
    workspace_limit: Optional[int] = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        engines = dict(self.engines)
        for graph, engine in engines.items():
            if graph not in GRAPHS:
                raise ValueError(f"engines keys must be graph names {GRAPHS}, got {graph!r}")
            if isinstance(engine, bool) or not isinstance(engine, (int, str)) or (isinstance(engine, int) and engine < 0):
                raise ValueError(f"engines[{graph!r}] must be an engine name such as 'eng0_k24=1' or a candidate index "
                                 f">= 0 (see torch_cudnn_fusion.engines()), got {engine!r}")
        if self.mode == "pinned" and not engines:
            raise ValueError("mode='pinned' needs engines, e.g. engines={'forward': 'eng0_k24=1'} (names and indices "
                             "as torch_cudnn_fusion.engines() lists them)")
        if self.mode != "pinned" and engines:
            raise ValueError(f"engines are pinned only with mode='pinned', got mode={self.mode!r}")
        if self.workspace_limit is not None and (isinstance(self.workspace_limit, bool)
                                                 or not isinstance(self.workspace_limit, int)
                                                 or self.workspace_limit < 0):
            raise ValueError(f"workspace_limit must be None or a number of bytes >= 0, got {self.workspace_limit!r}")
        object.__setattr__(self, "engines", tuple(sorted(engines.items())))
        object.__setattr__(self, "deterministic", bool(self.deterministic))

    @property
    def key(self) -> tuple:
        """The policy as a tuple of constants (what decisions and torch.compile's traced code hold)."""
        return (self.mode, self.engines, self.deterministic, self.workspace_limit)

    def __str__(self) -> str:
        parts = [self.mode]
        parts += [f"{graph}={engine}" for graph, engine in self.engines]
        if self.deterministic:
            parts.append("deterministic")
        if self.workspace_limit is not None:
            parts.append(f"workspace <= {self.workspace_limit} B")
        return ", ".join(parts)


HEURISTIC = EnginePolicy()


def _from_environment() -> EnginePolicy:
    value = os.environ.get("TORCH_CUDNN_FUSION_POLICY", "").strip()
    if value in ("", "heuristic"):
        return HEURISTIC
    if value == "autotune":
        return EnginePolicy("autotune")
    if value == "deterministic":
        return EnginePolicy(deterministic=True)
    raise ValueError(f"TORCH_CUDNN_FUSION_POLICY must be 'heuristic', 'autotune' or 'deterministic', got {value!r}")


_global_policy = _from_environment()


def _as_policy(policy: Union[EnginePolicy, str, None]) -> EnginePolicy:
    if policy is None:
        return HEURISTIC
    if isinstance(policy, str):
        return EnginePolicy(policy)
    if not isinstance(policy, EnginePolicy):
        raise TypeError(f"policy must be an EnginePolicy, a mode name {MODES} or None, got {type(policy).__name__}")
    return policy


def set_engine_policy(policy: Union[EnginePolicy, str, None]) -> None:
    """The policy of every layer whose own `policy` is None."""
    global _global_policy
    _global_policy = _as_policy(policy)


def get_engine_policy() -> EnginePolicy:
    return _global_policy


@contextlib.contextmanager
def engine_policy(policy: Union[EnginePolicy, str, None]) -> Iterator[EnginePolicy]:
    """Within the block, `policy` is the global engine policy."""
    previous = _global_policy
    set_engine_policy(policy)
    try:
        yield _global_policy
    finally:
        set_engine_policy(previous)


def resolve(policy: Optional[EnginePolicy]) -> EnginePolicy:
    """A layer's own policy, or the global one."""
    return _global_policy if policy is None else policy


# Tuning under torch.backends.cudnn.benchmark, for every policy (part of every plan's key):
# - a plan's first run times the heuristic's first BENCHMARK_CANDIDATES candidates. The heuristic ranks them, and its
#   first choice measured up to 1.7x slower than another of its top 8 on H200; taking the first few bounds the cost of
#   a layer's first run. Timing every candidate is what the autotune policy is for.
# - the graphs in ATEN_TIMED_UNDER_BENCHMARK are timed against their ATen composition too, not only under autotune:
#   on H200 the BatchNorm backward graph took about 0.8 ms at 7x7 and 14x14 feature maps (batch 256) where ATen's
#   kernel took far less, and was faster at 56x56 and above. (It runs only for a BatchNorm with no activation: with
#   ReLU/ReLU6 the backward is our kernel, csrc/kernels/batch_norm_backward_kernel.cu.)
# - the graphs in HEURISTIC_ONLY_UNDER_BENCHMARK time the heuristic's first candidate alone. The BatchNorm forward
#   graph is itself a candidate, timed against our kernel on each shape's first call (ops/bn_ops.h,
#   BatchNormForwardChoice). With the choice and 8 candidates, mobilenet_v2's first step under benchmark took 72.4 s
#   against 19.5 s without the choice (H100, batch 256; docs/benchmarks.md 2026-12-07f): 19 BatchNorm shapes, each
#   graph's plan tuned. With one candidate it took 25.2 s against 19.9 s without the choice, in one call (H100,
#   2026-12-07g; plans built 45 in 6.6 s against 26 in 3.5 s, tuning 7.3 s against 6.2). The graph then ran its
#   layers at the graph's own listed time (160 channels 7x7: 12.4 us chosen, 12.5 the graph); whether a tuned plan
#   would run them faster is not measured.
#
# Without torch.backends.cudnn.benchmark (PyTorch's default), in the heuristic policy, where nothing is timed:
# - the graphs in ATEN_WITHOUT_BENCHMARK leave their work to their ATen composition, eager's own kernels, and no
#   plan is built for them. The BatchNorm backward graph's first heuristic candidate took 31.1 and 31.8 us at
#   mobilenet_v2's 64- and 96-channel 14x14 layers and 22.8 at 320 channels 7x7, where eager's kernels took 16.0, 20.4
#   and 18.6 (batch 256, bf16, channels_last, CUDA-graph replays; H100, docs/benchmarks.md 2026-12-07h). It was
#   faster at 56x56 (87.7 against 123.5 us on the stream, timed with the forward on a side stream, so each call
#   also waited across streams; not re-timed on one stream): left to ATen it is eager's there too. With ATen's kernels
#   the op took eager's time at all six such layers, within 1.5 us (on one stream; H100, 2026-12-07j). Under
#   benchmark it is timed.
BENCHMARK_CANDIDATES = 8
ATEN_TIMED_UNDER_BENCHMARK = (Graph.BATCHNORM_BACKWARD,)
HEURISTIC_ONLY_UNDER_BENCHMARK = (Graph.BATCHNORM_FORWARD,)
ATEN_WITHOUT_BENCHMARK = (Graph.BATCHNORM_BACKWARD,)


def _set_benchmark_tuning() -> None:
    _extension.require().set_benchmark_tuning(BENCHMARK_CANDIDATES,
                                              [int(graph) for graph in ATEN_TIMED_UNDER_BENCHMARK],
                                              [int(graph) for graph in HEURISTIC_ONLY_UNDER_BENCHMARK],
                                              [int(graph) for graph in ATEN_WITHOUT_BENCHMARK])


_extension.call_when_loaded(_set_benchmark_tuning)

_ids: dict[tuple, int] = {HEURISTIC.key: 0}


@constant_under_compile
def policy_id(key: tuple) -> int:
    """The id the C++ ops take for the policy whose `key` this is (registered once)."""
    found = _ids.get(key)
    if found is None:
        mode, engines, deterministic, workspace_limit = key
        pinned = {graph: (f"#{engine}" if isinstance(engine, int) else engine) for graph, engine in engines}
        found = _extension.require().register_policy(int(PolicyMode[mode.upper()]), deterministic,
                                                     -1 if workspace_limit is None else workspace_limit, pinned)
        _ids[key] = found
    return found
