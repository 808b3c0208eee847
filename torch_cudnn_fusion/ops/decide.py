"""What to fuse: the decision for one conv layer configuration, its recorded reason, and strict mode.

A layer runs as cuDNN graphs only when every rule below holds and cuDNN builds the plan; otherwise it runs the
eager composition and its `FusionStatus` says why. With strict mode the same reason is raised as `FusionError`.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch._prims_common import suggest_memory_format

from .. import _extension
from .._compile import constant_under_compile
from ..policy import policy_id

_SUPPORTED_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
STEM_CHANNELS = 4  # a conv with at most this many input channels (an image's) is a stem: see _policy_reason
TRACED = -1  # stands for the sizes of an input torch.compile traces: its plans are chosen when the code runs
_strict = os.environ.get("TORCH_CUDNN_FUSION_STRICT", "0") not in ("", "0", "false", "False")


class FusionError(RuntimeError):
    """Raised in strict mode when a layer cannot run fused; the message names the requirement that failed."""


@dataclass(frozen=True)
class FusionStatus:
    """How a fused layer last ran.

    fused: the forward runs as one cuDNN graph. reason: why not, when it does not (for a fused layer, a note, if
    any). backward: for each fused backward step, "" when it runs fused or the reason it runs in ATen:
    "relu_bias_backward" (ReLU backward with the bias-gradient reduction: our kernel for NHWC, a cuDNN graph
    otherwise), "dgrad" and "wgrad" (cuDNN graphs).
    """

    fused: bool
    reason: str = ""
    backward: tuple[tuple[str, str], ...] = ()
    # "cudnn_graph", "cudnn_legacy" (the legacy cuDNN BatchNorm API) or "eager"; "" derives it from `fused`
    implementation_name: str = ""

    @property
    def implementation(self) -> str:
        if self.implementation_name:
            return self.implementation_name
        return "cudnn_graph" if self.fused else "eager"

    def __str__(self) -> str:
        if not self.fused:
            return f"eager: {self.reason}"
        if self.implementation == "cudnn_legacy":
            return f"fused (legacy cuDNN BatchNorm API): {self.reason}"
        parts = [f"{name} {'fused' if not why else 'eager (' + why + ')'}" for name, why in self.backward]
        note = f" ({self.reason})" if self.reason else ""
        return f"fused (cuDNN graph){note}" + (f"; backward: {', '.join(parts)}" if parts else "")


NOT_RUN = FusionStatus(False, "not run yet: the decision is made on the first forward, from the input")


def set_strict(enabled: bool) -> None:
    """Global strict mode: a layer that cannot run fused raises FusionError instead of running eager."""
    global _strict
    _strict = bool(enabled)


def is_strict() -> bool:
    return _strict


@contextlib.contextmanager
def strict(enabled: bool = True) -> Iterator[None]:
    previous = _strict
    set_strict(enabled)
    try:
        yield
    finally:
        set_strict(previous)


def _alignment(t: Optional[torch.Tensor], memory_format: torch.memory_format) -> int:
    """Pointer alignment (bytes, capped at 16) of the tensor the op will hand cuDNN."""
    if t is None:
        return 0
    if torch.compiler.is_compiling() or not t.is_contiguous(memory_format=memory_format):
        return 16  # a fresh allocation (the op's own contiguous copy, or the caching allocator under compile)
    address = t.data_ptr()
    alignment = 16
    while alignment > 1 and address % alignment:
        alignment //= 2
    return alignment


def layer_config(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, relu,
                 padding_mode: str, policy: tuple) -> tuple:
    """Everything the decision depends on, as a hashable tuple of Python constants."""
    from .library import conv_memory_format

    memory_format = conv_memory_format(x, weight)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias, residual)
    )
    return (
        x.device.type,
        x.device.index if x.device.index is not None else -1,
        x.dtype,
        memory_format == torch.channels_last,
        # Under torch.compile sizes may be symbolic, and traced code cannot tell: the plan is chosen at run time.
        (TRACED,) * 4 if torch.compiler.is_compiling() else tuple(x.shape),
        tuple(weight.shape),  # parameters keep static shapes under torch.compile
        tuple(stride),
        tuple(padding_pre),
        tuple(padding_post),
        tuple(dilation),
        groups,
        bias is not None,
        residual is not None,
        relu,
        needs_grad,
        padding_mode,
        torch.backends.cudnn.allow_tf32,
        tuple(_alignment(t, memory_format) for t in (x, weight, bias, residual)),
        policy,  # EnginePolicy.key
        torch.are_deterministic_algorithms_enabled(),  # makes every policy deterministic (a different plan key)
    )


def _policy_reason(config: tuple) -> str:
    """The rules decided in Python, before cuDNN is asked. '' when the layer may be fused."""
    (device_type, _, dtype, _, x_size, w_size, _, _, _, _, groups, _, _, _, _, padding_mode, _, _, policy,
     _) = config
    if padding_mode != "zeros":
        return f"padding_mode='{padding_mode}': cuDNN graphs pad with zeros only"
    if dtype not in _SUPPORTED_DTYPES:
        return f"dtype {dtype}: cuDNN's fused engines take float16, bfloat16 or float32"
    if policy[0] != "autotune":  # these rules come from timings: autotune times the layer's own plans and eager
        if groups > 1:
            return (f"groups={groups}: cuDNN's fused grouped/depthwise convolution ran 6-9x slower than PyTorch's own "
                    "kernel (measured on H200), so eager is used (EnginePolicy('autotune') times it instead)")
        in_channels, out_channels = w_size[1] * groups, w_size[0]
        # A stem's few input channels (an image's 3) are exempt: cuDNN pads them, and the stems measured ran faster
        # fused than eager (benchmarks/results/stem_h100_2026-11-22.txt, docs/fallback_rules.md).
        odd_in = in_channels % 8 and in_channels > STEM_CHANNELS
        if dtype in (torch.float16, torch.bfloat16) and (odd_in or out_channels % 8):
            return (f"in_channels={in_channels}, out_channels={out_channels}: not both multiples of 8; for {dtype} "
                    "such layers ran 1.5x slower fused than eager, so eager is used (EnginePolicy('autotune') times "
                    "it instead)")
        if dtype == torch.float32 and (in_channels % 4 or out_channels % 4):
            return (f"in_channels={in_channels}, out_channels={out_channels}: cuDNN's fused float32 engines need "
                    "multiples of 4")
    if device_type != "cuda":
        return f"x is on {device_type}: the fused path runs on CUDA tensors"
    return ""


TRACED_NOTE = ("under torch.compile: plans are built when the compiled code first runs each size; a size cuDNN "
               "refuses then runs in ATen, counted in plan_cache_stats()['runtime_fallbacks']")


@functools.lru_cache(maxsize=4096)
def _decide(config: tuple) -> tuple:
    """(fused, reason, backward refusals) for a configuration; cached, as is the C++ plan cache behind it."""
    reason = _policy_reason(config)
    if reason:
        return False, reason, ()
    module = _extension.load()
    if module is None:
        return False, _extension.load_error() or "the cuDNN extension is unavailable", ()
    (_, device, dtype, channels_last, x_size, w_size, stride, pad_pre, pad_post, dilation, groups, has_bias,
     has_residual, relu, needs_grad, _, _, alignment, policy, _) = config
    if TRACED in x_size:
        return True, TRACED_NOTE, ()
    if x_size[0] == 0:
        return True, "", ()  # an empty batch: the ops return empty outputs (zero weight gradients) without cuDNN
    refusals = module.check_conv_layer(
        _SUPPORTED_DTYPES[dtype], channels_last, device, list(x_size), list(w_size), list(stride), list(pad_pre),
        list(pad_post), list(dilation), groups, has_bias, has_residual, relu, needs_grad, list(alignment),
        policy_id(policy),
    )
    if refusals["forward"]:
        return False, refusals["forward"], ()
    backward = tuple((name, refusals[name]) for name in ("relu_bias_backward", "dgrad", "wgrad") if name in refusals)
    return True, "", backward


# The last decision of each layer, with the configuration it was made for, by layer id. Recorded inside the
# function torch.compile folds to a constant, so a compiled layer reports the decision its compiled graph keeps
# (compiled code runs no Python).
_decisions_by_layer: dict[int, tuple[tuple, tuple]] = {}


@constant_under_compile
def decide_and_record(layer_id: int, config: tuple) -> tuple:
    decision = _decide(config)
    _decisions_by_layer[layer_id] = (decision, config)
    return decision


def recorded_decision(layer_id: int) -> Optional[tuple]:
    recorded = _decisions_by_layer.get(layer_id)
    return None if recorded is None else recorded[0]


def recorded_config(layer_id: int) -> Optional[tuple]:
    """The configuration (see layer_config) of the layer's last decision."""
    recorded = _decisions_by_layer.get(layer_id)
    return None if recorded is None else recorded[1]


