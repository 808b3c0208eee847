"""engines(): the candidate plans cuDNN offers for a fused conv layer's graph, each with its engine, knobs,
behaviour notes, workspace and, on request, its measured time; the eager composition is listed as one more
candidate."""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .._cpp_enums import CONV_ACTIVATION_NAMES, Activation
from .. import _extension
from ..ops.conv import conv_padding, eager_activation, int_pair
from ..ops.decide import SUPPORTED_DTYPES
from ..ops.library import conv_output_size
from ..policy import EnginePolicy, policy_id, resolve

GRAPHS = ("forward", "relu_bias_backward", "dgrad", "wgrad")
EAGER = "eager (PyTorch ops)"


@dataclass(frozen=True)
class EngineCandidate:
    index: Optional[int]  # position in cuDNN's heuristic list; None for the eager composition
    name: str  # "eng<id>_k<knob>=<choice>..." as cuDNN names the plan, or EAGER
    behaviour_notes: tuple[str, ...] = ()
    workspace_bytes: int = 0
    error: str = ""  # why the candidate does not build
    median_ms: Optional[float] = None
    heuristic_choice: bool = False  # the plan the default (heuristic) policy runs
    build_seconds: Optional[float] = None  # the time its build took or failed in (what tuning pays a candidate)

    @property
    def engine_id(self) -> Optional[int]:
        match = re.match(r"eng(\d+)", self.name)
        return int(match.group(1)) if match else None


class EngineTable(list):
    """A list of EngineCandidate that prints as a table; `refusal` is set when cuDNN refused the whole graph,
    `runs_instead` when the layer never runs this graph (ReLU's backward in our NHWC kernel, ReLU6's backward): what
    runs instead, and no cuDNN candidate is listed."""

    refusal: str = ""
    runs_instead: str = ""

    def __str__(self) -> str:
        lines = [f"cuDNN refused the graph: {self.refusal}"] if self.refusal else []
        if self.runs_instead:
            lines.append(f"No cuDNN graph runs here: {self.runs_instead}")
        lines.append(f"{'#':>3}  {'engine / knobs':<40} {'workspace':>12} {'median ms':>10} {'build ms':>9}  notes")
        for c in self:
            index = "" if c.index is None else str(c.index)
            mark = "*" if c.heuristic_choice else " "
            time = "" if c.median_ms is None else f"{c.median_ms:.4f}"
            notes = c.error or ", ".join(c.behaviour_notes)
            build = "" if c.build_seconds is None else f"{c.build_seconds * 1e3:.2f}"
            lines.append(f"{index:>3}{mark} {c.name or '-':<40} {c.workspace_bytes:>12} {time:>10} {build:>9}  {notes}")
        lines.append("* the heuristic's choice (what the default policy runs)")
        return "\n".join(lines)


def _median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def _eager_candidate(graph, x_shape, w_shape, stride, pre, post, dilation, groups, dtype, memory_format, bias,
                     residual, activation, repeats) -> float:
    """Median time of what eager PyTorch runs for the same step, on random data."""
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=memory_format)

    x, w = rand(*x_shape), rand(*w_shape)
    padded = F.pad(x, (pre[1], post[1], pre[0], post[0]))  # explicit padding covers 'same' with an even kernel
    y_shape = conv_output_size(x_shape, w_shape, stride, pre, post, dilation)
    b = torch.randn(w_shape[0], device="cuda", dtype=dtype) if bias else None
    r = rand(*y_shape) if residual else None
    g = rand(*y_shape)
    saved_y = torch.relu(rand(*y_shape))  # the forward output the ReLU mask comes from

    def forward():
        y = F.conv2d(padded, w, b, stride, 0, dilation, groups)
        return eager_activation(y + r if r is not None else y, activation)

    steps = {
        "forward": forward,
        "relu_bias_backward": lambda: (torch.ops.aten.hardtanh_backward(g, saved_y, 0, 6)
                                       if activation == Activation.RELU6
                                       else torch.ops.aten.threshold_backward(g, saved_y, 0)).sum((0, 2, 3)),
        "dgrad": lambda: torch.ops.aten.convolution_backward(g, padded, w, None, stride, [0, 0], dilation, False,
                                                             [0, 0], groups, [True, False, False]),
        "wgrad": lambda: torch.ops.aten.convolution_backward(g, padded, w, None, stride, [0, 0], dilation, False,
                                                             [0, 0], groups, [False, True, False]),
    }
    with torch.no_grad():
        return _median_ms(steps[graph], repeats)


