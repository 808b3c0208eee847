"""benchmarks/profile_by_kind.py's model names (no GPU needed): ours, a torchvision name, and library:name as
zoo_speed.py takes it, so a timm family can be profiled by kind."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import profile_by_kind  # noqa: E402


@pytest.mark.parametrize("name, module", [("mobilenet_v1", "torch_cudnn_fusion."), ("resnet18", "torchvision."),
                                          ("torchvision:resnet18", "torchvision."), ("timm:resnet18", "timm.")])
def test_load_model_takes_ours_a_torchvision_name_and_library_colon_name(name, module):
    if module == "timm.":
        pytest.importorskip("timm")
    if module == "torchvision.":
        pytest.importorskip("torchvision")
    model = profile_by_kind.load_model(name)
    assert type(model).__module__.startswith(module), type(model)
