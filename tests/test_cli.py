"""python -m torch_cudnn_fusion: info and engines. The CPU cases run everywhere; the GPU ones need a GPU."""

import subprocess
import sys

import pytest
import torch

import torch_cudnn_fusion as tcf

from conftest import HAS_GPU, gpu


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "torch_cudnn_fusion", *args], capture_output=True, text=True)


def test_info_prints_versions_and_why_the_extension_is_or_is_not_there():
    out = _cli("info")
    assert out.returncode == 0, out.stderr
    assert torch.__version__ in out.stdout
    if HAS_GPU:
        assert "cudnn-frontend (extension built with)" in out.stdout and "GPU 0" in out.stdout
    else:
        assert "extension" in out.stdout and "unavailable: torch has no usable CUDA" in out.stdout


@pytest.mark.skipif(HAS_GPU, reason="checks the message given without a GPU")
def test_engines_without_a_gpu_says_why():
    out = _cli("engines", "--input", "8,64,14,14", "--weight", "64,64,3,3", "--padding", "1")
    assert out.returncode == 2
    assert "engines needs a CUDA GPU and the cuDNN extension" in out.stderr
    with pytest.raises(RuntimeError, match="torch has no usable CUDA"):
        tcf.engines([8, 64, 14, 14], [64, 64, 3, 3], padding=1)


def test_engines_rejects_bad_arguments_by_name():
    with pytest.raises(ValueError, match=r"graph must be one of"):
        tcf.engines([8, 64, 14, 14], [64, 64, 3, 3], graph="fprop")
    with pytest.raises(ValueError, match=r"x has 32 channels but weight of shape \[64, 64, 3, 3\]"):
        tcf.engines([8, 32, 14, 14], [64, 64, 3, 3])
    with pytest.raises(ValueError, match=r"stride must be >= 1, got \(1, 0\)"):
        tcf.engines([8, 64, 14, 14], [64, 64, 3, 3], stride=(1, 0))  # checked before the extension is needed
    with pytest.raises(ValueError, match=r"dilation must be >= 1, got 0"):
        tcf.engines([8, 64, 14, 14], [64, 64, 3, 3], dilation=0)
    with pytest.raises(ValueError, match=r"activation must be 'relu', 'relu6', 'identity' or None, got 'silu'"):
        tcf.engines([8, 64, 14, 14], [64, 64, 3, 3], activation="silu")  # the conv graphs' activations only
    out = _cli("engines", "--input", "8,x,14,14", "--weight", "64,64,3,3")
    assert out.returncode == 2 and "expected comma-separated integers" in out.stderr


@gpu
@pytest.mark.parametrize("graph", ["forward", "dgrad", "wgrad"])
def test_engines_lists_timed_candidates_and_eager(extension, graph):
    table = tcf.engines([16, 64, 28, 28], [64, 64, 3, 3], padding=1, graph=graph, time=True, repeats=3)
    plans, eager = table[:-1], table[-1]
    assert not table.refusal
    built = [c for c in plans if not c.error]
    assert built, str(table)
    chosen = [c for c in plans if c.heuristic_choice]
    assert len(chosen) == 1 and chosen[0] is built[0]  # the heuristic runs the first candidate that builds
    for c in built:
        assert c.engine_id is not None and c.workspace_bytes >= 0 and c.median_ms > 0 and c.build_seconds > 0, c
    assert all(c.build_seconds > 0 for c in plans), str(table)
    assert eager.index is None and eager.median_ms > 0
    assert "* the heuristic's choice" in str(table)


@gpu
def test_engines_reports_a_refused_graph(extension):
    table = tcf.engines([4, 64, 14, 14], [64, 64, 3, 3], padding=1, channels_last=False, residual=True)
    assert table[:-1] == []
    assert "Requirements not met:" in table.refusal and "layout: tensors are NCHW" in table.refusal, table.refusal
    assert str(table).startswith("cuDNN refused the graph")


@gpu
@pytest.mark.parametrize("activation, channels_last", [("relu6", True), ("relu6", False), ("relu", True)])
def test_engines_lists_no_cudnn_plan_for_a_relu_backward_no_graph_runs(extension, activation, channels_last):
    # ReLU6's backward never runs a graph; ReLU's runs our kernel for channels_last with channels a multiple of 8
    table = tcf.engines([4, 64, 14, 14], [64, 64, 3, 3], padding=1, graph="relu_bias_backward",
                        activation=activation, channels_last=channels_last, time=True, repeats=3)
    assert table[:-1] == [] and table[-1].index is None and table[-1].median_ms > 0, str(table)
    assert table.runs_instead and not table.refusal
    assert "No cuDNN graph runs here: " + table.runs_instead in str(table)
    expected = "our NHWC kernel" if channels_last else "eager's composition"
    assert expected in table.runs_instead, table.runs_instead


@gpu
def test_engines_lists_cudnn_plans_for_a_relu_backward_the_graph_runs(extension):
    table = tcf.engines([4, 64, 14, 14], [64, 64, 3, 3], padding=1, graph="relu_bias_backward", channels_last=False)
    assert not table.runs_instead
    assert table.refusal or [c for c in table[:-1] if not c.error], str(table)


@gpu
def test_engines_cli_prints_a_table(extension):
    out = _cli("engines", "--input", "8,64,14,14", "--weight", "128,64,1,1", "--time", "--repeats", "3")
    assert out.returncode == 0, out.stderr
    assert "engine / knobs" in out.stdout and "eager (PyTorch ops)" in out.stdout
