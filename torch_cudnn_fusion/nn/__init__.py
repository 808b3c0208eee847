from .batchnorm import ActivationFused, BatchNorm2dFused, BatchNorm2dReLU
from .conv import Conv2dAddReLU, Conv2dReLU, FusedConv2d
from .conv_bn import Conv2dBN, Conv2dBNAddReLU, Conv2dBNReLU
from .pool import GlobalAvgPool2d
from .squeeze_excite import SqueezeExcite

__all__ = [
    "ActivationFused",
    "BatchNorm2dFused",
    "BatchNorm2dReLU",
    "Conv2dAddReLU",
    "Conv2dBN",
    "Conv2dBNAddReLU",
    "Conv2dBNReLU",
    "Conv2dReLU",
    "FusedConv2d",
    "GlobalAvgPool2d",
    "SqueezeExcite",
]
