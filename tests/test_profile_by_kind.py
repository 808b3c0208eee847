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


@pytest.mark.parametrize("asleep", [False, True])
def test_host_ms_queues_a_sleep_kernel_before_each_call_only_when_asleep(monkeypatch, asleep):
    events = []
    monkeypatch.setattr(profile_by_kind.torch.cuda, "synchronize", lambda: events.append("sync"))
    monkeypatch.setattr(profile_by_kind.torch.cuda, "_sleep", lambda cycles: events.append(("sleep", cycles)))
    ms = profile_by_kind.host_ms(lambda: events.append("call"), 3, asleep=asleep)
    before_call = [("sleep", profile_by_kind.SLEEP_CYCLES)] if asleep else []
    assert events == ["sync", *before_call, "call"] * 3 + ["sync"], events
    assert ms >= 0
