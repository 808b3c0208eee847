"""Engine policies (heuristic, autotune, pinned, deterministic, workspace limit) and plan files, on the GPU."""

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops import decide as fusion

from conftest import gpu, rel_err

pytestmark = gpu
CL = torch.channels_last


def _input(*shape, dtype=torch.bfloat16, requires_grad=False):
    return torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=CL).requires_grad_(requires_grad)


def _layer(cls, *args, dtype=torch.bfloat16, **kwargs):
    torch.manual_seed(0)
    return cls(*args, **kwargs).cuda().to(dtype=dtype, memory_format=CL)


def _eager(layer, x):
    return F.relu(F.conv2d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation, layer.groups))


def _usable(table):
    return [c for c in table if c.index is not None and not c.error]


def test_pinned_engine_out_of_range_lists_the_valid_ones(extension):
    layer = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1, policy=tcf.EnginePolicy("pinned", engines={"forward": 999}))
    with pytest.raises(ValueError) as error:
        layer(_input(8, 64, 28, 28))
    message = str(error.value)
    assert "pinned engine '#999'" in message and "Valid choices: #0 eng" in message, message
    valid = _usable(tcf.engines([8, 64, 28, 28], [64, 64, 3, 3], padding=1))
    assert all(c.name in message for c in valid)


def test_pinned_engine_by_name_runs_that_engine(extension):
    table = _usable(tcf.engines([8, 64, 28, 28], [64, 64, 3, 3], padding=1))
    assert len(table) >= 2, str(table)
    chosen = table[1]  # not the heuristic's choice
    policy = tcf.EnginePolicy("pinned", engines={"forward": chosen.name})
    layer = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1, policy=policy)
    x = _input(8, 64, 28, 28)
    y = layer(x)
    assert layer.fusion_status.fused
    assert rel_err(y, _eager(layer, x)) < 1e-2
    row = tcf.explain(nn.Sequential(layer), x, time=False)[0]
    assert row.fused and row.engine == chosen.name, (row, chosen)
    by_index = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1,
                      policy=tcf.EnginePolicy("pinned", engines={"forward": chosen.index}))
    by_index(x)
    assert tcf.explain(nn.Sequential(by_index), x, time=False)[0].engine == chosen.name


def test_autotune_chooses_eager_when_eager_is_faster(extension):
    # A depthwise conv our kernels do not take (7x7): cuDNN's fused graphs ran depthwise convs 6-9x slower than
    # PyTorch's own kernel (FACTS). The heuristic policy sends it to eager by rule; autotune times it and must come to
    # the same answer by measurement.
    tcf.clear_plan_cache()
    layer = _layer(tcf.Conv2dReLU, 512, 512, 7, padding=3, groups=512, policy=tcf.EnginePolicy("autotune"))
    x = _input(64, 512, 14, 14)
    with torch.no_grad():
        y = layer(x)
    status = layer.fusion_status
    assert status.implementation == "eager" and not status.fused, status
    assert status.reason.startswith("autotune: the ATen composition"), status.reason
    assert tcf.plan_cache_stats()["tuned"] >= 1 and tcf.plan_cache_stats()["runtime_fallbacks"] == 0
    assert rel_err(y, _eager(layer, x)) < 1e-2
    row = tcf.explain(nn.Sequential(layer), x, time=False)[0]
    assert not row.fused and row.reason.startswith("autotune: the ATen composition")


def test_autotune_keeps_a_faster_cudnn_plan_and_trains(extension):
    tcf.clear_plan_cache()
    layer = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1, policy=tcf.EnginePolicy("autotune"))
    x = _input(32, 64, 56, 56, requires_grad=True)
    y = layer(x)
    y.backward(torch.randn_like(y))
    status = layer.fusion_status
    # Whichever won is reported with both times; the result matches eager either way.
    assert status.reason.startswith("autotune: the") or "autotune: the" in status.reason, status
    reference = x.detach().clone().requires_grad_()
    y_ref = _eager(layer, reference)
    assert rel_err(y, y_ref) < 1e-2
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()


