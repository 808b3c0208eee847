"""Times fused conv layers against eager PyTorch, torch.compile and the conv alone, on MobileNet v1 and ResNet-50
layer shapes (batch 128, bf16, channels_last): forward, and forward + backward.

    python benchmarks/bench_conv_layers.py [--batch 128] [--json benchmarks/results/conv_layers.json]

Each number is the median over repeats of the mean time per call of back-to-back calls between two CUDA events
(so the Python cost of issuing each call counts, as it does in a model), rotating over several input sets; the
GPU-only ratios replay the same calls from a CUDA graph, which removes the host cost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from timing import graph_replay_ms

# name, in_channels, out_channels, kernel, stride, input size, residual add
SHAPES = [
    ("mbv1 stem 3x3/2 3->32 @224", 3, 32, 3, 2, 224, False),
    ("rn50 stem 7x7/2 3->64 @224", 3, 64, 7, 2, 224, False),
    ("mbv1 1x1 32->64 @112", 32, 64, 1, 1, 112, False),
    ("mbv1 1x1 64->128 @56", 64, 128, 1, 1, 56, False),
    ("mbv1 1x1 128->128 @56", 128, 128, 1, 1, 56, False),
    ("mbv1 1x1 256->256 @28", 256, 256, 1, 1, 28, False),
    ("mbv1 1x1 512->512 @14", 512, 512, 1, 1, 14, False),
    ("mbv1 1x1 1024->1024 @7", 1024, 1024, 1, 1, 7, False),
    ("rn50 1x1 256->64 @56", 256, 64, 1, 1, 56, False),
    ("rn50 3x3 64->64 @56", 64, 64, 3, 1, 56, False),
    ("rn50 1x1 64->256 @56 +add", 64, 256, 1, 1, 56, True),
    ("rn50 3x3/2 128->128 @56", 128, 128, 3, 2, 56, False),
    ("rn50 3x3 128->128 @28", 128, 128, 3, 1, 28, False),
    ("rn50 3x3 256->256 @14", 256, 256, 3, 1, 14, False),
    ("rn50 1x1 256->1024 @14 +add", 256, 1024, 1, 1, 14, True),
    ("rn50 3x3 512->512 @7", 512, 512, 3, 1, 7, False),
    ("rn50 1x1 512->2048 @7 +add", 512, 2048, 1, 1, 7, True),
    ("basic 3x3 64->64 @56 +add", 64, 64, 3, 1, 56, True),
]


def time_ms(fn, input_sets, calls=10, repeats=11, warmup=5) -> float:
    for i in range(warmup):
        fn(*input_sets[i % len(input_sets)])
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(calls):
            fn(*input_sets[i % len(input_sets)])
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / calls)
    return statistics.median(samples)


def graph_time_ms(fn, input_sets) -> float:
    """GPU time per call with no host cost (CUDA graph replay), rotating over the input sets."""
    calls = iter(range(10**9))
    return graph_replay_ms(lambda: fn(*input_sets[next(calls) % len(input_sets)]))


def bench_shape(name, cin, cout, kernel, stride, size, residual, batch, dtype):
    cl = torch.channels_last
    torch.manual_seed(0)
    layer_cls = tcf.Conv2dAddReLU if residual else tcf.Conv2dReLU
    layer = layer_cls(cin, cout, kernel, stride=stride, padding=kernel // 2).cuda().to(dtype=dtype, memory_format=cl)
    w, b = layer.weight, layer.bias
    out_size = (size + 2 * (kernel // 2) - kernel) // stride + 1
    needs_input_grad = cin != 3  # the stem's input is the image

    def make_inputs():
        x = torch.randn(batch, cin, size, size, device="cuda", dtype=dtype).contiguous(memory_format=cl)
        r = torch.randn(batch, cout, out_size, out_size, device="cuda", dtype=dtype).contiguous(memory_format=cl)
        g = torch.randn(batch, cout, out_size, out_size, device="cuda", dtype=dtype).contiguous(memory_format=cl)
        return x.requires_grad_(needs_input_grad), r.requires_grad_(), g

    input_sets = [make_inputs() for _ in range(3)]

    def eager(x, r):
        y = F.conv2d(x, w, b, stride, kernel // 2)
        return F.relu(y + r) if residual else F.relu(y)

    def fused(x, r):
        return layer(x, r) if residual else layer(x)

    compiled = torch.compile(eager, dynamic=False)

    def conv_only(x, r, g):
        with torch.no_grad():
            return F.conv2d(x, w, None, stride, kernel // 2)

    def forward(fn):
        def run(x, r, g):
            with torch.no_grad():
                return fn(x, r)
        return run

    def train_step(fn):
        def run(x, r, g):
            fn(x, r).backward(g)
        return run

    row = {"shape": name, "in_channels": cin, "out_channels": cout, "kernel": kernel, "stride": stride,
           "size": size, "residual": residual}
    row["conv_only_fwd_ms"] = time_ms(conv_only, input_sets)
    for label, fn in (("fused", fused), ("eager", eager), ("compile", compiled)):
        row[f"{label}_fwd_ms"] = time_ms(forward(fn), input_sets)
        row[f"{label}_fwd_bwd_ms"] = time_ms(train_step(fn), input_sets)
        for p in layer.parameters():
            p.grad = None
        for x, r, _ in input_sets:
            x.grad = None
            r.grad = None
    for label, fn in (("fused", fused), ("eager", eager)):  # GPU time alone (CUDA graph replay)
        row[f"{label}_fwd_gpu_ms"] = graph_time_ms(forward(fn), input_sets)
        row[f"{label}_fwd_bwd_gpu_ms"] = graph_time_ms(train_step(fn), input_sets)
    with torch.no_grad():
        fused(*input_sets[0][:2])
    row["fused_status"] = str(layer.fusion_status)
    row["fused"] = layer.fusion_status.fused
    return row


def environment() -> dict:
    from torch_cudnn_fusion import _extension

    module = _extension.require()
    return {
        "date": datetime.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": module.cudnn_version(),
        "cudnn_frontend": module.frontend_version(),
    }


def print_table(rows, env):
    print(f"\n{env['gpu']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
          f"cudnn-frontend {env['cudnn_frontend']}, {env['date']}; batch {env['batch']}, bf16, channels_last, "
          f"cudnn.benchmark={env['cudnn_benchmark']}; ms")
    header = (f"{'layer':<30} {'conv':>6} {'fused':>6} {'eager':>6} {'comp':>6} | {'fused':>6} {'eager':>6} "
              f"{'comp':>6} | {'f/conv':>6} {'e/f':>5} {'e/f bw':>6} {'c/f bw':>6} | {'e/f':>5} {'e/f bw':>6}  path")
    print(f"{'':<30} {'forward':^27} | {'forward + backward':^20} | {'ratios':^27} | {'GPU only':^12} |")
    print(header)
    for r in rows:
        print(f"{r['shape']:<30} {r['conv_only_fwd_ms']:6.3f} {r['fused_fwd_ms']:6.3f} {r['eager_fwd_ms']:6.3f} "
              f"{r['compile_fwd_ms']:6.3f} | {r['fused_fwd_bwd_ms']:6.3f} {r['eager_fwd_bwd_ms']:6.3f} "
              f"{r['compile_fwd_bwd_ms']:6.3f} | {r['fused_fwd_ms'] / r['conv_only_fwd_ms']:6.2f} "
              f"{r['eager_fwd_ms'] / r['fused_fwd_ms']:5.2f} {r['eager_fwd_bwd_ms'] / r['fused_fwd_bwd_ms']:6.2f} "
              f"{r['compile_fwd_bwd_ms'] / r['fused_fwd_bwd_ms']:6.2f} | "
              f"{r['eager_fwd_gpu_ms'] / r['fused_fwd_gpu_ms']:5.2f} {r['eager_fwd_bwd_gpu_ms'] / r['fused_fwd_bwd_gpu_ms']:6.2f}"
              f"  {'fused' if r['fused'] else 'eager'}")
    print("f/conv: fused forward over the conv alone; e/f: eager over fused (above 1: fused is faster); "
          "c/f: torch.compile over fused; bw: forward + backward. Times: back-to-back calls, host cost included. "
          "GPU only: the same calls replayed from a CUDA graph, no host cost")


def markdown_table(path: Path) -> str:
    """The README's table, from a results JSON this script wrote."""
    data = json.loads(path.read_text())
    env, rows = data["environment"], data["rows"]
    lines = [
        f"{env['gpu']}, torch {env['torch']}, cuDNN {env['cudnn']}, cudnn-frontend {env['cudnn_frontend']}, "
        f"{env['date']}; batch {env['batch']}, bf16, channels_last, cudnn.benchmark={env['cudnn_benchmark']}. "
        "Milliseconds per call, host cost included; speed-ups are eager / fused; GPU only = CUDA graph replay.",
        "",
        "| layer | conv alone | fused fwd | eager fwd | compile fwd | fused fwd+bwd | eager fwd+bwd | compile fwd+bwd "
        "| fused / conv | fwd speed-up | fwd+bwd speed-up | GPU-only fwd / fwd+bwd speed-up | path |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['conv_only_fwd_ms']:.3f} | {r['fused_fwd_ms']:.3f} | {r['eager_fwd_ms']:.3f} | "
            f"{r['compile_fwd_ms']:.3f} | {r['fused_fwd_bwd_ms']:.3f} | {r['eager_fwd_bwd_ms']:.3f} | "
            f"{r['compile_fwd_bwd_ms']:.3f} | {r['fused_fwd_ms'] / r['conv_only_fwd_ms']:.2f} | "
            f"{r['eager_fwd_ms'] / r['fused_fwd_ms']:.2f}x | {r['eager_fwd_bwd_ms'] / r['fused_fwd_bwd_ms']:.2f}x | "
            f"{r['eager_fwd_gpu_ms'] / r['fused_fwd_gpu_ms']:.2f}x / "
            f"{r['eager_fwd_bwd_gpu_ms'] / r['fused_fwd_bwd_gpu_ms']:.2f}x | {'fused' if r['fused'] else 'eager'} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/conv_layers.json"))
    parser.add_argument("--only", default="", help="run only shapes whose name contains this text")
    parser.add_argument("--heuristic", action="store_true",
                        help="torch.backends.cudnn.benchmark=False for every variant (default: True, so eager's convs "
                             "and the fused graphs are both autotuned)")
    parser.add_argument("--markdown", type=Path, help="print the README table of a results JSON and exit")
    args = parser.parse_args()
    if args.markdown:
        print(markdown_table(args.markdown))
        return
    torch.backends.cudnn.benchmark = not args.heuristic
    torch._dynamo.config.cache_size_limit = 256
    env = environment()
    env["batch"] = args.batch
    env["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    rows = []
    for shape in SHAPES:
        if args.only in shape[0]:
            rows.append(bench_shape(*shape, batch=args.batch, dtype=torch.bfloat16))
            print(f"done: {shape[0]}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    print_table(rows, env)


if __name__ == "__main__":
    main()
