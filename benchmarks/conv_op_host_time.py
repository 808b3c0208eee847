"""Where a conv + bias (+ add) + ReLU layer's host time goes in training, fused against eager: untraced host
microseconds a call of the whole forward + backward and of each op the two issue, for bench_conv_layers.py's layer
shapes (bf16, channels_last, cudnn.benchmark on). At the default batch of 8 the GPU finishes first, so the times are
the host's; at bench_conv_layers' batch of 128, a row whose kernels take longer than its host time shows the GPU's.

Rows (host us a call: the median over 5 rounds of 20 back-to-back calls; the rows take turns within a round, so that
a drift of the host's speed moves them alike):
- forward + backward: the fused module and eager (F.conv2d, the add, F.relu), each output's backward with a fixed
  gradient (x needs a gradient but for a stem's image, as in bench_conv_layers); and the fused module with every plan
  run through cudnn-frontend's execute (a test switch), against its plans run directly (RunnableGraph in
  csrc/graphs/graph_builder.h);
- forward with grad (the autograd graph built, then dropped), and forward without: the fused module, its call
  recorded in C++ (what the module runs on a repeated call), the conv_bias_act op via torch.ops, and eager (the
  backward's share: forward + backward less forward with grad);
- the backward's ops, without grad, each alone: ours (relu_bias_backward, conv_dgrad, conv_wgrad) and eager's
  (threshold_backward with the bias gradient's sum; convolution_backward for dgrad and wgrad). A stem in its
  space-to-depth form runs another op (cudnn_fusion::stem_conv_bias_act, ops/stem.py): its rows stop at the record's.

    python benchmarks/conv_op_host_time.py [--only "@14"] [--batch 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion import _extension
from bench_conv_layers import SHAPES, environment

ROUNDS, CALLS = 5, 20
FRONTEND = "through the frontend's execute"


def layer_rows(cin, cout, kernel, stride, size, residual, batch) -> dict:
    """{row: callable} for one layer shape."""
    cl = torch.channels_last
    torch.manual_seed(0)
    layer = (tcf.Conv2dAddReLU if residual else tcf.Conv2dReLU)(cin, cout, kernel, stride=stride,
                                                                 padding=kernel // 2)
    layer = layer.cuda().to(dtype=torch.bfloat16, memory_format=cl)
    # a second copy for the calls without grad: a layer keeps the record of one kind of call, and alternating would
    # decide and record anew at each change
    no_grad_layer = copy.deepcopy(layer)
    w, b, padding = layer.weight, layer.bias, kernel // 2
    out_size = (size + 2 * padding - kernel) // stride + 1

    def tensor(channels, side):
        return torch.randn(batch, channels, side, side, device="cuda", dtype=torch.bfloat16).contiguous(
            memory_format=cl)

    x, g = tensor(cin, size).requires_grad_(cin != 3), tensor(cout, out_size)
    r = tensor(cout, out_size).requires_grad_()
    args = (x, r) if residual else (x,)

    def eager(x):
        y = F.conv2d(x, w, b, stride, padding)
        return F.relu(y + r) if residual else F.relu(y)

    rows = {
        "forward + backward: fused": lambda: layer(*args).backward(g),
        f"forward + backward: fused, {FRONTEND}": lambda: layer(*args).backward(g),
        "forward + backward: eager": lambda: eager(x).backward(g),
        "forward with grad: fused": lambda: layer(*args),
        "forward with grad: eager": lambda: eager(x),
    }
    layer(*args).backward(g)  # decided and recorded
    fused, op_args, stem = layer._call.run
    op = torch.ops.cudnn_fusion
    if fused:
        grad_record = layer._call.recorded
        assert grad_record.run(x, w, b, r if residual else None) is not None, "the record declined"
        rows["forward with grad: C++ record"] = lambda: grad_record.run(x, w, b, r if residual else None)
    if fused and stem is None:
        rows["forward with grad: conv_bias_act op"] = lambda: op.conv_bias_act(x, w, b, r if residual else None,
                                                                              *op_args)
    xd, rd = x.detach(), r.detach() if residual else None
    no_grad_args = (xd, rd) if residual else (xd,)
    with torch.no_grad():
        y = no_grad_layer(*no_grad_args)  # decided and recorded
    rows["forward, no grad: fused"] = torch.no_grad()(lambda: no_grad_layer(*no_grad_args))
    if fused:
        no_grad_record = no_grad_layer._call.recorded
        with torch.no_grad():
            assert no_grad_record.run(xd, no_grad_layer.weight, no_grad_layer.bias, rd) is not None, \
                "the record declined"
        rows["forward, no grad: C++ record"] = torch.no_grad()(
            lambda: no_grad_record.run(xd, no_grad_layer.weight, no_grad_layer.bias, rd))
    if fused and stem is None:
        rows["forward, no grad: conv_bias_act op"] = torch.no_grad()(
            lambda: op.conv_bias_act(xd, w, b, rd, *op_args))
    rows["forward, no grad: eager"] = torch.no_grad()(lambda: eager(xd))
    if fused and stem is None:
        geometry, policy = op_args[:5], op_args[6]
        dz = torch.ops.aten.threshold_backward(g, y, 0)
        rows["backward op: relu_bias_backward"] = lambda: op.relu_bias_backward(g, y, 1, policy)
        rows["backward op: conv_dgrad"] = lambda: op.conv_dgrad(dz, w, list(x.shape), *geometry, policy)
        rows["backward op: conv_wgrad"] = lambda: op.conv_wgrad(dz, xd, list(w.shape), *geometry, policy)
        rows["backward op, eager: threshold_backward + bias sum"] = lambda: torch.ops.aten.threshold_backward(
            g, y, 0).sum((0, 2, 3), dtype=torch.float32)
        rows["backward op, eager: convolution_backward"] = lambda: torch.ops.aten.convolution_backward(
            dz, xd, w, [cout], [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1, [x.requires_grad, True, False])
    return rows


def host_us(rows: dict) -> dict:
    """{row: host us a call}, the rows taking turns within each round. A row named with FRONTEND runs with every plan
    through cudnn-frontend's execute (the test switch), the switch set around its calls, not inside them."""
    switch = _extension.require().set_frontend_execute_for_tests

    def calls(row, fn, count):
        switch(FRONTEND in row)
        try:
            for _ in range(count):
                fn()
        finally:
            switch(False)

    for row, fn in rows.items():  # plans built, allocator warm
        calls(row, fn, 2)
    samples = {row: [] for row in rows}
    for _ in range(ROUNDS):
        for row, fn in rows.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            calls(row, fn, CALLS)
            samples[row].append((time.perf_counter() - start) / CALLS * 1e6)
    torch.cuda.synchronize()
    return {row: statistics.median(values) for row, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--only", default="", help="run only shapes whose name contains this text")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("conv_op_host_time.py needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    env = environment()
    env["batch"] = args.batch
    print(f"{env}\nhost us a call: median of {ROUNDS} rounds of {CALLS} back-to-back calls")
    results = {}
    for name, cin, cout, kernel, stride, size, residual in SHAPES:
        if args.only not in name:
            continue
        results[name] = host_us(layer_rows(cin, cout, kernel, stride, size, residual, args.batch))
        print(f"\n{name}")
        for row, us in results[name].items():
            print(f"  {row:<52}{us:>8.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "results": results}, indent=1))


if __name__ == "__main__":
    main()