@pytest.mark.parametrize("graph", ["wgrad", "dgrad"])
def test_deterministic_policy_excludes_nondeterministic_engines(extension, graph):
    # float32: on H200 with cuDNN 9.19 its wgrad and dgrad candidates include engines with the NONDETERMINISTIC
    # note (eng20 and eng25); the bfloat16 and float16 ones had none.
    shape, weight = [32, 64, 56, 56], [64, 64, 3, 3]
    listed = _usable(tcf.engines(shape, weight, padding=1, graph=graph, dtype=torch.float32))
    nondeterministic = {c.name for c in listed if "nondeterministic" in c.behaviour_notes}
    assert nondeterministic, f"no {graph} candidate carries the NONDETERMINISTIC note here: pick another shape"
    deterministic = tcf.EnginePolicy(deterministic=True)
    allowed = _usable(tcf.engines(shape, weight, padding=1, graph=graph, dtype=torch.float32, policy=deterministic))
    assert allowed and not {c.name for c in allowed} & nondeterministic
    layer = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1, dtype=torch.float32, policy=deterministic)
    y = layer(_input(*shape, dtype=torch.float32, requires_grad=True))
    y.backward(torch.ones_like(y))
    assert layer.fusion_status.fused, layer.fusion_status
    info = fusion.plan_in_use(layer._call.config, graph)
    assert not info["refusal"] and info["name"] not in nondeterministic, info


def test_deterministic_gradients_are_bitwise_repeatable(extension):
    policy = tcf.EnginePolicy(deterministic=True)
    layer = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1, dtype=torch.float32, policy=policy)
    x = _input(32, 64, 56, 56, dtype=torch.float32, requires_grad=True)
    g = torch.randn(32, 64, 56, 56, device="cuda").contiguous(memory_format=CL)
    grads = []
    for _ in range(3):
        layer.weight.grad, x.grad = None, None
        layer(x).backward(g)
        grads.append((layer.weight.grad.clone(), x.grad.clone()))
    assert all(torch.equal(grads[0][0], w) and torch.equal(grads[0][1], d) for w, d in grads[1:])


def test_workspace_limit_zero_runs_or_says_why(extension):
    policy = tcf.EnginePolicy(workspace_limit=0)
    layer = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1, policy=policy)
    x = _input(8, 64, 28, 28)
    y = layer(x)
    if layer.fusion_status.fused:
        row = tcf.explain(nn.Sequential(layer), x, time=False)[0]
        assert row.workspace_bytes == 0, row
    else:
        assert "workspace limit 0 bytes" in layer.fusion_status.reason, layer.fusion_status
    assert rel_err(y, _eager(layer, x)) < 1e-2


def _train_step(model, x):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", torch.bfloat16):
        loss = model(x).float().square().mean()
    loss.backward()
    return loss


def _small_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                          nn.Conv2d(64, 64, 1), nn.ReLU())
    return tcf.fuse(model.cuda().to(memory_format=CL))[0]


def test_plan_file_round_trip_skips_building_and_tuning(extension, tmp_path):
    path = tmp_path / "plans.json"
    tcf.clear_plan_cache()
    model = _small_model()
    x = _input(16, 32, 28, 28, dtype=torch.float32)
    with tcf.engine_policy("autotune"):
        _train_step(model, x)
        saved = tcf.save_plan_cache(path)
        stats = tcf.plan_cache_stats()
        assert saved == stats["builds"] and saved > 0
        plans = json.loads(path.read_text())["plans"]
        tcf.clear_plan_cache()
        assert tcf.load_plan_cache(path) == saved
        _train_step(model, x)
        after = tcf.plan_cache_stats()
    assert after["builds"] == 0 and after["tuned"] == 0 and after["tune_seconds"] == 0 and after["misses"] == 0, after
    assert tcf.save_plan_cache(path) == saved  # loaded (deserialized) plans save again
    loaded = [p for p in tcf.explain(model, x, time=False) if p.engine]
    assert loaded and all(row.engine for row in loaded)
    notes = {p["graph"]: p["serialize_note"] or "serialized" for p in plans}
    print("plan file:", saved, "plans;", notes)


