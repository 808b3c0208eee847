"""What to fuse: the configuration a decision depends on, the decision with its reason, and strict mode.

A layer runs as cuDNN graphs only when the extension's verdict on its configuration is empty (csrc/core/
requirements.cpp states every requirement, the measured ones included) and cuDNN builds the plans; otherwise it runs
the eager composition and its `FusionStatus` says why. Python adds only what is Python's: the device, the dtype,
`padding_mode`, strict mode. With strict mode the reason is raised as `FusionError`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Optional

import torch
from torch._prims_common import suggest_memory_format

from .. import _extension
from .._compile import constant_under_compile
from .._cpp_enums import Activation
from ..policy import policy_id
from .library import conv_memory_format, conv_output_size

SUPPORTED_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
TRACED = -1  # stands for the sizes of an input torch.compile traces: its plans are chosen when the code runs
_strict = os.environ.get("TORCH_CUDNN_FUSION_STRICT", "0") not in ("", "0", "false", "False")


class FusionError(RuntimeError):
    """Raised in strict mode when a layer cannot run fused; the message names the requirement that failed."""


class Decision(NamedTuple):
    """How a layer runs its calls. fused: as the cuDNN op; reason: why not (or a note); backward: (graph, refusal)
    per fused backward step, "" where it runs fused; implementation: "cudnn_graph", "cudnn_legacy" (the legacy cuDNN
    BatchNorm API), "batch_norm_kernel" (BatchNorm's forward in our NHWC kernel, or the cuDNN graph's where
    cudnn.benchmark timed that faster: tcf.batch_norm_forward_choices()), "depthwise_kernel" (our NHWC
    depthwise kernels where they were faster, PyTorch's elsewhere: the reason says which), "squeeze_excite_op" (a
    squeeze-and-excitation block as one op of ATen's kernels) or "eager"."""

    fused: bool
    reason: str = ""
    backward: tuple[tuple[str, str], ...] = ()
    implementation: str = ""

    @classmethod
    def eager(cls, reason: str) -> "Decision":
        return cls(False, reason, (), "eager")


class ConvConfig(NamedTuple):
    """Everything a conv layer's decision (and its plans' keys) depends on: Python constants, hashable."""

    device_type: str
    device_index: int
    dtype: torch.dtype
    channels_last: bool
    x_size: tuple[int, ...]  # (TRACED,) * 4 under torch.compile: the plan is chosen when the code runs
    w_size: tuple[int, ...]
    stride: tuple[int, int]
    padding_pre: tuple[int, int]
    padding_post: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    has_bias: bool
    has_residual: bool
    activation: int  # an Activation value: 0 identity, 1 ReLU, 2 ReLU6
    needs_grad: bool
    padding_mode: str
    allow_tf32: bool
    alignment: tuple[int, int, int, int]  # bytes, capped at 16, of x, weight, bias, residual (0: absent)
    policy: tuple  # EnginePolicy.key
    deterministic: bool  # torch.use_deterministic_algorithms: makes every policy deterministic (another plan key)


class BatchNormConfig(NamedTuple):
    """Everything a training BatchNorm layer's decision depends on."""

    device_type: str
    device_index: int
    dtype: torch.dtype
    channels_last: bool
    x_size: tuple[int, ...]
    running_stats: bool
    has_residual: bool
    activation: Activation
    eps: float
    needs_grad: bool
    policy: tuple
    deterministic: bool


@dataclass(frozen=True)
class FusionStatus:
    """How a fused layer last ran.

    fused: the forward runs as one cuDNN graph. reason: why not, when it does not (for a fused layer, a note, if
    any). backward: for each fused backward step, "" when it runs fused or the reason it runs in ATen:
    "relu_bias_backward" (ReLU backward with the bias-gradient reduction: our kernel for NHWC, a cuDNN graph
    otherwise), "dgrad" and "wgrad" (cuDNN graphs), "batch_norm_act_backward" (BatchNorm's backward with its
    activation's: our kernel; without an activation, ATen's kernels or a cuDNN graph inside the op).
    """

    fused: bool
    reason: str = ""
    backward: tuple[tuple[str, str], ...] = ()
    # "cudnn_graph", "cudnn_legacy" (the legacy cuDNN BatchNorm API), "batch_norm_kernel" (BatchNorm's forward in
    # our NHWC kernel, or the graph's where cudnn.benchmark timed that faster), "depthwise_kernel" (our NHWC
    # depthwise kernels where they were faster, PyTorch's elsewhere: the reason says which), "squeeze_excite_op" (a
    # squeeze-and-excitation block as one op of ATen's kernels, one autograd node) or "eager"; "" derives it from
    # `fused`
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
        what = {"depthwise_kernel": "depthwise kernels", "batch_norm_kernel": "our BatchNorm kernel",
                "squeeze_excite_op": "one op of ATen's kernels, one autograd node"}.get(self.implementation,
                                                                                     "cuDNN graph")
        return f"fused ({what}){note}" + (f"; backward: {', '.join(parts)}" if parts else "")


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


def raise_if_strict(decision: Decision, strict_override: Optional[bool], where: str) -> None:
    strict_now = _strict if strict_override is None else strict_override
    if not strict_now:
        return
    if not decision.fused:
        raise FusionError(f"{where} cannot run fused: {decision.reason}")
    refused = [f"{name}: {why}" for name, why in decision.backward if why]
    if refused:
        raise FusionError(f"{where} cannot run its backward fused: " + "; ".join(refused))


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


def _sizes(x_size) -> tuple:
    # Under torch.compile sizes may be symbolic, and traced code cannot tell: the plan is chosen at run time.
    return (TRACED,) * len(x_size) if torch.compiler.is_compiling() else tuple(x_size)


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else -1


def conv_config(x, weight, bias, residual, stride, padding_pre, padding_post, dilation, groups, activation: int,
                padding_mode: str, policy: tuple) -> ConvConfig:
    memory_format = conv_memory_format(x, weight)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, residual))
    return ConvConfig(
        x.device.type, _device_index(x.device), x.dtype, memory_format == torch.channels_last, _sizes(x.shape),
        tuple(weight.shape),  # parameters keep static shapes under torch.compile
        tuple(stride), tuple(padding_pre), tuple(padding_post), tuple(dilation), groups, bias is not None,
        residual is not None, int(activation), needs_grad, padding_mode, torch.backends.cudnn.allow_tf32,
        tuple(_alignment(t, memory_format) for t in (x, weight, bias, residual)), policy,
        torch.are_deterministic_algorithms_enabled(),
    )


