"""Where a fused layer's time goes: host microseconds per call of each piece (Python decision, op dispatch,
autograd) and GPU time per call (CUDA-graph replay, so no host cost), against eager.

    python benchmarks/profile_overhead.py [--cin 512 --cout 512 --kernel 1 --size 14 --batch 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops import decide as fusion
from torch_cudnn_fusion.ops import conv2d_bias_act
from timing import graph_replay_ms


def host_us(fn, calls=300, repeats=5):
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def gpu_us(fn):
    return graph_replay_ms(fn, calls=20, replays=20) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cin", type=int, default=512)
    parser.add_argument("--cout", type=int, default=512)
    parser.add_argument("--kernel", type=int, default=1)
    parser.add_argument("--size", type=int, default=14)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    cl, dtype, pad = torch.channels_last, torch.bfloat16, args.kernel // 2
    layer = tcf.Conv2dReLU(args.cin, args.cout, args.kernel, padding=pad).cuda().to(dtype=dtype, memory_format=cl)
    x = torch.randn(args.batch, args.cin, args.size, args.size, device="cuda", dtype=dtype).contiguous(memory_format=cl)
    xg = x.clone().requires_grad_()
    w, b = layer.weight, layer.bias
    g = torch.randn_like(layer(x))
    ops = torch.ops.cudnn_fusion

    def eager():
        return F.relu(F.conv2d(x, w, b, 1, pad))

    def conv_only():
        return F.conv2d(x, w, None, 1, pad)

    def op_direct():
        return ops.conv_bias_act(x, w, b, None, [1, 1], [pad, pad], [pad, pad], [1, 1], 1, 1)

    def config_only():
        return fusion.conv_config(x, w, b, None, (1, 1), (pad, pad), (pad, pad), (1, 1), 1, True, "zeros",
                                  tcf.get_engine_policy().key)

    def decision_only():
        return fusion.decide_conv(config_only())

    def functional():
        return conv2d_bias_act(x, w, b, None, 1, pad, 1, 1, "relu")

    rows = []
    with torch.no_grad():
        for name, fn in (("eager conv+bias+relu", eager), ("conv alone", conv_only), ("fused module", lambda: layer(x)),
                         ("functional", functional), ("op called directly", op_direct),
                         ("conv_config only", config_only), ("decision only", decision_only)):
            gpu = gpu_us(fn) if name not in ("conv_config only", "decision only") else float("nan")
            rows.append((f"forward: {name}", host_us(fn), gpu))

    def train(fn):
        def step():
            fn().backward(g)
        return step

    for name, fn in (("eager", lambda: F.relu(F.conv2d(xg, w, b, 1, pad))), ("fused module", lambda: layer(xg)),
                     ("op called directly", lambda: ops.conv_bias_act(xg, w, b, None, [1, 1], [pad, pad], [pad, pad],
                                                                      [1, 1], 1, 1))):
        rows.append((f"fwd+bwd: {name}", host_us(train(fn), calls=100), gpu_us(train(fn))))
    y = layer(x)
    gz = torch.randn_like(y)
    pieces = (("relu_bias_backward", lambda: ops.relu_bias_backward(g, y)),
              ("conv_dgrad", lambda: ops.conv_dgrad(gz, w, list(x.shape), [1, 1], [pad, pad], [pad, pad], [1, 1], 1)),
              ("conv_wgrad", lambda: ops.conv_wgrad(gz, x, list(w.shape), [1, 1], [pad, pad], [pad, pad], [1, 1], 1)),
              ("aten threshold_backward", lambda: torch.ops.aten.threshold_backward(g, y, 0)),
              ("aten convolution_backward", lambda: torch.ops.aten.convolution_backward(
                  gz, x, w, [args.cout], [1, 1], [pad, pad], [1, 1], False, [0, 0], 1, [True, True, True])))
    with torch.no_grad():
        for name, fn in pieces:
            rows.append((f"backward op: {name}", host_us(fn), gpu_us(fn)))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.cin}->{args.cout} k{args.kernel} "
          f"@{args.size} batch {args.batch} bf16 channels_last")
    print(f"{'what':<45} {'host us/call':>12} {'GPU us/call':>12}")
    for name, host, gpu in rows:
        print(f"{name:<45} {host:12.1f} {gpu:12.1f}")


if __name__ == "__main__":
    main()