def test_plan_file_keys_hold_each_graph_family_s_own_shape(cudnn_benchmark, tmp_path):
    """Saved keys: a conv graph's shape is the conv's (dgrad and wgrad without the forward's epilogue), a BatchNorm's
    its input and activation, the ReLU backward's the conv output y alone (no key dressed up as a 1x1 conv), and every
    policy carries the benchmark tuning policy.py sets. Under cudnn.benchmark, where the BatchNorm graphs are asked
    (its forward choice times the forward graph against our kernel; a BatchNorm without an activation times the
    backward graph against ATen's kernels)."""
    from torch_cudnn_fusion import policy

    tcf.clear_plan_cache()
    model = _small_model()
    _train_step(model, _input(16, 32, 28, 28, dtype=torch.float32))
    # NCHW: not our NHWC kernel, so the ReLU backward's own graph is asked.
    shape = (4, 16, 9, 9)
    grad = torch.randn(*shape, device="cuda")
    y = torch.relu(torch.randn(*shape, device="cuda"))
    dz, dbias = torch.ops.cudnn_fusion.relu_bias_backward(grad, y)
    expected = torch.ops.aten.threshold_backward(grad, y, 0)
    torch.testing.assert_close(dz, expected)
    torch.testing.assert_close(dbias, expected.sum((0, 2, 3)), rtol=1e-5, atol=1e-4)
    # BatchNorm with no activation: its backward is a graph (with one, it is our kernel and no graph is built)
    x = torch.randn(4, 64, 9, 9, device="cuda").contiguous(memory_format=torch.channels_last).requires_grad_()
    w, b = torch.ones(64, device="cuda"), torch.zeros(64, device="cuda")
    torch.ops.cudnn_fusion.batch_norm_act(x, w, b, None, None, None, 0.1, 1e-5, 0, 0)[0].sum().backward()
    path = tmp_path / "plans.json"
    assert tcf.save_plan_cache(path) > 0
    keys = {}
    for plan in json.loads(path.read_text())["plans"]:
        keys.setdefault(plan["graph"], []).append(plan["key"])
    conv = {"x_size", "w_size", "stride", "pad_pre", "pad_post", "dilation", "groups", "epilogue"}
    assert {"conv_bias_act forward", "conv dgrad", "conv wgrad", "batchnorm forward", "batchnorm backward"} <= set(keys)
    for graph, graph_keys in keys.items():
        for key in graph_keys:
            candidates = 1 if graph == "batchnorm forward" else policy.BENCHMARK_CANDIDATES
            assert key["policy"][4] == candidates, (graph, key)
            assert key["policy"][5] == (graph == "batchnorm backward"), (graph, key)
            if graph.startswith("conv"):
                assert set(key["shape"]) == conv, key
                if graph != "conv_bias_act forward":
                    assert key["shape"]["epilogue"] == [False, False, False], key
            elif graph.startswith("batchnorm"):
                assert set(key["shape"]) == {"x_size", "running_stats", "has_residual", "activation"}, key
                assert key["shape"]["x_size"][1] == 64
                if graph == "batchnorm forward" and key["shape"]["x_size"][0] == 16:  # the model's layer
                    assert key["shape"]["activation"] == 1 and key["shape"]["running_stats"], key
                if graph == "batchnorm backward":
                    assert key["shape"]["activation"] == 0 and key["shape"]["x_size"] == [4, 64, 9, 9], key
    if "relu_bias backward" in keys:  # built: its key is y's shape and nothing else
        assert keys["relu_bias backward"][0]["shape"] == {"y_size": list(shape)}, keys["relu_bias backward"]
    else:  # refused (NCHW): the refusal describes y alone
        refusal = tcf.plan_cache_stats()["last_runtime_fallback"]
        assert f"relu_bias backward graph (y {list(shape)}" in refusal, refusal
    print("graphs saved:", sorted(keys))


def _layer_and_plan_file(tmp_path):
    """A fused layer that ran once, and the plan file of its plans."""
    path = tmp_path / "plans.json"
    tcf.clear_plan_cache()
    layer = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1)
    x = _input(8, 64, 28, 28)
    layer(x)
    assert tcf.save_plan_cache(path) >= 1
    return layer, x, path


def test_plan_file_from_another_cudnn_version_is_rejected(extension, tmp_path):
    layer, x, path = _layer_and_plan_file(tmp_path)
    document = json.loads(path.read_text())
    document["environment"]["cudnn"] += 100
    path.write_text(json.dumps(document))
    tcf.clear_plan_cache()
    with pytest.warns(tcf.PlanFileWarning, match="another environment: cudnn"):
        assert tcf.load_plan_cache(path) == 0
    # A plan whose own key names another cuDNN (header intact, checksum recomputed) is refused by the C++ check.
    document["environment"]["cudnn"] -= 100
    for plan in document["plans"]:
        plan["key"]["cudnn_version"] += 100
    from torch_cudnn_fusion.diagnostics.plan_file import _digest

    document["sha256"] = _digest(document["plans"])
    path.write_text(json.dumps(document))
    with pytest.warns(tcf.PlanFileWarning, match="built with cuDNN"):
        assert tcf.load_plan_cache(path) == 0
    y = layer(x)  # rebuilt afresh
    assert layer.fusion_status.fused and rel_err(y, _eager(layer, x)) < 1e-2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "checksum", "foreign_gpu"])
