"""Our depthwise kernels against PyTorch's (cuDNN's) on the depthwise layers of MobileNet v1 and v2 (batch 256,
bf16, channels_last), in the steps the extension runs them (the rule: csrc/ops/depthwise_ops.h): the forward with
bias and ReLU fused (against PyTorch's conv + bias + ReLU), the plain forward as the op runs it (against PyTorch's
conv alone), dgrad and wgrad as the ops run them, each against PyTorch's own. GPU time per call (CUDA-graph replay,
no host cost), and as a multiple of the time its bytes take at the copy bandwidth measured in the same run (the
issue's target: 1.3x). Beside them, a plain device-to-device copy of the same bytes, as a multiple of the same time:
what a kernel that only moves a layer's bytes takes at that size (a small layer's copy does not reach the large
copy's bandwidth). At stride 1 also the forward of dy with the filter turned 180 degrees, ours and PyTorch's: the
dgrad's other forms.

    python benchmarks/bench_depthwise.py [--batch 256] [--dtype bfloat16] [--cudnn-benchmark] [--json out.json]

With --cudnn-benchmark, torch.backends.cudnn.benchmark is on for every variant: PyTorch's picks cuDNN's algorithms
by timing, and the wgrad op runs what its first call timed fastest among our three plans and PyTorch's (named in the
"wgrad runs" column; csrc/ops/depthwise_ops.h, depthwise_wgrad_choice).

Bytes each step must move: forward reads x and writes y; dgrad reads dy and writes dx; wgrad reads x and dy.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from timing import graph_replay_ms

# name, channels, kernel, stride, input size
LAYERS = [
    ("v1 32 3x3/1 @112", 32, 3, 1, 112),
    ("v1 64 3x3/2 @112", 64, 3, 2, 112),
    ("v1 128 3x3/1 @56", 128, 3, 1, 56),
    ("v1 128 3x3/2 @56", 128, 3, 2, 56),
    ("v1 256 3x3/1 @28", 256, 3, 1, 28),
    ("v1 256 3x3/2 @28", 256, 3, 2, 28),
    ("v1 512 3x3/1 @14", 512, 3, 1, 14),
    ("v1 512 3x3/2 @14", 512, 3, 2, 14),
    ("v1 1024 3x3/1 @7", 1024, 3, 1, 7),
    ("v2 96 3x3/2 @112", 96, 3, 2, 112),
    ("v2 144 3x3/1 @56", 144, 3, 1, 56),
    ("v2 144 3x3/2 @56", 144, 3, 2, 56),
    ("v2 192 3x3/1 @28", 192, 3, 1, 28),
    ("v2 192 3x3/2 @28", 192, 3, 2, 28),
    ("v2 384 3x3/1 @14", 384, 3, 1, 14),
    ("v2 576 3x3/1 @14", 576, 3, 1, 14),
    ("v2 576 3x3/2 @14", 576, 3, 2, 14),
    ("v2 960 3x3/1 @7", 960, 3, 1, 7),
]


def copy_bandwidth(dtype) -> float:
    """Bytes per ms (read + write) of the fastest of three device-to-device copies far larger than L2, the bandwidth
    the targets refer to. Their sizes are not powers of two: a copy of exactly 512 or 1024 MiB ran at 2.76 TB/s on
    H200 where 384 and 768 MiB ran at 4.25 (docs/benchmarks.md, 2026-11-26; why the power-of-two sizes are slow was
    not examined). This function's 512 MiB copy was the reference before 2026-11-26."""
    best = 0.0
    for mib in (320, 384, 448):
        src = torch.empty(mib * 1024 * 1024 // dtype.itemsize, device="cuda", dtype=dtype)
        dst = torch.empty_like(src)
        ms = graph_replay_ms(lambda: dst.copy_(src), calls=5, replays=11)
        best = max(best, 2 * src.numel() * src.element_size() / ms)
    return best


C10_NAMES = {torch.bfloat16: "BFloat16", torch.float16: "Half", torch.float32: "Float"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="torch.backends.cudnn.benchmark on for every variant (default: off)")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    dtype = getattr(torch, args.dtype)
    ops = torch.ops.cudnn_fusion
    import torch_cudnn_fusion as tcf

    if not tcf.is_available():
        raise SystemExit(f"the extension is unavailable: {tcf.unavailable_reason()}")
    bandwidth = copy_bandwidth(dtype)
    rows = []
    for name, channels, kernel, stride, size in LAYERS:
        pad = kernel // 2
        x = torch.randn(args.batch, channels, size, size, device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last)
        w = torch.randn(channels, 1, kernel, kernel, device="cuda", dtype=dtype)
        out = (size + 2 * pad - kernel) // stride + 1
        dy = torch.randn(args.batch, channels, out, out, device="cuda", dtype=dtype).contiguous(
            memory_format=torch.channels_last)
        bias = torch.randn(channels, device="cuda", dtype=dtype)
        conv_args = ([stride, stride], [pad, pad], [1, 1], False, [0, 0], channels)
        steps = {
            "forward": (lambda: ops.conv_bias_act(x, w, bias, None, [stride] * 2, [pad] * 2, [pad] * 2, [1, 1],
                                                  channels, 1),
                        lambda: torch.relu(torch.convolution(x, w, bias, *conv_args))),
            "dgrad": (lambda: ops.conv_dgrad(dy, w, list(x.shape), [stride] * 2, [pad] * 2, [pad] * 2, [1, 1],
                                             channels),
                      lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *conv_args, [True, False, False])),
            "wgrad": (lambda: ops.conv_wgrad(dy, x, list(w.shape), [stride] * 2, [pad] * 2, [pad] * 2, [1, 1],
                                             channels),
                      lambda: torch.ops.aten.convolution_backward(dy, x, w, None, *conv_args, [False, True, False])),
        }
        moved = (x.numel() + dy.numel()) * x.element_size()  # each step reads or writes x (dx) and y (dy) once
        row = {"layer": name, "conv_alone_ms": graph_replay_ms(lambda: torch.convolution(x, w, None, *conv_args))}
        # the plain forward as the op runs it (ours or PyTorch's, depthwise_kernel_steps without an epilogue): the
        # training conv + BatchNorm op's conv
        row["plain_op_ms"] = graph_replay_ms(
            lambda: ops.conv_bias_act(x, w, None, None, [stride] * 2, [pad] * 2, [pad] * 2, [1, 1], channels, 0))
        source = torch.empty(moved // 2 // x.element_size(), device="cuda", dtype=dtype)  # read + write: `moved`
        target = torch.empty_like(source)
        row["copy_ms"] = graph_replay_ms(lambda: target.copy_(source))
        row["copy_vs_bandwidth"] = row["copy_ms"] / (moved / bandwidth)
        row["plain_op_vs_bandwidth"] = row["plain_op_ms"] / (moved / bandwidth)
        for step, (ours, theirs) in steps.items():
            ours_ms, theirs_ms = graph_replay_ms(ours), graph_replay_ms(theirs)
            floor = moved / bandwidth
            row[step] = {"ours_ms": ours_ms, "pytorch_ms": theirs_ms, "bandwidth_ms": floor,
                         "ours_vs_bandwidth": ours_ms / floor}
        if stride == 1:
            # dgrad at stride 1 is the forward of dy with the filter turned 180 degrees and padding 2 - pad: our
            # forward kernel (a zero bias makes it the op's step), and PyTorch's forward with the turn in the timing,
            # as candidates for that dgrad
            flipped, zero = w.flip(2, 3).contiguous(), torch.zeros_like(bias)
            row["dgrad_as_forward_ms"] = graph_replay_ms(
                lambda: ops.conv_bias_act(dy, flipped, zero, None, [1, 1], [2 - pad] * 2, [2 - pad] * 2, [1, 1],
                                          channels, 0))
            row["dgrad_as_pytorch_forward_ms"] = graph_replay_ms(
                lambda: torch.convolution(dy, w.flip(2, 3), None, [1, 1], [2 - pad] * 2, *conv_args[2:]))
        row["wgrad"]["runs"] = "plan 0"  # without benchmark (or under deterministic algorithms) nothing is timed
        for made in tcf.depthwise_wgrad_choices():
            if made["x_size"] == list(x.shape) and made["stride"] == stride and made["dtype"] == C10_NAMES[dtype]:
                row["wgrad"]["runs"] = made["choice"]
        rows.append(row)


    gpu = torch.cuda.get_device_name()
    header = (f"depthwise kernels, batch {args.batch}, {args.dtype}, channels_last, cudnn.benchmark="
              f"{args.cudnn_benchmark} ({gpu}, torch {torch.__version__}, "
              f"cuDNN {torch.backends.cudnn.version()}); copy bandwidth {bandwidth / 1e9:.2f} TB/s; GPU ms per call "
              "(CUDA-graph replay), ours / PyTorch's (cuDNN), and ours as a multiple of its bytes' time at that "
              "bandwidth")
    print(header)
    print(f"{'layer':<20}{'copy x bw':>10}{'fwd+bias+relu ours':>19}{'PyTorch':>9}{'x bw':>6}{'plain op':>9}"
          f"{'conv alone':>11}{'x bw':>6}"
          f"{'dgrad op':>10}{'PyTorch':>9}{'x bw':>6}{'wgrad op':>10}{'PyTorch':>9}{'x bw':>6}"
          f"{'wgrad runs':>11}{'dgrad as our fwd':>17}{'as PyTorch fwd':>15}")
    totals = {"forward": [0.0, 0.0], "dgrad": [0.0, 0.0], "wgrad": [0.0, 0.0]}
    for row in rows:
        f, d, g = row["forward"], row["dgrad"], row["wgrad"]
        print(f"{row['layer']:<20}{row['copy_vs_bandwidth']:>10.2f}{f['ours_ms']:>19.4f}{f['pytorch_ms']:>9.4f}"
              f"{f['ours_vs_bandwidth']:>6.2f}{row['plain_op_ms']:>9.4f}{row['conv_alone_ms']:>11.4f}"
              f"{row['plain_op_vs_bandwidth']:>6.2f}{d['ours_ms']:>10.4f}{d['pytorch_ms']:>9.4f}{d['ours_vs_bandwidth']:>6.2f}"
              f"{g['ours_ms']:>10.4f}{g['pytorch_ms']:>9.4f}{g['ours_vs_bandwidth']:>6.2f}{g['runs']:>11}"
              + (f"{row['dgrad_as_forward_ms']:>17.4f}{row['dgrad_as_pytorch_forward_ms']:>15.4f}"
                 if "dgrad_as_forward_ms" in row else ""))
        for step in totals:
            totals[step][0] += row[step]["ours_ms"]
            totals[step][1] += row[step]["pytorch_ms"]
    print("sums (ms): " + ", ".join(f"{s} ours {t[0]:.3f} vs PyTorch {t[1]:.3f}" for s, t in totals.items())
          + f", plain forward op {sum(r['plain_op_ms'] for r in rows):.3f} vs PyTorch's conv alone "
          f"{sum(r['conv_alone_ms'] for r in rows):.3f}")
    print("a copy of each layer's bytes, as a multiple of their time at the large copy's bandwidth: "
          f"{min(r['copy_vs_bandwidth'] for r in rows):.2f} to {max(r['copy_vs_bandwidth'] for r in rows):.2f}")
    slower = [f"{r['layer']} {s}" for r in rows for s in totals if r[s]["ours_ms"] > r[s]["pytorch_ms"] * 1.02]
    print("steps where ours is more than 2% slower than PyTorch's: " + (", ".join(slower) or "none"))
    if args.json:
        args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "gpu": gpu,
                                         "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                                         "batch": args.batch, "dtype": args.dtype,
                                         "cudnn_benchmark": args.cudnn_benchmark,
                                         "copy_bandwidth_bytes_per_ms": bandwidth, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
