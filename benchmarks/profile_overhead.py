"""Where a fused layer's time goes: host microseconds per call of each piece (Python decision, op dispatch,
autograd) and GPU time per call (CUDA-graph replay, so no host cost), against eager.

    python benchmarks/profile_overhead.py [--cin 512 --cout 512 --kernel 1 --size 14 --batch 128]
    python benchmarks/profile_overhead.py --layer conv_bn [--groups 576 --cin 576 --cout 576 --kernel 3]

--layer conv_bias (default): Conv2dReLU with bias, bf16 weights. --layer conv_bn: a training conv + BatchNorm +
ReLU6 (as in mobilenet_v2) through tcf.fuse, float32 weights under bf16 autocast; a small batch shows the host's
cost, where the GPU finishes first.
"""

from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops import decide as fusion
from torch_cudnn_fusion.ops import conv2d_bias_act
from timing import graph_replay_ms, host_us


def gpu_us(fn):
    return graph_replay_ms(fn, calls=20, replays=20) * 1e3


def conv_bias_rows(args) -> list:
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
    return rows


def conv_bn_rows(args) -> list:
    cl, pad, ops = torch.channels_last, args.kernel // 2, torch.ops.cudnn_fusion
    eager = torch.nn.Sequential(
        torch.nn.Conv2d(args.cin, args.cout, args.kernel, args.stride, pad, groups=args.groups, bias=False),
        torch.nn.BatchNorm2d(args.cout), torch.nn.ReLU6(inplace=True)).cuda().to(memory_format=cl)
    fused = tcf.fuse(copy.deepcopy(eager))[0]
    conv, bn = eager[0], eager[1]
    x = torch.randn(args.batch, args.cin, args.size, args.size, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=cl).requires_grad_()
    autocast = torch.autocast("cuda", torch.bfloat16)
    with autocast:
        y = eager(x)
    g = torch.randn_like(y)
    with torch.no_grad(), autocast:
        z = conv(x)
    w, b, stats = bn.weight.detach(), bn.bias.detach(), (bn.running_mean.clone(), bn.running_var.clone())
    stride, padding = [args.stride] * 2, [pad] * 2

    def under_autocast(fn):
        def call():
            with autocast:
                return fn()
        return call

    def bn_graph():
        return ops.batch_norm_act(z, w, b, stats[0], stats[1], None, 0.1, 1e-5, 2, 0, 0)

    def conv_bn_op():
        return ops.conv_batch_norm_act(x, conv.weight, None, stride, padding, [1, 1], args.groups, w, b, stats[0],
                                       stats[1], None, None, 0.1, 1e-5, 2, 0, torch.bfloat16, 0)

    rows = []
    for name, fn in (("eager conv+bn+relu6", lambda: eager(x)), ("fused module", lambda: fused(x)),
                     ("conv alone", lambda: conv(x))):
        rows.append((f"forward: {name}", host_us(under_autocast(fn)), gpu_us(under_autocast(fn))))
    with torch.no_grad():
        for name, fn in (("aten batch_norm (training)", lambda: torch.nn.functional.batch_norm(
                              z, stats[0], stats[1], w, b, True, 0.1, 1e-5)),
                         ("batch_norm_act op (graph)", bn_graph), ("conv_batch_norm_act op", conv_bn_op)):
            rows.append((f"forward, no grad: {name}", host_us(fn), gpu_us(fn)))

    def train(module):
        def step():
            with autocast:
                out = module(x)
            out.backward(g)
        return step

    for name, module in (("eager", eager), ("fused module", fused)):
        # not captured: a CUDA graph refuses this step's eager backward under autocast (capture invalidated)
        rows.append((f"fwd+bwd: {name}", host_us(train(module), calls=100), float("nan")))
    with torch.no_grad():
        _, mean, invstd, _, _, _ = bn_graph()
        gz = g.clone()
        pieces = (("batch_norm_act_backward_", lambda: ops.batch_norm_act_backward_(gz, z, w, b, mean, invstd, 2)),
                  ("aten native_batch_norm_backward", lambda: torch.ops.aten.native_batch_norm_backward(
                      g, z, w, None, None, mean, invstd, True, 1e-5, [True, True, True])),
                  ("aten hardtanh_backward", lambda: torch.ops.aten.hardtanh_backward(g, y, 0.0, 6.0)),
                  ("aten convolution_backward", lambda: torch.ops.aten.convolution_backward(
                      g, x.detach(), conv.weight.detach().to(torch.bfloat16), None, stride, padding, [1, 1], False,
                      [0, 0], args.groups, [True, True, False])))
        for name, fn in pieces:
            rows.append((f"backward op: {name}", host_us(fn), gpu_us(fn)))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layer", choices=("conv_bias", "conv_bn"), default="conv_bias")
    parser.add_argument("--cin", type=int, default=512)
    parser.add_argument("--cout", type=int, default=512)
    parser.add_argument("--kernel", type=int, default=1)
    parser.add_argument("--stride", type=int, default=1, help="conv_bn only")
    parser.add_argument("--groups", type=int, default=1, help="conv_bn only")
    parser.add_argument("--size", type=int, default=14)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    rows = conv_bias_rows(args) if args.layer == "conv_bias" else conv_bn_rows(args)
    groups = f" groups {args.groups}" if args.layer == "conv_bn" else ""
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {args.layer} {args.cin}->{args.cout} "
          f"k{args.kernel}{groups} @{args.size} batch {args.batch} bf16 channels_last")
    print(f"{'what':<45} {'host us/call':>12} {'GPU us/call':>12}")
    for name, host, gpu in rows:
        print(f"{name:<45} {host:12.1f} {gpu:12.1f}")


if __name__ == "__main__":
    main()