def test_corrupt_or_foreign_plan_file_is_rejected(extension, tmp_path, damage):
    layer, x, path = _layer_and_plan_file(tmp_path)
    text = path.read_text()
    if damage == "garbage":
        path.write_bytes(os.urandom(256))
        expected = "corrupt"
    elif damage == "truncated":
        path.write_text(text[: len(text) // 2])
        expected = "corrupt"
    elif damage == "checksum":
        document = json.loads(text)
        document["plans"][0]["engine"] = "eng999"
        path.write_text(json.dumps(document))
        expected = "checksum"
    else:
        document = json.loads(text)
        document["environment"]["gpu"] = "NVIDIA A100-SXM4-80GB"
        document["environment"]["compute_capability"] = "8.0"
        path.write_text(json.dumps(document))
        expected = "another environment: gpu"
    tcf.clear_plan_cache()
    with pytest.warns(tcf.PlanFileWarning, match=expected):
        assert tcf.load_plan_cache(path) == 0
    y = layer(x)
    assert layer.fusion_status.fused and rel_err(y, _eager(layer, x)) < 1e-2


def test_plan_cache_environment_variable_loads_and_saves(extension, tmp_path):
    path = tmp_path / "auto.json"
    code = (
        "import torch, torch_cudnn_fusion as t\n"
        "layer = t.Conv2dReLU(32, 32, 3, padding=1).cuda().to(memory_format=torch.channels_last)\n"
        "layer(torch.randn(4, 32, 16, 16, device='cuda').to(memory_format=torch.channels_last))\n"
        "torch.cuda.synchronize()\n"
        "s = t.plan_cache_stats(); print('BUILDS', s['builds'], 'ENTRIES', s['entries'])\n"
    )
    env = dict(os.environ, TORCH_CUDNN_FUSION_PLAN_CACHE=str(path))
    first = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    assert path.exists() and "BUILDS 0" not in first.stdout, first.stdout + first.stderr
    second = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    assert "BUILDS 0" in second.stdout and "PlanFileWarning" not in second.stderr, second.stdout + second.stderr


def test_policies_split_the_plan_cache_and_decisions(extension):
    x = _input(8, 64, 28, 28)
    heuristic = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1)
    pinned = _layer(tcf.Conv2dReLU, 64, 64, 3, padding=1, policy=tcf.EnginePolicy("pinned", engines={"forward": 0}))
    heuristic(x), pinned(x)
    assert heuristic._call.config != pinned._call.config
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tcf.engine_policy(tcf.EnginePolicy(deterministic=True)):
            assert tcf.get_engine_policy().deterministic
            heuristic(x)
            assert heuristic._call.config.policy[2] is True
    assert tcf.get_engine_policy() == tcf.EnginePolicy()


AUTOTUNE = tcf.EnginePolicy("autotune")


@pytest.mark.parametrize("dtype, cin, cout, groups, policy, expected", [
    (torch.float32, 8, 8, 4, None, "groups=4: grouped and depthwise convolutions run PyTorch's own kernel"),
    (torch.float32, 8, 8, 8, None, ""),  # depthwise 3x3: our kernel
    (torch.bfloat16, 12, 16, 1, None, "in_channels=12, out_channels=16: not both multiples of 8"),
    (torch.float32, 8, 6, 1, None, "in_channels=8, out_channels=6: cuDNN's fused float32 engines need multiples of 4"),
    (torch.bfloat16, 3, 64, 1, None, ""),  # a stem's few input channels are exempt (cuDNN pads them)
    (torch.float16, 4, 64, 1, None, ""),
    (torch.bfloat16, 5, 64, 1, None, "in_channels=5, out_channels=64: not both multiples of 8"),
    (torch.float16, 3, 36, 1, None, "in_channels=3, out_channels=36: not both multiples of 8"),
    (torch.bfloat16, 64, 64, 64, AUTOTUNE, ""),  # autotune lifts the measured rules: it times the layer instead
    (torch.bfloat16, 12, 16, 1, AUTOTUNE, ""),
    (torch.float32, 8, 6, 1, AUTOTUNE, "in_channels=8, out_channels=6: cuDNN's fused float32 engines need"),
])
def test_the_verdict_states_each_rule_once(extension, dtype, cin, cout, groups, policy, expected):
    """The rules live in C++ (csrc/core/requirements.cpp); a layer's status carries the unmet ones word for word,
    and a layer that meets them is not refused for them."""
    layer = _layer(tcf.Conv2dReLU, cin, cout, 3, padding=1, groups=groups, dtype=dtype, policy=policy)
    layer(_input(2, cin, 8, 8, dtype=dtype))
    status = layer.fusion_status
    if expected:
        assert not status.fused and status.reason.startswith(expected), status
    else:
        assert not status.reason.startswith(("groups=", "in_channels=")), status
        if policy is None:  # the stems: cuDNN pads their few channels and runs them fused
            assert status.fused, status
