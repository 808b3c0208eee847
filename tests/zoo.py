"""The model zoo the fuse() tests sweep: every torchvision classification model with a BatchNorm2d, and the smallest
variant of each timm family users train conv nets from. Shared by test_model_zoo.py (CPU) and
test_model_zoo_gpu.py (GPU)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import warnings
from typing import Callable
from unittest import mock

import pytest
import torch
from torch import nn

# timm: the smallest variant of each family the issue names (resnet, resnext, efficientnet, mobilenet v1/v2/v3,
# regnet, cspdarknet), plus the ones users reported (resnet50d, regnety_008)
TIMM_MODELS = ["resnet18", "resnet50d", "resnext26ts", "efficientnet_b0", "mobilenetv1_100", "mobilenetv2_035",
               "mobilenetv3_small_050", "regnetx_002", "regnety_002", "regnety_008", "cspdarknet53",
               # more conv families, for fuse()'s structure: convs called from a forward that is not traced
               # (ghostnet's root), Conv2d subclasses (tf_efficientnet's Conv2dSame), multi-resolution branches (hrnet),
               # blocks with squeeze-and-excitation variants (rexnet, ese_vovnet, lcnet), convs into cat (mixnet, dpn)
               "ghostnet_100", "hrnet_w18_small", "rexnet_100", "repvgg_a0", "efficientnetv2_rw_t", "tinynet_e",
               "lcnet_050", "dla34", "ese_vovnet19b_dw", "mixnet_s", "dpn48b", "skresnet18", "tf_efficientnet_b0"]
# one model of each torchvision and timm family: the GPU zoo tests' default set, and benchmarks/zoo_speed.py's
FAMILIES = ["torchvision:resnet18", "torchvision:resnet50", "torchvision:resnext50_32x4d", "torchvision:regnet_x_400mf",
            "torchvision:regnet_y_400mf", "torchvision:mobilenet_v2", "torchvision:mobilenet_v3_small",
            "torchvision:efficientnet_b0", "torchvision:densenet121", "torchvision:googlenet",
            "torchvision:mnasnet0_5", "torchvision:shufflenet_v2_x0_5", "torchvision:vgg11_bn",
            "timm:resnet50d", "timm:resnext26ts", "timm:efficientnet_b0", "timm:mobilenetv1_100",
            "timm:mobilenetv2_035", "timm:mobilenetv3_small_050", "timm:regnetx_002", "timm:regnety_008",
            "timm:cspdarknet53"]
# inputs smaller than these fail in the model itself (inception's auxiliary head, maxvit's windows)
INPUT_SIZE = {"inception_v3": 299, "maxvit_t": 224}
DEFAULT_INPUT_SIZE = 64


def require(name: str):
    """The module, or a skip; with TCF_REQUIRE_MODEL_ZOO=1 (CI sets it) a missing one is an error instead."""
    if os.environ.get("TCF_REQUIRE_MODEL_ZOO") == "1":
        return importlib.import_module(name)
    return pytest.importorskip(name)


@contextlib.contextmanager
def _no_init():
    """Builds a model without initializing its weights (torch.nn.init's functions do nothing): for listing only."""
    with contextlib.ExitStack() as stack:
        for name in dir(nn.init):
            if name.endswith("_") and not name.startswith("_"):
                stack.enter_context(mock.patch.object(nn.init, name, lambda t, *args, **kwargs: t))
        yield


@functools.lru_cache(maxsize=None)
def torchvision_models() -> list[str]:
    """Every classification model of torchvision.models that holds a BatchNorm2d (built on the meta device, or
    without initializing its weights where that fails, only to look)."""
    torchvision = require("torchvision")
    names = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in torchvision.models.list_models(module=torchvision.models):
            try:
                with torch.device("meta"):
                    model = torchvision.models.get_model(name, num_classes=10)
            except Exception:  # noqa: BLE001 — some builders compute on tensors (regnet): build for real
                with _no_init():
                    model = torchvision.models.get_model(name, num_classes=10)
            if any(isinstance(m, nn.BatchNorm2d) for m in model.modules()):
                names.append(name)
    return names


def zoo_ids() -> list[str]:
    return [f"torchvision:{n}" for n in torchvision_models()] + [f"timm:{n}" for n in TIMM_MODELS]


def builder(model_id: str) -> tuple[Callable[[], nn.Module], int]:
    """(a function building the model with random weights and 10 classes, its input size)."""
    library, name = model_id.split(":")
    if library == "torchvision":
        torchvision = require("torchvision")
        return (lambda: torchvision.models.get_model(name, num_classes=10)), INPUT_SIZE.get(name, DEFAULT_INPUT_SIZE)
    timm = require("timm")
    return (lambda: timm.create_model(name, num_classes=10)), DEFAULT_INPUT_SIZE


def outputs(out) -> list[torch.Tensor]:
    """The tensors of a model's output (googlenet and inception return named tuples in training)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for t in out if isinstance(t, torch.Tensor)]


def module_classes(model: nn.Module) -> dict[str, type]:
    return {path: type(m) for path, m in model.named_modules()}


def conv_count(model: nn.Module) -> int:
    return sum(isinstance(m, nn.Conv2d) for m in model.modules())


def global_rel(values: list[torch.Tensor], references: list[torch.Tensor]) -> float:
    """The norm of all differences over the norm of all references, in float64: a whole model's gradient error
    (the GPU zoo test's and benchmarks/eager_float32_spread.py's)."""
    difference = sum(((v.double() - r.double()) ** 2).sum() for v, r in zip(values, references))
    norm = sum((r.double() ** 2).sum() for r in references)
    return (difference.sqrt() / norm.sqrt().clamp_min(1e-30)).item()