def batch_norm_config(device: torch.device, dtype: torch.dtype, channels_last: bool, x_size, running_stats: bool,
                      has_residual: bool, activation: Activation, eps: float, needs_grad: bool,
                      policy: tuple) -> BatchNormConfig:
    """The configuration of a BatchNorm over an input of these properties (the conv's output, before it exists,
    for a Conv2dBN* layer)."""
    return BatchNormConfig(device.type, _device_index(device), dtype, channels_last, _sizes(x_size), running_stats,
                           has_residual, activation, float(eps), needs_grad, policy,
                           torch.are_deterministic_algorithms_enabled())


def batch_norm_config_of(x: torch.Tensor, running_stats: bool, residual, activation: Activation, eps: float, weight,
                         policy: tuple) -> BatchNormConfig:
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, residual, weight))
    channels_last = x.dim() == 4 and suggest_memory_format(x) == torch.channels_last
    return batch_norm_config(x.device, x.dtype, channels_last, x.shape, running_stats, residual is not None,
                             activation, eps, needs_grad, policy)


TRACED_NOTE = ("under torch.compile: plans are built when the compiled code first runs each size; a size cuDNN "
               "refuses then runs in ATen, counted in plan_cache_stats()['runtime_fallbacks']")


def _python_reason(device_type: str, dtype: torch.dtype, padding_mode: str = "zeros") -> str:
    """What Python decides before the extension is asked: '' when the layer may be fused."""
    if padding_mode != "zeros":
        return f"padding_mode='{padding_mode}': cuDNN graphs pad with zeros only"
    if dtype not in SUPPORTED_DTYPES:
        return f"dtype {dtype}: cuDNN's fused engines take float16, bfloat16 or float32"
    if device_type != "cuda":
        return f"x is on {device_type}: the fused path runs on CUDA tensors"
    return ""


STEM_KERNELS = range(3, 8)  # the filter sizes the space-to-depth form takes (measured: 3x3 and 7x7)
# The form saves GPU time in proportion to the conv's work and costs the host more per call than the plain fused conv
# (our kernels rearrange x and the filter forward, x again and the filter's gradient backward): a conv of fewer
# multiply-adds a call (N * Ho * Wo * K * C * kh * kw) than this, whose step waits on the host, runs faster plain.
# Set from benchmarks/stem_form_batches.py's crossover (docs/fallback_rules.md, "Stem convs").
STEM_FORM_MIN_MACS = 1e9


