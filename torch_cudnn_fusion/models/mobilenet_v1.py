"""MobileNet v1 (Howard et al., 2017, arXiv:1704.04861): a 3x3 stride-2 stem, 13 depthwise-separable blocks
(3x3 depthwise conv + BN + ReLU, then 1x1 pointwise conv + BN + ReLU), global average pooling and a classifier.

Plain PyTorch modules (nn.Conv2d, nn.BatchNorm2d, nn.ReLU): torch_cudnn_fusion.fuse() turns it into fused layers.
"""

from __future__ import annotations

from torch import nn

# (output channels, stride) of the 13 depthwise-separable blocks, Table 1 of the paper.
BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1), (512, 1),
          (512, 1), (1024, 2), (1024, 1))


def scaled_channels(channels: int, width_multiplier: float, divisor: int = 8) -> int:
    """channels * width_multiplier, rounded to a multiple of `divisor` (8: what tensor cores and cuDNN's fused
    engines want for half precision) and never below it; exact for width_multiplier=1."""
    scaled = max(divisor, int(channels * width_multiplier + divisor / 2) // divisor * divisor)
    if scaled < 0.9 * channels * width_multiplier:
        scaled += divisor
    return scaled


def conv_bn_relu(in_channels: int, out_channels: int, kernel_size: int, stride: int, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(inplace=True),
    )


class DepthwiseSeparable(nn.Sequential):
    """3x3 depthwise conv + BN + ReLU, then 1x1 pointwise conv + BN + ReLU (children 0-5)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__(*conv_bn_relu(in_channels, in_channels, 3, stride, groups=in_channels),
                         *conv_bn_relu(in_channels, out_channels, 1, 1))


class MobileNetV1(nn.Module):
    def __init__(self, num_classes: int = 1000, width_multiplier: float = 1.0, in_channels: int = 3,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if width_multiplier <= 0:
            raise ValueError(f"width_multiplier must be > 0, got {width_multiplier}")
        channels = scaled_channels(32, width_multiplier)
        layers: list[nn.Module] = [conv_bn_relu(in_channels, channels, 3, 2)]
        for out, stride in BLOCKS:
            out = scaled_channels(out, width_multiplier)
            layers.append(DepthwiseSeparable(channels, out, stride))
            channels = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.features(x)
        x = self.pool(x).flatten(1)
        return self.classifier(self.dropout(x))


def mobilenet_v1(num_classes: int = 1000, width_multiplier: float = 1.0, **kwargs) -> MobileNetV1:
    return MobileNetV1(num_classes=num_classes, width_multiplier=width_multiplier, **kwargs)