def engines(
    x_shape: Sequence[int],
    weight_shape: Sequence[int],
    *,
    stride: Union[int, Sequence[int]] = 1,
    padding: Union[str, int, Sequence[int]] = 0,
    dilation: Union[int, Sequence[int]] = 1,
    groups: int = 1,
    dtype: torch.dtype = torch.bfloat16,
    channels_last: bool = True,
    bias: bool = True,
    residual: bool = False,
    activation: Optional[str] = "relu",
    graph: str = "forward",
    time: bool = False,
    repeats: int = 10,
    device: Union[int, str, torch.device, None] = None,
    policy: Optional[EnginePolicy] = None,
) -> EngineTable:
    """Every plan cuDNN's heuristics offer for `graph` ("forward", "relu_bias_backward", "dgrad" or "wgrad") of
    the fused conv layer with these shapes, in the heuristic's order, plus the eager composition as one more
    candidate. With time=True each buildable candidate runs `repeats` times on random data (median reported).
    `policy` (default: the global one) applies its deterministic and workspace limits: the candidates they exclude
    are listed with the reason; "nondeterministic" marks candidates with cuDNN's NONDETERMINISTIC note. Names and
    indices are what EnginePolicy("pinned", engines={graph: ...}) takes."""
    if graph not in GRAPHS:
        raise ValueError(f"graph must be one of {GRAPHS}, got {graph!r}")
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype must be float16, bfloat16 or float32, got {dtype}")
    if len(x_shape) != 4 or len(weight_shape) != 4:
        raise ValueError(f"x_shape and weight_shape must have 4 values each, got {list(x_shape)} and "
                         f"{list(weight_shape)}")
    if x_shape[1] != weight_shape[1] * groups:
        raise ValueError(f"x has {x_shape[1]} channels but weight of shape {list(weight_shape)} with groups={groups} "
                         f"expects {weight_shape[1] * groups}")
    act = int(Activation.from_name(activation, CONV_ACTIVATION_NAMES))
    stride_, dilation_ = int_pair(stride, "stride", 1), int_pair(dilation, "dilation", 1)
    pre, post = conv_padding(padding, weight_shape[2:], dilation_, stride_)
    module = _extension.require()
    cuda = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    listing = module.list_engines(graph, SUPPORTED_DTYPES[dtype], channels_last, cuda.index, list(x_shape),
                                  list(weight_shape), list(stride_), list(pre), list(post), list(dilation_), groups,
                                  bias, residual, act, time, repeats, policy_id(resolve(policy).key))
    table = EngineTable(
        EngineCandidate(row["index"], row["name"], tuple(row["behaviour_notes"]), row["workspace_bytes"],
                        row["error"], row["median_ms"], row["index"] == listing["heuristic_choice"],
                        row["build_seconds"])
        for row in listing["candidates"]
    )
    table.refusal = listing["refusal"]
    table.runs_instead = listing["runs_instead"]
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    with torch.cuda.device(cuda):
        eager_ms = (_eager_candidate(graph, x_shape, weight_shape, stride_, pre, post, dilation_, groups, dtype,
                                     memory_format, bias, residual, act, repeats) if time else None)
    table.append(EngineCandidate(None, EAGER, median_ms=eager_ms))
    return table