def stem_plan(x: torch.Tensor, weight: torch.Tensor, stride, padding_pre, padding_post, dilation, groups: int,
              padding_mode: str, dtype: torch.dtype):
    """The space-to-depth form (ops/stem.py) for a fused conv with these arguments, `dtype` the conv's (autocast's
    where on), or None where it does not take it: a stem conv, stride 2 with 1 to 4 input channels, zero padding on
    both sides of at most half the filter, one group, no dilation, in float16 or bfloat16, channels_last (the form's
    input is; the output's layout is then eager's), on CUDA, of at least STEM_FORM_MIN_MACS multiply-adds."""
    from .stem import plan

    takes = (
        x.device.type == "cuda" and x.dim() == 4 and 1 <= x.shape[1] <= 4 and groups == 1
        and tuple(stride) == (2, 2) and tuple(dilation) == (1, 1) and padding_mode == "zeros"
        and tuple(padding_pre) == tuple(padding_post) and dtype in (torch.float16, torch.bfloat16)
        and all(k in STEM_KERNELS and 2 * p <= k for k, p in zip(weight.shape[2:], padding_pre))
        and conv_memory_format(x, weight) == torch.channels_last
        and _conv_macs(x.shape, weight.shape, padding_pre) >= STEM_FORM_MIN_MACS
    )
    return plan(x.shape, weight.shape, tuple(padding_pre), dtype, x.device) if takes else None


def _conv_macs(x_size, w_size, padding) -> int:
    """A stride-2 conv's multiply-adds a call."""
    out = conv_output_size(x_size, w_size, (2, 2), padding, padding, (1, 1))
    return int(out[0] * out[1] * out[2] * out[3] * w_size[1] * w_size[2] * w_size[3])


def decide_conv(config: ConvConfig) -> Decision:
    """The decision for a conv layer configuration (traced code keeps the decision it traced)."""
    return _decide_conv(tuple(config))


def decide_batch_norm(config: BatchNormConfig) -> Decision:
    """BatchNorm in training: our NHWC kernel for channels_last x; else the cuDNN graph when cuDNN builds its forward
    (and backward, when gradients are needed), else the legacy cuDNN BatchNorm API, else eager."""
    return _decide_batch_norm(tuple(config))


# torch.compile hands a function marked constant its arguments as Python constants, but rebuilds a NamedTuple
# argument without its fields (torch 2.14): the two below take plain tuples.
@constant_under_compile
def _decide_conv(values: tuple) -> Decision:
    config = ConvConfig(*values)
    reason = _python_reason(config.device_type, config.dtype, config.padding_mode)
    if reason:
        return Decision.eager(reason)
    module = _extension.load()
    if module is None:
        return Decision.eager(_extension.load_error())
    if TRACED in config.x_size:
        return Decision(True, TRACED_NOTE, (), "cudnn_graph")
    if config.x_size[0] == 0:
        return Decision(True, "", (), "cudnn_graph")  # an empty batch: empty outputs, zero weight gradients
    c = config
    refusals = module.check_conv_layer(
        SUPPORTED_DTYPES[c.dtype], c.channels_last, c.device_index, list(c.x_size), list(c.w_size), list(c.stride),
        list(c.padding_pre), list(c.padding_post), list(c.dilation), c.groups, c.has_bias, c.has_residual, c.activation,
        c.needs_grad, list(c.alignment), policy_id(c.policy),
    )
    if refusals["forward"]:
        return Decision.eager(refusals["forward"])
    backward = tuple((name, refusals[name]) for name in ("relu_bias_backward", "dgrad", "wgrad") if name in refusals)
    if "depthwise_kernel" in refusals:  # which steps our depthwise kernels run, in C++'s words
        return Decision(True, refusals["depthwise_kernel"], backward, "depthwise_kernel")
    return Decision(True, refusals.get("note", ""), backward, "cudnn_graph")


@constant_under_compile
def depthwise_kernel_steps(in_channels: int, w_size: tuple, stride: tuple, padding: tuple, dilation: tuple,
                           groups: int, channels_last: bool, dtype: torch.dtype,
                           has_epilogue: bool, out_size: tuple) -> tuple[str, str, str]:
    """(forward, dgrad, wgrad): what runs this convolution's forward and wgrad in our NHWC depthwise kernels: "ours",
    "pytorch" or, where out_size (the output's height and width) holds TRACED, "ours_small" (ours for outputs of at
    most the extension's depthwise_small_output rows and columns, PyTorch's beyond); its dgrad: "ours",
    "turned_forward" (PyTorch's forward kernel with the filter turned 180 degrees) or "pytorch" (the rule is C++'s:
    csrc/ops/depthwise_ops.h); PyTorch's for each without the extension or for a dtype it does not take. Takes the
    layer's constants (symmetric padding)."""
    module = _extension.load()
    if module is None or dtype not in SUPPORTED_DTYPES:
        return "pytorch", "pytorch", "pytorch"
    steps = module.depthwise_kernel_verdict(int(in_channels), list(w_size), list(stride), list(padding),
                                            list(dilation), int(groups), bool(channels_last), SUPPORTED_DTYPES[dtype],
                                            bool(has_epilogue), [int(s) for s in out_size])
    return steps["forward"], steps["dgrad"], steps["wgrad"]


