from .mobilenet_v1 import MobileNetV1, mobilenet_v1

__all__ = ["MobileNetV1", "mobilenet_v1"]
