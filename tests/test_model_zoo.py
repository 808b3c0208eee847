"""fuse() on every torchvision classification model with BatchNorm and on timm's conv-net families, on the CPU.

There every fused module runs its eager composition, so the fused model must equal an untouched eager copy exactly:
outputs in training and eval, every gradient, every buffer. The user's model must be exactly as it was (classes,
state_dict, behaviour), and the report must account for every Conv2d. The GPU numerics (against float64) are in
test_model_zoo_gpu.py.
"""

import copy

import pytest
import torch

import torch_cudnn_fusion as tcf
from zoo import builder, conv_count, module_classes, outputs, zoo_ids


def _exactly(actual, expected, what):
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")


def _seeded(model, x):
    """model(x) from the same random state each time (dropout, stochastic depth)."""
    torch.manual_seed(2)
    return model(x)


@pytest.fixture
def deterministic_algorithms():
    """Deterministic algorithms for the test's duration. Some models' own backward on the CPU adds in an order that
    depends on the threads: maxvit's relative position bias table is gathered with index tensors, whose backward
    (index_put_ with accumulate) gave other bits from one call to the next with 16 threads (in each of six comparisons
    of two eager calls on one model, torch 2.14.1; equal bits in each with deterministic algorithms). In the suite,
    maxvit_t failed so on a GPU machine's 16 cores (2026-11-26): 39 of the table's 2704 gradients, up to 1.4e-6
    apart. With deterministic algorithms both copies add in one order, so a difference is fuse()'s."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn, not raise, where an op has no such algorithm
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


@pytest.mark.parametrize("model_id", zoo_ids())
def test_fuse_matches_eager_exactly_and_leaves_the_model_alone(model_id, deterministic_algorithms):
    build, size = builder(model_id)
    torch.manual_seed(0)
    model = build()
    classes = module_classes(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    eager = copy.deepcopy(model)

    fused, report = tcf.fuse(model)

    assert module_classes(model) == classes, "fuse() changed the user's modules"
    for key, value in model.state_dict().items():
        _exactly(value, state[key], f"the user's {key} after fuse()")
    del state
    assert set(fused.state_dict()) == set(model.state_dict())
    replaced, total, why_not = report.conv_coverage()
    assert total == conv_count(model), f"the report accounts for {total} of {conv_count(model)} Conv2d layers"
    assert replaced > 0 and all(why_not.values()), why_not

    torch.manual_seed(1)
    x = torch.randn(2, 3, size, size)
    fused.train(), eager.train()
    out_fused, out_eager = [outputs(_seeded(m, x)) for m in (fused, eager)]
    assert len(out_fused) == len(out_eager)
    weights = [torch.randn_like(o) for o in out_eager]
    for i, (a, b) in enumerate(zip(out_fused, out_eager)):
        _exactly(a, b, f"training output {i}")
    sum((o * w).sum() for o, w in zip(out_fused, weights)).backward()
    sum((o * w).sum() for o, w in zip(out_eager, weights)).backward()
    eager_parameters = dict(eager.named_parameters())
    for name, p in model.named_parameters():  # the fused model's Parameters are the model's own
        assert (p.grad is None) == (eager_parameters[name].grad is None), name
        if p.grad is not None:
            _exactly(p.grad, eager_parameters[name].grad, f"gradient of {name}")
    eager_buffers = dict(eager.named_buffers())
    for name, b in model.named_buffers():
        _exactly(b, eager_buffers[name], f"buffer {name} after a training step")

    fused.eval(), eager.eval()
    with torch.no_grad():
        for i, (a, b) in enumerate(zip(outputs(fused(x)), outputs(eager(x)))):
            _exactly(a, b, f"eval output {i}")
        assert model.training, "fused.eval() changed the user's model's mode"
        model.eval()  # the user's model, trained through the fused one, still runs as itself
        for i, (a, b) in enumerate(zip(outputs(model(x)), outputs(eager(x)))):
            _exactly(a, b, f"the user's model's eval output {i}")
