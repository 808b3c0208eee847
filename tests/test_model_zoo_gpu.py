"""fuse() on the model zoo on the GPU, against a float64 copy of the eager model.

For each model, in float32 (TF32 off) and under bfloat16 autocast, channels_last: one training step (loss, every
gradient, every BatchNorm buffer after it) and one eval batch. Eager float32/bfloat16 is itself off float64 by up to
about 1% in a deep net's gradient at init, so the rule is relative to eager's own error: fused error <= 2 x eager
error + a small floor. Eager's error is the larger of two eager runs, channels_last and NCHW: at init a net
amplifies rounding chaotically, and one eager run can be 100x closer to float64 than the other (regnet_x_400mf,
float32: 1.1e-4 and 1.1e-2 in the global gradient, H100), so a single run is a lucky draw, not eager's accuracy.
The loss is a positively weighted sum of output**2 (its relative error is about twice the output's); a random projection of the output was
near zero for some models, which made its relative error meaningless. Dropout-like modules are put in eval mode so
that the models see the same function.

TCF_GPU_ZOO picks the models: unset, one per family (below); "all", every model of tests/zoo.py; or a comma list of
ids such as "torchvision:resnet50,timm:resnet18". TCF_GPU_ZOO_RESULTS=FILE appends one JSON line per model and dtype:
errors, coverage, and for every Conv2d not run fused, why.
"""

import copy
import json
import os
import time

import pytest
import torch

import torch_cudnn_fusion as tcf
from conftest import gpu
from zoo import builder, conv_count, outputs, zoo_ids

pytestmark = gpu

FAMILIES = ["torchvision:resnet18", "torchvision:resnet50", "torchvision:resnext50_32x4d", "torchvision:regnet_x_400mf",
            "torchvision:regnet_y_400mf", "torchvision:mobilenet_v2", "torchvision:mobilenet_v3_small",
            "torchvision:efficientnet_b0", "torchvision:densenet121", "torchvision:googlenet",
            "torchvision:mnasnet0_5", "torchvision:shufflenet_v2_x0_5", "torchvision:vgg11_bn",
            "timm:resnet50d", "timm:resnext26ts", "timm:efficientnet_b0", "timm:mobilenetv1_100",
            "timm:mobilenetv2_035", "timm:mobilenetv3_small_050", "timm:regnetx_002", "timm:regnety_008",
            "timm:cspdarknet53"]
FLOOR = {torch.float32: 2e-5, torch.bfloat16: 2e-3}
DROP_LIKE = ("Dropout", "StochasticDepth", "DropPath", "DropBlock")
CL = torch.channels_last


def _gpu_ids():
    choice = os.environ.get("TCF_GPU_ZOO", "")
    if choice == "all":
        return zoo_ids()
    return [i for i in choice.split(",") if i] or FAMILIES


def _rel(value, reference) -> float:
    reference = reference.double()
    return ((value.double() - reference).norm() / reference.norm().clamp_min(1e-30)).item()


def _global_rel(values, references) -> float:
    diff = sum(((v.double() - r.double()) ** 2).sum() for v, r in zip(values, references))
    return (diff.sqrt() / sum((r.double() ** 2).sum() for r in references).sqrt().clamp_min(1e-30)).item()


def _no_dropout(model):
    for m in model.modules():
        if any(name in type(m).__name__ for name in DROP_LIKE):
            m.eval()


def _step(model, x, weights, dtype):
    """One training forward + backward; returns (outputs, loss)."""
    model.train()
    _no_dropout(model)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        outs = outputs(model(x))
    loss = sum((o.double() ** 2 * w).sum() for o, w in zip(outs, weights))
    loss.backward()
    return outs, loss.detach()


def _eval(model, x, dtype):
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        return outputs(model(x))


def _coverage(fused, report) -> dict:
    """Conv2d layers of the model, those in a fused module, and those whose fused module ran fused (its last call)."""
    replaced, total, why_not = report.conv_coverage()
    ran, eager = 0, {}
    for row in report.replaced:
        if not row.pattern.startswith("Conv2d"):
            continue
        status = fused.get_submodule(row.path).fusion_status
        if status.fused:
            ran += 1
        else:
            eager[row.path] = status.reason
    return {"convs": total, "replaced": replaced, "ran_fused": ran, "not_replaced": why_not, "ran_eager": eager}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("model_id", _gpu_ids())