def plan_in_use(config: tuple, graph: str = "forward") -> Optional[dict]:
    """What the C++ plan cache runs for one graph of a conv layer configuration (see layer_config): cuDNN's name of
    the plan, its workspace, whether it was tuned, the autotune times and whether ATen won; None where there is no
    plan to ask about (not CUDA, traced sizes, empty batch)."""
    (device_type, device, dtype, channels_last, x_size, w_size, stride, pre, post, dilation, groups, has_bias,
     has_residual, relu, _, _, _, alignment, policy, _) = config
    if device_type != "cuda" or TRACED in x_size or x_size[0] == 0 or dtype not in _SUPPORTED_DTYPES:
        return None
    module = _extension.load()
    if module is None:
        return None
    return module.plan_in_use(graph, _SUPPORTED_DTYPES[dtype], channels_last, device, list(x_size), list(w_size),
                              list(stride), list(pre), list(post), list(dilation), groups, has_bias, has_residual,
                              relu, _graph_alignment(graph, alignment), policy_id(policy))


def _graph_alignment(graph: str, alignment: tuple) -> list:
    """The operand alignments of `graph`'s key, as the ops build it (gradients and outputs are fresh: 16 bytes)."""
    x, w = alignment[0], alignment[1]
    return {"forward": list(alignment) + [16], "relu_bias_backward": [16, 16, 16, 16, 0],
            "dgrad": [16, w, 16, 0, 0], "wgrad": [16, x, 16, 0, 0]}[graph]


