"""fusion_report: for every fused layer of a model, whether it ran fused and, if not, why."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .fusion import FusionStatus


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
    from .nn.conv import FusedConv2d

    return FusionReport(
        FusionReportRow(path or "(root)", type(m).__name__, m.fusion_status)
        for path, m in model.named_modules()
        if isinstance(m, FusedConv2d)
    )