@constant_under_compile
def _decide_batch_norm(values: tuple) -> Decision:
    config = BatchNormConfig(*values)
    reason = _python_reason(config.device_type, config.dtype)
    if reason:
        return Decision.eager(reason.replace("fused engines", "BatchNorm"))
    module = _extension.load()
    if module is None:
        return Decision.eager(_extension.load_error())
    unmet = module.batch_norm_layer_verdict(list(config.x_size), config.channels_last)
    if unmet:
        return Decision.eager("; ".join(unmet))
    if TRACED in config.x_size:  # our kernel takes any channels_last size (the verdict checked the layout)
        return Decision(True, TRACED_NOTE, (), "batch_norm_kernel" if config.channels_last else "cudnn_graph")
    # our kernel's verdict first: the graphs are asked only where it refuses (check_batch_norm_layer's kernel_first)
    refusals = module.check_batch_norm_layer(
        SUPPORTED_DTYPES[config.dtype], config.channels_last, config.device_index, list(config.x_size),
        config.running_stats, config.has_residual, int(config.activation), config.eps, policy_id(config.policy),
        kernel_first=True,
    )
    if not refusals["kernel"]:
        # the backward as the graph implementation's: our kernel with the activation's mask folded in, or, without
        # an activation, ATen's kernels or, under cudnn.benchmark or another policy, cuDNN's batchnorm-backward graph
        # (ATen's where cuDNN refuses it, a run-time fallback), all inside the op
        backward = (("batch_norm_act_backward", ""),) if config.needs_grad else ()
        return Decision(True, "", backward, "batch_norm_kernel")
    graph_refusal = refusals["graph_forward"] or (refusals.get("graph_backward", "") if config.needs_grad else "")
    if not graph_refusal:
        # NHWC with an activation: the backward is our kernel, with the activation's mask folded in (C++ builds
        # no BatchNorm backward graph for it and reports none)
        folded = config.needs_grad and "graph_backward" not in refusals
        return Decision(True, "", (("batch_norm_act_backward", ""),) if folded else (), "cudnn_graph")
    if not refusals["legacy"]:
        return Decision(True, f"the cuDNN graph was refused: {graph_refusal}", (), "cudnn_legacy")
    if refusals["legacy"] == graph_refusal:  # one reason for both (SiLU or Hardswish after a residual add)
        return Decision.eager(graph_refusal)
    return Decision.eager(f"{graph_refusal}; and {refusals['legacy']}")


def plan_in_use(config: ConvConfig, graph: str = "forward") -> Optional[dict]:
    """What the C++ plan cache runs for one graph of a conv layer configuration: cuDNN's name of the plan, its
    workspace, whether it was tuned, the autotune times and whether ATen won, whether it runs without cudnn-frontend's
    preparation at each execute (direct_execute); None where there is no plan to ask about (not CUDA, traced sizes,
    empty batch)."""
    c = config
    if c.device_type != "cuda" or TRACED in c.x_size or c.x_size[0] == 0 or c.dtype not in SUPPORTED_DTYPES:
        return None
    module = _extension.load()
    if module is None:
        return None
    return module.plan_in_use(graph, SUPPORTED_DTYPES[c.dtype], c.channels_last, c.device_index, list(c.x_size),
                              list(c.w_size), list(c.stride), list(c.padding_pre), list(c.padding_post),
                              list(c.dilation), c.groups, c.has_bias, c.has_residual, c.activation,
                              _graph_alignment(graph, c.alignment), policy_id(c.policy))


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


def status_of(decision: Optional[Decision], config=None) -> FusionStatus:
    """The status of a decision; for a fused conv layer under autotune, with what autotune measured."""
    if decision is None:
        return NOT_RUN
    fused, reason, backward, implementation = decision
    if fused and implementation == "cudnn_graph" and isinstance(config, ConvConfig) and config.policy[0] == "autotune":
        note = autotune_note(plan_in_use(config))
        if note.startswith("autotune: the ATen"):
            return FusionStatus(False, note, backward, "eager")
        if note:
            reason = f"{reason}; {note}" if reason else note
    return FusionStatus(fused, reason, backward, implementation)
