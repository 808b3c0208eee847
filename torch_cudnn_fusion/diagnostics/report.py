"""fusion_report: for every fused layer of a model, whether it ran fused and, if not, why; explain: the same with
the operations fused, the engine and workspace of the plan that ran, and its time."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from .._cpp_enums import Activation
from ..ops.decide import TRACED, BatchNormConfig, ConvConfig, Decision, FusionStatus, autotune_note, plan_in_use

# The operation a conv graph's activation adds, by ConvConfig.activation.
_ACTIVATION_OPERATION = {Activation.IDENTITY: (), Activation.RELU: ("relu",), Activation.RELU6: ("relu6",)}


class restoring_buffers:  # noqa: N801 — a context manager, named like torch.no_grad
    """Within the block a model's buffers (running statistics, num_batches_tracked) may change; afterwards they hold
    their old values again, in place (so a model sharing them sees the old values too)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.saved = [(b, b.detach().clone()) for b in self.model.buffers()]

    def __exit__(self, *exc) -> None:
        with torch.no_grad():
            for buffer, value in self.saved:
                buffer.copy_(value)


@dataclass(frozen=True)
class FusionReportRow:
    path: str
    module: str
    status: FusionStatus


class FusionReport(list):
    """A list of FusionReportRow that prints as a table."""

    def __str__(self) -> str:
        if not self:
            return "no fused layers"
        width_path = max(len("layer"), *(len(r.path) for r in self))
        width_type = max(len("module"), *(len(r.module) for r in self))
        lines = [f"{'layer':<{width_path}}  {'module':<{width_type}}  status"]
        lines += [f"{r.path:<{width_path}}  {r.module:<{width_type}}  {r.status}" for r in self]
        return "\n".join(lines)


def fusion_report(model: nn.Module) -> FusionReport:
    """One row per fused layer in `model` (in module order), with how its last forward ran."""
    from ..nn.batchnorm import BatchNorm2dReLU
    from ..nn.conv import FusedConv2d

    return FusionReport(
        FusionReportRow(path or "(root)", type(m).__name__, m.fusion_status)
        for path, m in model.named_modules()
        if isinstance(m, (FusedConv2d, BatchNorm2dReLU))
    )


@dataclass(frozen=True)
class ExplainRow:
    path: str
    module: str
    fused: bool
    operations: tuple[str, ...] = ()  # the graph's operations, in order: cuDNN runs all of them with the one plan
    engine: str = ""  # cuDNN's name of the plan in use: engine id and knob choices
    workspace_bytes: int = 0
    autotuned: bool = False  # chosen by timing (torch.backends.cudnn.benchmark) rather than by the heuristic
    median_ms: Optional[float] = None  # the layer's forward on the example input
    reason: str = ""  # why it runs eager, or a note


class Explanation(list):
    """A list of ExplainRow that prints as a table."""

    def __str__(self) -> str:
        lines = [f"{'layer':<16} {'fused operations / fallback reason':<48} {'engine':<34} {'workspace':>10} "
                 f"{'ms':>8}"]
        for r in self:
            time = "" if r.median_ms is None else f"{r.median_ms:.4f}"
            what = " -> ".join(r.operations) if r.fused else f"eager: {r.reason}"
            engine = r.engine + (" (autotuned)" if r.autotuned else "")
            lines.append(f"{r.path:<16} {what:<48} {engine:<34} {r.workspace_bytes:>10} {time:>8}")
            if r.fused and r.reason:
                lines.append(f"{'':<16} note: {r.reason}")
        return "\n".join(lines)


def _median_forward_ms(module: nn.Module, inputs: tuple, repeats: int) -> Optional[float]:
    if not inputs or not inputs[0].is_cuda:
        return None
    with torch.no_grad():
        for _ in range(2):
            module(*inputs)
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            module(*inputs)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def _explain_fused(path: str, module: nn.Module, config: ConvConfig, implementation: str) -> ExplainRow:
    x_size = config.x_size
    operations = ("conv_fprop",) + (("add bias",) if config.has_bias else ())
    operations += (("add residual",) if config.has_residual else ()) + _ACTIVATION_OPERATION[config.activation]
    name = type(module).__name__
    if implementation == "depthwise_kernel":  # no cuDNN plan: our kernel or PyTorch's (the decision's note says)
        return ExplainRow(path, name, True, operations, "our NHWC depthwise kernel or PyTorch's", 0, False)
    if TRACED in x_size:
        return ExplainRow(path, name, True, operations, reason="under torch.compile: the plan is chosen at run time")
    if x_size[0] == 0:
        return ExplainRow(path, name, True, operations, reason="empty batch: nothing ran")
    info = plan_in_use(config)
    if not info["cached"]:
        return ExplainRow(path, name, True, operations, reason="its plan is no longer in the plan cache (evicted or "
                                                                 "cleared): the layer's next call builds it again")
    if info["refusal"]:
        return ExplainRow(path, name, False, reason=info["refusal"])
    note = autotune_note(info)
    if info["aten_faster"]:
        return ExplainRow(path, name, False, reason=note)
    engine = info["name"] + (" (loaded from a plan file)" if info["deserialized"] else "")
    return ExplainRow(path, name, True, operations, engine, info["workspace_bytes"], info["tuned"], reason=note)


