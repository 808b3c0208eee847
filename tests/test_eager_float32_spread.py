"""benchmarks/eager_float32_spread.py on the CPU: the global relative error it reports is the one the GPU zoo test
computes (zero for the float64 gradients themselves, the norm ratio of a known difference), and the script runs a
small model end to end."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import eager_float32_spread  # noqa: E402


def test_global_rel_is_the_norm_of_all_differences_over_the_norm_of_all_references():
    references = [torch.tensor([3.0, 0.0], dtype=torch.float64), torch.tensor([[4.0]], dtype=torch.float64)]
    assert eager_float32_spread.global_rel(references, references) == 0.0
    values = [torch.tensor([3.0, 1.0], dtype=torch.float64), torch.tensor([[4.0]], dtype=torch.float64)]
    assert eager_float32_spread.global_rel(values, references) == pytest.approx(1.0 / 5.0)


def test_the_script_prints_a_row_of_errors_per_draw():
    pytest.importorskip("torchvision")
    result = subprocess.run([sys.executable, str(BENCHMARKS / "eager_float32_spread.py"), "--model",
                             "torchvision:mobilenet_v3_small", "--draws", "2", "--largest", "2"], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines() if line[:4].strip().isdigit()]
    assert [row[0] for row in rows] == ["0", "1"], result.stdout
    errors = [float(e) for row in rows for e in row[1:]]
    assert len(errors) == 4 and all(0 < e < 1 for e in errors), result.stdout
    assert sum("|difference|" in line for line in result.stdout.splitlines()) == 4, result.stdout


def test_largest_differences_orders_by_the_absolute_difference():
    references = {"a": torch.tensor([100.0], dtype=torch.float64), "b": torch.tensor([1.0], dtype=torch.float64)}
    values = {"a": torch.tensor([101.0], dtype=torch.float64), "b": torch.tensor([1.5], dtype=torch.float64)}
    (line,) = eager_float32_spread.largest_differences(values, references, 1)
    assert line.startswith("a: |difference| 1.000e+00, relative 1.00e-02")


def test_the_fused_column_is_eager_channels_last_on_the_cpu_and_the_rounding_move_is_below_eagers_error():
    """On the CPU fuse()'s layers run eager, so its column is channels_last eager's error to the printed digit. resnet18
    at init is well conditioned (eager float32 about 5e-7 off float64): moving its input by float32's rounding moves
    the float64 gradient by less than that, and by more than nothing."""
    pytest.importorskip("timm")
    result = subprocess.run([sys.executable, str(BENCHMARKS / "eager_float32_spread.py"), "--model", "timm:resnet18",
                             "--draws", "1", "--fused", "--rounding-moves", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "3: fused; 4: float64, input rounded" in result.stdout, result.stdout
    (row,) = [line.split() for line in result.stdout.splitlines() if line[:4].strip().isdigit()]
    nchw, channels_last, fused, moved = (float(e) for e in row[1:])
    assert fused == channels_last and 0 < nchw < 1e-5, result.stdout
    assert 0 < moved < nchw, result.stdout


def test_cudnn_off_needs_a_cuda_device():
    result = subprocess.run([sys.executable, str(BENCHMARKS / "eager_float32_spread.py"), "--cudnn-off"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--cudnn-off needs a CUDA --device, got 'cpu'" in result.stderr, result.stderr


def test_rounding_move_stays_within_float32_rounding_where_the_gradient_is_linear_in_the_input():
    """A conv's weight gradient is linear in its input: with positive inputs and output weights nothing cancels, so
    moving each input element by at most 2^-24 relative moves the gradient by at most 2^-24 relative, and by more
    than nothing."""
    torch.manual_seed(0)
    model = torch.nn.Conv2d(3, 4, 3, bias=False)
    x = torch.rand(2, 3, 8, 8) + 0.5
    weights = [torch.rand(2, 4, 6, 6, dtype=torch.float64) + 0.5]
    reference = eager_float32_spread.gradients(copy.deepcopy(model).double(), x.double(), weights)
    moves = [eager_float32_spread.rounding_move(model, x, weights, reference, torch.Generator().manual_seed(seed))
             for seed in range(3)]
    assert all(0 < move <= 2.0 ** -24 for move in moves), moves


def test_the_fused_run_goes_through_fuse_on_a_copy_and_reads_its_shared_parameters(monkeypatch):
    """The fused column is the fuse() model's: run_gradients calls fuse() once, on a copy (the model the script holds
    is left as it is), and reads the gradients of that copy's Parameters, which the fused model shares. On the CPU the
    fused layers run eager, so the gradients are channels_last eager's exactly."""
    calls = []
    fuse = eager_float32_spread.tcf.fuse

    def counting_fuse(model, *args, **kwargs):
        calls.append(model)
        return fuse(model, *args, **kwargs)

    monkeypatch.setattr(eager_float32_spread.tcf, "fuse", counting_fuse)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU())
    x = torch.randn(2, 3, 6, 6)
    weights = [torch.rand(2, 8, 6, 6, dtype=torch.float64) + 0.5]
    fused = eager_float32_spread.run_gradients(model, x, weights, eager_float32_spread.Run(torch.channels_last,
                                                                                          fused=True))
    assert len(calls) == 1 and calls[0] is not model
    assert all(p.grad is None for p in model.parameters())
    eager = eager_float32_spread.run_gradients(model, x, weights, eager_float32_spread.Run(torch.channels_last))
    assert len(calls) == 1 and set(fused) == set(eager) == {"0.weight", "1.weight", "1.bias"}
    for name in eager:
        torch.testing.assert_close(fused[name], eager[name], rtol=0, atol=0, msg=name)