def test_fused_model_is_as_accurate_as_eager_against_float64(model_id, dtype, extension, no_tf32):
    start = time.time()
    build, size = builder(model_id)
    torch.manual_seed(0)
    model = build().cuda().to(memory_format=CL)
    reference = copy.deepcopy(model).double()
    eager = copy.deepcopy(model)
    eager_nchw = copy.deepcopy(model).to(memory_format=torch.contiguous_format)
    fused, report = tcf.fuse(model)
    torch.manual_seed(1)
    x = torch.randn(4, 3, size, size, device="cuda").to(memory_format=CL)
    with torch.no_grad():
        weights = [torch.rand_like(o, dtype=torch.float64) + 0.5 for o in _eval(copy.deepcopy(reference), x.double(),
                                                                                 torch.float64)]
    results = {"model": model_id, "dtype": str(dtype).replace("torch.", "")}
    failures = []

    def check(what, fused_err, eager_err):
        results[what] = {"fused": fused_err, "eager": eager_err}
        if not fused_err <= 2 * eager_err + FLOOR[dtype]:
            failures.append(f"{what}: fused {fused_err:.3e} > 2 x eager {eager_err:.3e} + {FLOOR[dtype]:.0e}")

    out_ref, loss_ref = _step(reference, x.double(), weights, torch.float64)
    out_eager, loss_eager = _step(eager, x, weights, dtype)
    _, loss_nchw = _step(eager_nchw, x.contiguous(), weights, dtype)
    out_fused, loss_fused = _step(fused, x, weights, dtype)
    check("loss", _rel(loss_fused, loss_ref), max(_rel(loss_eager, loss_ref), _rel(loss_nchw, loss_ref)))
    names = [n for n, p in reference.named_parameters() if p.grad is not None]
    grads = {label: dict((n, p.grad) for n, p in m.named_parameters() if p.grad is not None)
             for label, m in (("ref", reference), ("eager", eager), ("nchw", eager_nchw), ("fused", model))}
    assert set(grads["fused"]) == set(grads["eager"]) == set(names), "the fused model's gradients are incomplete"
    global_error = {label: _global_rel([grads[label][n] for n in names], [grads["ref"][n] for n in names])
                    for label in ("fused", "eager", "nchw")}
    check("gradient (global)", global_error["fused"], max(global_error["eager"], global_error["nchw"]))
    buffers = {label: dict(m.named_buffers())
               for label, m in (("ref", reference), ("eager", eager), ("nchw", eager_nchw), ("fused", model))}
    worst = None
    for name, ref in buffers["ref"].items():
        if not ref.is_floating_point():
            assert torch.equal(buffers["fused"][name].cpu(), ref.cpu()), name  # num_batches_tracked
            continue
        fused_err = _rel(buffers["fused"][name], ref)
        eager_err = max(_rel(buffers["eager"][name], ref), _rel(buffers["nchw"][name], ref))
        if not fused_err <= 2 * eager_err + FLOOR[dtype]:
            failures.append(f"buffer {name}: fused {fused_err:.3e} > 2 x eager {eager_err:.3e} + {FLOOR[dtype]:.0e}")
        if worst is None or fused_err - 2 * eager_err > worst[1] - 2 * worst[2]:
            worst = (name, fused_err, eager_err)
    results["worst buffer"] = worst
    coverage_training = _coverage(fused, report)

    eval_ref, eval_eager, eval_fused = _eval(reference, x.double(), torch.float64), _eval(eager, x, dtype), \
        _eval(fused, x, dtype)
    eval_nchw = _eval(eager_nchw, x.contiguous(), dtype)
    for i, (f, e, n, r) in enumerate(zip(eval_fused, eval_eager, eval_nchw, eval_ref)):
        check(f"eval output {i}", _rel(f, r), max(_rel(e, r), _rel(n, r)))
    coverage_eval = _coverage(fused, report)
    results.update(coverage_training=coverage_training, coverage_eval=coverage_eval,
                   seconds=round(time.time() - start, 1))
    path = os.environ.get("TCF_GPU_ZOO_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(results, default=str) + "\n")
    assert coverage_training["convs"] == conv_count(model)
    assert not failures, "; ".join(failures)


def test_resnet50_runs_every_conv_fused_in_training_and_eval(extension):
    """ResNet-50 under bfloat16 autocast, channels_last: all 53 convs (conv + BN + ReLU, conv + BN + add + ReLU,
    downsample conv + BN) are in fused modules that run fused, in training and in eval."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=10).cuda().to(memory_format=CL)
    fused, report = tcf.fuse(model)
    assert report.conv_coverage()[:2] == (53, 53)
    x = torch.randn(8, 3, 64, 64, device="cuda").to(memory_format=CL)
    for training in (True, False):
        fused.train(training)
        with torch.autocast("cuda", dtype=torch.bfloat16), torch.set_grad_enabled(training):
            out = fused(x)
        if training:
            out.float().sum().backward()
        coverage = _coverage(fused, report)
        assert coverage["ran_fused"] == 53, ("training" if training else "eval", coverage["ran_eager"])
