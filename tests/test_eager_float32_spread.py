"""benchmarks/eager_float32_spread.py on the CPU: the global relative error it reports is the one the GPU zoo test
computes (zero for the float64 gradients themselves, the norm ratio of a known difference), and the script runs a
small model end to end."""

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
