"""benchmarks/batch_norm_backward.py's hash of our kernels' gradients (no GPU needed): two builds that should give
the same bits are compared by it, so it must change with any one element's bits and not with where the tensor is."""

import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import batch_norm_backward  # noqa: E402


def test_bits_changes_with_one_element_by_one_ulp_and_with_the_order_of_the_tensors():
    grad_x = torch.randn(2, 8, 3, 3).to(torch.bfloat16).to(memory_format=torch.channels_last)
    grad_w, grad_b = torch.randn(8), torch.randn(8)
    base = batch_norm_backward.bits((grad_x, grad_w, grad_b))
    assert base == batch_norm_backward.bits((grad_x.clone(), grad_w.clone(), grad_b.clone()))
    nudged = grad_w.clone()
    nudged[5] = torch.nextafter(nudged[5], torch.tensor(float("inf")))
    assert batch_norm_backward.bits((grad_x, nudged, grad_b)) != base
    x_nudged = grad_x.clone()
    x_nudged[1, 7, 2, 2] = -x_nudged[1, 7, 2, 2] if x_nudged[1, 7, 2, 2] != 0 else 1.0
    assert batch_norm_backward.bits((x_nudged, grad_w, grad_b)) != base
    assert batch_norm_backward.bits((grad_x, grad_b, grad_w)) != base


def test_a_call_that_fails_to_time_is_reported_in_the_row_and_the_others_are_timed(monkeypatch):
    def replay(fn):
        return fn()

    monkeypatch.setattr(batch_norm_backward, "graph_replay_ms", replay)
    monkeypatch.setattr(batch_norm_backward, "stream_ms", lambda fn: fn() * 2)
    monkeypatch.setattr(batch_norm_backward.torch.cuda, "synchronize", lambda: None)

    def capture_fails():
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore lines")

    row = batch_norm_backward.timed({"ours": lambda: 0.5, "eager": capture_fails, "cuDNN graph": lambda: 0.25})
    assert row == {"gpu_ms": {"ours": 0.5, "cuDNN graph": 0.25}, "stream_ms": {"ours": 1.0, "cuDNN graph": 0.5},
                   "errors": {"eager": "RuntimeError: CUDA error: operation not permitted when stream is capturing"}}


def test_each_backward_call_takes_the_gradient_of_its_own_forward(monkeypatch):
    """On the CPU, eager's call alone (our ops need a GPU): it must differentiate its own forward, also where a
    relu_bias_backward call's inputs are made after it (a ReLU6 layer without a residual)."""
    def cpu_inputs(layer, batch, seed):
        torch.manual_seed(seed)
        shape = (batch, *layer["shape"][1:])
        return {"z": torch.randn(shape).requires_grad_(), "dy": torch.randn(shape), "residual": None,
                "weight": (torch.rand(shape[1]) + 0.5).requires_grad_(),
                "bias": torch.randn(shape[1]).requires_grad_()}

    monkeypatch.setattr(batch_norm_backward, "inputs", cpu_inputs)
    monkeypatch.setattr(batch_norm_backward, "IMPLEMENTATIONS", {})
    layer = {"shape": (2, 4, 3, 3), "activation": "relu6", "residual": False}
    act = batch_norm_backward.Activation.RELU6
    calls = batch_norm_backward.forwards(layer, 2, 0, act)
    assert set(calls) == {"eager", "relu_bias_backward"}
    grad_z, grad_weight, grad_bias = calls["eager"]()
    t = cpu_inputs(layer, 2, 0)
    y = torch.nn.functional.relu6(torch.nn.functional.batch_norm(t["z"], None, None, t["weight"], t["bias"], True))
    expected = torch.autograd.grad(y, (t["z"], t["weight"], t["bias"]), t["dy"])
    for actual, wanted in zip((grad_z, grad_weight, grad_bias), expected):
        torch.testing.assert_close(actual, wanted, rtol=0, atol=0)


def test_layers_takes_a_slice_and_names_a_bad_one():
    import argparse

    import pytest

    assert batch_norm_backward.layer_slice("14:") == slice(14, None)
    assert batch_norm_backward.layer_slice("3:7") == slice(3, 7)
    assert batch_norm_backward.layer_slice(":2") == slice(None, 2)
    assert batch_norm_backward.layer_slice(None) == slice(None)
    for bad in ("14", "a:b", "1:2:3"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"--layers: expected START:END .*got '{bad}'"):
            batch_norm_backward.layer_slice(bad)


def test_bits_hash_ours_only_where_our_kernel_runs_and_keep_the_layer_s_index(monkeypatch, capsys):
    """Without an activation the op's backward is cuDNN's graph or ATen's (chosen by timing): no "ours" hash there;
    with --layers the hashes keep each layer's index in the whole list."""
    layers = [{"shape": (2, 8, 3, 3), "activation": None, "residual": False, "count": 1},
              {"shape": (2, 8, 3, 3), "activation": "relu6", "residual": False, "count": 2},
              {"shape": (2, 16, 3, 3), "activation": None, "residual": False, "count": 1}]
    grads = (torch.ones(2), torch.zeros(3))
    monkeypatch.setattr(batch_norm_backward, "layers_of", lambda model, batch: layers)
    monkeypatch.setattr(batch_norm_backward, "backward_calls", lambda layer, batch, seed=0: {
        "ours": lambda: grads, "eager": lambda: grads,
        **({"relu_bias_backward": lambda: grads} if layer["activation"] else {})})
    monkeypatch.setattr(batch_norm_backward, "timed", lambda calls: {"gpu_ms": {name: 1.0 for name in calls},
                                                                     "stream_ms": {name: 2.0 for name in calls},
                                                                     "errors": {}})
    monkeypatch.setattr(batch_norm_backward, "run_header", lambda args: {"gpu": "g", "torch": "t", "cudnn": 1})
    monkeypatch.setattr(batch_norm_backward, "own_stream", contextlib.nullcontext)

    def bits_lines(*argv):
        monkeypatch.setattr(sys, "argv", ["batch_norm_backward.py", "--bits", *argv])
        batch_norm_backward.main()
        out = capsys.readouterr().out
        return [line.split(",")[1:3] for line in out.splitlines() if line.startswith("bits,")], out

    lines, out = bits_lines()
    assert lines == [["1", "ours"], ["1", "relu_bias_backward"]]
    assert out.count("(ours: cuDNN's graph or ATen, no activation)") == 2
    lines, out = bits_lines("--layers", "1:")
    assert lines == [["1", "ours"], ["1", "relu_bias_backward"]]
    assert "(2, 16, 3, 3)" in out and "(2, 8, 3, 3)" in out and out.count(" x (") == 2
