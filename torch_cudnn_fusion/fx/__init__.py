"""fuse(model): the rewrite of a model's Conv2d / BatchNorm2d / activation patterns into fused modules."""

from .rewrite import FuseReport, FuseRow, fuse

__all__ = ["FuseReport", "FuseRow", "fuse"]