def autotune_note(info: Optional[dict]) -> str:
    """'autotune: ...' when autotune timed the plan against ATen, '' otherwise."""
    if not info or info.get("aten_ms") is None:
        return ""
    best = info.get("tuned_ms")
    best_text = f"{best:.4f} ms" if best is not None else "none ran"
    if info["aten_faster"]:
        return (f"autotune: the ATen composition ({info['aten_ms']:.4f} ms) beat the fastest cuDNN plan ({best_text}), "
                "so it runs in ATen")
    return f"autotune: the cuDNN plan {info['name']} ({best_text}) beat the ATen composition ({info['aten_ms']:.4f} ms)"


def status_from_decision(decision: Optional[tuple], config: Optional[tuple] = None) -> FusionStatus:
    """The status of a decision; for a fused conv layer under autotune, with what autotune measured (config given)."""
    if decision is None:
        return NOT_RUN
    if len(decision) == 4:  # a BatchNorm decision: (fused, reason, backward, implementation)
        return FusionStatus(*decision)
    fused, reason, backward = decision
    if fused and config and len(config) == 20 and config[18][0] == "autotune":
        note = autotune_note(plan_in_use(config))
        if note.startswith("autotune: the ATen"):
            return FusionStatus(False, note, backward, "eager")
        if note:
            reason = f"{reason}; {note}" if reason else note
    return FusionStatus(fused, reason, backward)


# ---- BatchNorm (+ residual) (+ ReLU / ReLU6) in training ----

ACTIVATIONS = {None: 0, "identity": 0, "relu": 1, "relu6": 2}
GRAPH, LEGACY = 0, 1  # the C++ op's implementation argument


