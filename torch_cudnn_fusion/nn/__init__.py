from .conv import Conv2dAddReLU, Conv2dReLU, FusedConv2d

__all__ = ["Conv2dReLU", "Conv2dAddReLU", "FusedConv2d"]
