import os

import pytest
import torch
import torch.nn.functional as F

# pytest-xdist's workers share the host's cores: each of N workers takes cores / N CPU threads, and so do the scripts
# the tests run. With one thread a core in every worker the CPU zoo tests crawled (docs/development.md; 27s: on an
# H200 machine's 16 cores, 10 workers, test_model_zoo.py's backward and a script under test each ran past 300 s).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)
    torch.set_num_threads(_THREADS)

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (the fused path runs on CUDA only)")


@pytest.fixture(autouse=True)
def _cudnn_flags_restored():
    """torch.backends.cudnn's benchmark and deterministic flags as they were before each test: a test that runs a
    benchmark's main() (which sets benchmark) left it on for the next tests of its worker (shown on the CPU). On an
    H100 (2026-12-07j) four depthwise tests, all on one worker, then found cuDNN's wgrad where they expect ours, as a
    wgrad timed under benchmark can choose."""
    flags = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    yield
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = flags


@pytest.fixture
def extension():
    """The compiled module; on a machine with a GPU its absence is a failure, not a skip."""
    import torch_cudnn_fusion as tcf
    from torch_cudnn_fusion import _extension

    if not tcf.is_available():
        pytest.fail(f"a GPU is present but the cuDNN extension is unavailable: {tcf.unavailable_reason()}")
    module = _extension.require()
    module.set_poison_outputs(True)  # every output starts as NaN: an element cuDNN did not write fails the test
    yield module
    module.set_poison_outputs(False)


@pytest.fixture
def cudnn_benchmark(extension):
    """torch.backends.cudnn.benchmark on, with no plan, depthwise wgrad choice or BatchNorm forward choice remembered
    before or after (the extension, as `extension`)."""
    import torch_cudnn_fusion as tcf

    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    tcf.clear_plan_cache()
    yield extension
    torch.backends.cudnn.benchmark = previous
    tcf.clear_plan_cache()


@pytest.fixture
def no_tf32():
    """float32 checks run without TF32, so they can be tight."""
    previous = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = previous


def rel_err(value: torch.Tensor, reference: torch.Tensor) -> float:
    reference = reference.double()
    return ((value.double() - reference).norm() / reference.norm().clamp_min(1e-30)).item()


def assert_as_accurate_as_eager(name: str, fused, eager, reference, dtype) -> None:
    """fused is finite and no worse than twice eager's own error against the float64 reference (float32 without
    TF32: within 1e-5 of it)."""
    assert torch.isfinite(fused).all(), f"{name}: non-finite values (an unwritten output shows as NaN)"
    error = rel_err(fused, reference)
    if dtype == torch.float32:
        assert error <= 1e-5, f"{name}: relative error {error:.3e} against float64 exceeds 1e-5"
        return
    eager_error = rel_err(eager, reference)
    assert error <= 2 * eager_error + 1e-4, (
        f"{name}: relative error {error:.3e} against float64 is more than twice eager's {eager_error:.3e}"
    )


def train_and_eval_steps(fused, x):
    """A training step of `fused` on x under bfloat16 autocast (forward and backward of the output's sum), then an eval
    batch; yields "training" and "eval", each after its step, so that the caller checks what ran."""
    for training in (True, False):
        fused.train(training)
        with torch.autocast("cuda", dtype=torch.bfloat16), torch.set_grad_enabled(training):
            out = fused(x)
        if training:
            out.float().sum().backward()
        yield "training" if training else "eval"


def capture(step, before_capture=None):
    """(graph, what the captured call returned): step() captured in one CUDA graph after three warm-up calls on a side
    stream (decisions made, plans built and optimizer state created before capture); before_capture() runs between
    the two."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    if before_capture is not None:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result


def capture_training_step(forward, model, static_x):
    """(graph, static_y): forward(static_x) and the backward of its sum captured in one CUDA graph (capture), with the
    model's gradients cleared before the capture, so that each replay writes them afresh."""

    def step():
        y = forward(static_x)
        y.float().sum().backward()
        return y

    return capture(step, before_capture=lambda: model.zero_grad(set_to_none=True))


def without_ambiguous_relu6_gradient(grad_y, pre_activation, dtype):
    """grad_y with zeros where the float64 pre-activation lies within a few of dtype's roundings of ReLU6's clip at 6.
    There the mask (0 < y < 6) depends on how an implementation rounded its output, not on its accuracy: eager's
    conv-then-add and a fused epilogue's one rounding land on different sides of 6, and one output of a small test
    layer moves grad_x's norm by percents. (At 0 rounding keeps the sign, so ReLU's mask has no such band.)"""
    band = 8 * torch.finfo(dtype).eps * 6
    return grad_y.masked_fill((pre_activation.to(grad_y.device) - 6).abs() <= band, 0)


def reference_conv_bias_act(x, weight, bias, residual, stride, padding, dilation, groups, relu):
    """The layer in plain PyTorch ops, in whatever dtype its inputs are; relu: True (ReLU), "relu6" or False."""
    y = F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    if residual is not None:
        y = y + residual
    if relu == "relu6":
        return F.relu6(y)
    return F.relu(y) if relu else y


class CountingCall:
    """Stands in for a layer's call recorded in C++ (ConvBiasActCall, ConvBatchNormCall, BatchNormCall): counts the
    calls it ran (or, for a layer that runs eager, found matching) and those it handed back to Python."""

    def __init__(self, inner):
        self.inner, self.ran, self.declined = inner, 0, 0

    def run(self, *args):
        y = self.inner.run(*args)
        if y is None:
            self.declined += 1
        else:
            self.ran += 1
        return y

    def matches(self, *args):
        same = self.inner.matches(*args)
        if same:
            self.ran += 1
        else:
            self.declined += 1
        return same
