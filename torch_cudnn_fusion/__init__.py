"""torch_cudnn_fusion: convolution layers as fused cuDNN graphs (conv + bias (+ residual) + ReLU), as drop-in
nn.Modules, with an honest record of what ran fused and why not."""

from __future__ import annotations

from . import _extension
from .diagnostics.report import Explanation, ExplainRow, FusionReport, FusionReportRow, explain, fusion_report
from .diagnostics.engines import EngineCandidate, EngineTable, engines
from .ops import batch_norm_act, conv2d_bias_act
from .ops.decide import FusionError, FusionStatus, is_strict, set_strict, strict
from .diagnostics.plan_file import PlanFileWarning, load_plan_cache, save_plan_cache
from .policy import EnginePolicy, engine_policy, get_engine_policy, set_engine_policy
from .nn import (BatchNorm2dReLU, Conv2dAddReLU, Conv2dBN, Conv2dBNAddReLU, Conv2dBNReLU, Conv2dReLU,
                 FusedConv2d, SqueezeExcite)
from .fx.rewrite import FuseReport, FuseRow, fuse

from ._version import __version__


def is_available() -> bool:
    """True when the cuDNN extension is loaded (building it on first use if needed) and a GPU is present."""
    return _extension.load() is not None


def unavailable_reason() -> str | None:
    """Why is_available() is False, or None."""
    _extension.load()
    return _extension.load_error()


def plan_cache_stats() -> dict:
    """Counters of the C++ plan cache: entries, capacity, hits, misses, builds, refusals, evictions,
    build_seconds, tuned (plans tuned under autotune or torch.backends.cudnn.benchmark), tune_seconds (the time their
    tuning took: building the candidates and timing them), runtime_fallbacks, last_runtime_fallback."""
    return _extension.require().plan_cache_stats()


def clear_plan_cache() -> None:
    """Drop every cached plan (and zero the counters), and every depthwise wgrad and BatchNorm forward choice timed
    under torch.backends.cudnn.benchmark. Layers keep their decisions; a plan they need again is rebuilt, and a choice
    timed again, on their next call."""
    _extension.require().clear_plan_cache()


def depthwise_wgrad_choices() -> list[dict]:
    """The depthwise weight gradients chosen under torch.backends.cudnn.benchmark, one dict per device, shape and
    dtypes: x_size, stride, padding, dtype, dw_dtype, choice ("plan 0", "plan 1" or "plan 2": our kernels' plans;
    "pytorch": PyTorch's wgrad) and ms (the medians timed for plans 0, 1, 2 and PyTorch's; negative: did not run, as
    plan 2 on the shapes where it has no kernel of its own).
    Empty without benchmark, under deterministic algorithms, or before the first backward."""
    return _extension.require().depthwise_wgrad_choices()


def batch_norm_forward_choices() -> list[dict]:
    """The training BatchNorm forwards chosen under torch.backends.cudnn.benchmark where a layer runs our kernel (its
    decision's implementation "batch_norm_kernel"), one dict per device, shape, dtype, activation (its code, 0 for
    none), residual, running_stats and in_place (the running statistics updated by the op): choice
    ("batch_norm_kernel" or "cudnn_graph", the one that runs) and ms (the medians timed for ours and the graph's;
    negative: did not run, as the graph where cuDNN refused it). Neither is the faster on every shape: ours on large
    layers, the graph on many 7x7 and 14x14 ones (docs/engines_and_policies.md).
    Empty without benchmark, under deterministic algorithms, or before the first training forward."""
    return _extension.require().batch_norm_forward_choices()


def set_plan_cache_capacity(capacity: int) -> None:
    """Bound the plan cache (least recently used plans are evicted); 1024 by default."""
    _extension.require().set_plan_cache_capacity(capacity)


__all__ = [
    "EnginePolicy",
    "PlanFileWarning",
    "engine_policy",
    "get_engine_policy",
    "load_plan_cache",
    "save_plan_cache",
    "set_engine_policy",
    "BatchNorm2dReLU",
    "Conv2dBN",
    "Conv2dBNAddReLU",
    "Conv2dBNReLU",
    "FuseReport",
    "FuseRow",
    "batch_norm_act",
    "fuse",
    "Conv2dAddReLU",
    "EngineCandidate",
    "ExplainRow",
    "Explanation",
    "EngineTable",
    "Conv2dReLU",
    "FusedConv2d",
    "SqueezeExcite",
    "FusionError",
    "FusionReport",
    "FusionReportRow",
    "FusionStatus",
    "batch_norm_forward_choices",
    "clear_plan_cache",
    "conv2d_bias_act",
    "depthwise_wgrad_choices",
    "engines",
    "explain",
    "fusion_report",
    "is_available",
    "is_strict",
    "plan_cache_stats",
    "set_plan_cache_capacity",
    "set_strict",
    "strict",
    "unavailable_reason",
]