def _explain_batch_norm(path: str, module: nn.Module, decision: Decision, config: Optional[BatchNormConfig], inputs,
                        repeats: int):
    """A BatchNorm layer with batch statistics: BatchNorm2dReLU, or a Conv2dBN* in training (whose conv runs inside
    the op, before the fused BatchNorm: our depthwise kernel or PyTorch's own cuDNN call)."""
    from ..nn.conv_bn import Conv2dBN

    fused, reason, _, implementation = decision
    has_residual = config is not None and config.has_residual
    activation = getattr(module, "activation", None)
    operations = ()
    if isinstance(module, Conv2dBN):
        from ..ops.batch_norm import conv_notes

        notes = (["PyTorch's cuDNN call"] if config is None
                 else conv_notes(module, module.weight, config.channels_last, config.dtype, config.x_size))
        operations = ("conv (" + "; ".join(notes) + ")",)
    operations += ("batchnorm (batch statistics, running-statistics update)",)
    operations += (("add residual",) if has_residual else ()) + ((activation,) if activation else ())
    engine = {"cudnn_graph": "cuDNN batchnorm graph", "cudnn_legacy": "legacy cuDNN BatchNorm API",
              "batch_norm_kernel": "our BatchNorm kernel"}.get(
        implementation, "")
    median = _median_forward_ms(module, inputs, repeats) if inputs is not None else None
    return ExplainRow(path, type(module).__name__, fused, operations if fused else (), engine, median_ms=median,
                      reason=reason)


def _explain_squeeze_excite(path: str, module: nn.Module) -> ExplainRow:
    """A squeeze-and-excitation block run as cudnn_fusion::squeeze_excite: its operations, in ATen's kernels."""
    conv1, conv2 = ("1x1 conv as a GEMM" + (" + bias" if conv.bias is not None else "")
                    for conv in (module, module.fc2))
    operations = ("mean over H and W", conv1, module.activation, conv2, module.gate, "multiply x by the gate")
    return ExplainRow(path, type(module).__name__, True, operations, "ATen's kernels in one op, one autograd node")


def explain(model: nn.Module, *example_inputs, time: bool = True, repeats: int = 10) -> Explanation:
    """Runs `model(*example_inputs)` once without gradients and reports, per fused layer: the operations fused in
    its forward graph, the engine and workspace of the plan that ran and (with `time`, on CUDA) the layer's median
    forward time on its input from that run; or the fallback and its reason. BatchNorm layers with batch
    statistics (training mode) are listed with their implementation (cuDNN graph, legacy API or eager). The model's
    buffers (BatchNorm running statistics, num_batches_tracked) are restored afterwards: in training mode the run and
    the timing update them."""
    with restoring_buffers(model):
        return _explain(model, example_inputs, time, repeats)


def _explain(model: nn.Module, example_inputs: tuple, time: bool, repeats: int) -> Explanation:
    from ..nn.batchnorm import BatchNorm2dReLU
    from ..nn.conv import FusedConv2d
    from ..nn.conv_bn import Conv2dBN

    layers = [(path or "(root)", m) for path, m in model.named_modules()
              if isinstance(m, (FusedConv2d, BatchNorm2dReLU))]
    inputs: dict[int, tuple] = {}
    hooks = [m.register_forward_pre_hook(lambda m, args: inputs.__setitem__(id(m), args)) for _, m in layers]
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for hook in hooks:
            hook.remove()
    report = Explanation()
    for path, m in layers:
        batch_norm = isinstance(m, BatchNorm2dReLU) or (isinstance(m, Conv2dBN) and m._call.mode == "batch statistics")
        decision, config = m._call.decision, m._call.config
        if id(m) in inputs and decision is not None and batch_norm:
            report.append(_explain_batch_norm(path, m, decision, config, inputs[id(m)] if time else None, repeats))
            continue
        if id(m) not in inputs or decision is None:
            report.append(ExplainRow(path, type(m).__name__, False, reason="not run by the example input"))
            continue
        fused, reason, _, implementation = decision
        if fused and implementation == "squeeze_excite_op":
            row = _explain_squeeze_excite(path, m)
        elif fused and config is not None:
            row = _explain_fused(path, m, config, implementation)
        else:
            row = ExplainRow(path, type(m).__name__, False, reason=reason)
        if fused and reason:
            row = ExplainRow(**{**row.__dict__, "reason": f"{reason}; {row.reason}" if row.reason else reason})
        if time:
            row = ExplainRow(**{**row.__dict__, "median_ms": _median_forward_ms(m, inputs[id(m)], repeats)})
        report.append(row)
    return report
