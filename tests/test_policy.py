"""EnginePolicy on the CPU: validation, the global policy, and what a policy changes in a layer's decision."""

import os
import subprocess
import sys

import pytest
import torch

import torch_cudnn_fusion as tcf


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="fastest"), "mode must be one of"),
        (dict(mode="pinned"), "mode='pinned' needs engines"),
        (dict(mode="autotune", engines={"forward": 1}), "engines are pinned only with mode='pinned'"),
        (dict(mode="pinned", engines={"fprop": 1}), "engines keys must be graph names"),
        (dict(mode="pinned", engines={"forward": -1}), "engines['forward'] must be an engine name"),
        (dict(workspace_limit=-5), "workspace_limit must be None or a number of bytes >= 0"),
    ],
)
def test_invalid_policies_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        tcf.EnginePolicy(**kwargs)


def test_policies_are_hashable_values():
    a = tcf.EnginePolicy("pinned", engines={"forward": "eng0_k24=1", "wgrad": 2})
    b = tcf.EnginePolicy("pinned", engines={"wgrad": 2, "forward": "eng0_k24=1"})
    assert a == b and hash(a) == hash(b) and a.key == b.key
    assert str(tcf.EnginePolicy("autotune", deterministic=True, workspace_limit=0)) == (
        "autotune, deterministic, workspace <= 0 B")


def test_global_policy_and_context_manager():
    assert tcf.get_engine_policy() == tcf.EnginePolicy()
    with tcf.engine_policy("autotune") as policy:
        assert policy.mode == "autotune" and tcf.get_engine_policy() is policy
    assert tcf.get_engine_policy() == tcf.EnginePolicy()
    with pytest.raises(TypeError, match="policy must be an EnginePolicy"):
        tcf.set_engine_policy(3)


def test_policy_environment_variable():
    code = "import torch_cudnn_fusion as t; print(t.get_engine_policy())"
    env = dict(os.environ, TORCH_CUDNN_FUSION_POLICY="deterministic")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "heuristic, deterministic"
    env["TORCH_CUDNN_FUSION_POLICY"] = "fast"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "TORCH_CUDNN_FUSION_POLICY must be" in out.stderr


def test_autotune_keeps_the_python_requirements():
    reflect = tcf.Conv2dReLU(8, 8, 3, padding=1, padding_mode="reflect", policy=tcf.EnginePolicy("autotune"))
    reflect(torch.randn(1, 8, 6, 6))
    assert reflect.fusion_status.reason.startswith("padding_mode='reflect'")


def test_module_policy_is_part_of_the_decision_and_survives_pickling():
    import copy

    layer = tcf.Conv2dBNReLU(8, 8, 3, padding=1, policy=tcf.EnginePolicy(deterministic=True))
    clone = copy.deepcopy(layer)
    assert clone.policy == tcf.EnginePolicy(deterministic=True)
    assert set(clone.state_dict()) == set(layer.state_dict())  # the policy is not state
    conv = tcf.Conv2dReLU(8, 8, 3, padding=1, policy=tcf.EnginePolicy(workspace_limit=0))
    conv(torch.randn(1, 8, 6, 6))
    assert conv._call.config.policy == ("heuristic", (), False, 0)