def batch_norm_config(x, running_stats: bool, residual, activation: str, eps: float, weight,
                      policy: tuple) -> tuple:
    """Everything a BatchNorm layer's decision depends on, as a hashable tuple."""
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, residual, weight)
    )
    return (
        x.device.type,
        x.device.index if x.device.index is not None else -1,
        x.dtype,
        x.dim() == 4 and suggest_memory_format(x) == torch.channels_last,
        (TRACED,) * 4 if torch.compiler.is_compiling() else tuple(x.shape),
        running_stats,
        residual is not None,
        ACTIVATIONS[activation],
        float(eps),
        needs_grad,
        policy,
        torch.are_deterministic_algorithms_enabled(),
    )


@functools.lru_cache(maxsize=4096)
def decide_batch_norm(config: tuple) -> tuple:
    """(fused, reason, backward, implementation) for BatchNorm in training: the cuDNN graph when cuDNN builds its
    forward (and backward, when gradients are needed), else the legacy cuDNN BatchNorm API, else eager."""
    (device_type, device, dtype, channels_last, x_size, running_stats, has_residual, activation, eps, needs_grad,
     policy, _) = config
    if device_type != "cuda":
        return False, f"x is on {device_type}: the fused path runs on CUDA tensors", (), "eager"
    if dtype not in _SUPPORTED_DTYPES:
        return False, f"dtype {dtype}: cuDNN's BatchNorm takes float16, bfloat16 or float32", (), "eager"
    if len(x_size) != 4:
        return False, f"x is {len(x_size)}-D: the fused BatchNorm takes 4-D [N, C, H, W] input", (), "eager"
    if not channels_last:
        return (False, "x is not channels_last: cuDNN's fused BatchNorm kernels are NHWC (use "
                "x.to(memory_format=torch.channels_last))", (), "eager")
    module = _extension.load()
    if module is None:
        return False, _extension.load_error() or "the cuDNN extension is unavailable", (), "eager"
    if TRACED in x_size:
        return True, TRACED_NOTE, (), "cudnn_graph"
    if x_size[0] * x_size[2] * x_size[3] <= 1:
        return False, "one value per channel: batch statistics are undefined (eager raises the error)", (), "eager"
    refusals = module.check_batch_norm_layer(
        _SUPPORTED_DTYPES[dtype], channels_last, device, list(x_size), running_stats, has_residual, activation, eps,
        policy_id(policy),
    )
    graph_refusal = refusals["graph_forward"] or (refusals["graph_backward"] if needs_grad else "")
    if not graph_refusal:
        return True, "", (), "cudnn_graph"
    if not refusals["legacy"]:
        return True, f"the cuDNN graph was refused: {graph_refusal}", (), "cudnn_legacy"
    return False, f"{graph_refusal}; and {refusals['legacy']}", (), "eager"


@constant_under_compile
def decide_batch_norm_and_record(layer_id: int, config: tuple) -> tuple:
    decision = decide_batch_norm(config)
    _decisions_by_layer[layer_id] = (decision, config)
    return decision


def record_decision(layer_id: int, decision: tuple, config: tuple = ()) -> None:
    """Record a decision made outside decide_* (e.g. eval-mode BatchNorm, which runs eager)."""
    _decisions_by_layer[layer_id] = (decision, config)


def raise_if_strict(decision: tuple, strict_override: Optional[bool], where: str) -> None:
    strict_now = _strict if strict_override is None else strict_override
    if not strict_now:
        return
    fused, reason, backward = decision[:3]
    if not fused:
        raise FusionError(f"{where} cannot run fused: {reason}")
    refused = [f"{name}: {why}" for name, why in backward if why]
    if refused:
        raise FusionError(f"{where} cannot run its backward fused: " + "; ".join(refused))


def clear_decisions() -> None:
    """Forget cached decisions (the C++ plan cache is cleared separately)."""
    from .functional import _last_bn_call, _last_call, _last_conv_bn_call

    _decide.cache_clear()
    decide_batch_norm.cache_clear()
    _last_call.clear()
    _last_bn_call.clear()
    _last_conv_bn_call.clear()
