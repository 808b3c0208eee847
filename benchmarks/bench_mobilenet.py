"""MobileNet v1 (batch 256, 224x224, bf16 autocast, channels_last): a training step (forward, backward, SGD step)
and an inference batch, for eager, torch.compile, fused (tcf.fuse) and fused under torch.compile, in one run; plus
every distinct Conv+BN+ReLU layer of the model, fused vs eager, forward+backward. Medians of CUDA-event timings.
Per layer, the one-call and ten-call columns include the host's time (small layers are bound by it); the GPU column
replays ten forward+backward calls captured in a CUDA graph: the kernels' time alone. The JSON also holds each
host-inclusive timing's quartiles, and the summary prints them for any layer that came out slower fused.

    python benchmarks/bench_mobilenet.py [--json out.json] [--no-compile] [--layers-only | --no-layers]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cudnn_fusion as tcf  # noqa: E402
from timing import graph_replay_ms, interleaved_samples_ms, median_ms, quartiles  # noqa: E402
from torch_cudnn_fusion.models import mobilenet_v1  # noqa: E402


def train_step_fn(model, x, target, between=None, dtype=torch.bfloat16):
    """A training step of `model` (SGD with momentum, autocast to `dtype`, no loss scaling); `between(phase)`, when
    given, is called with "start" (after zero_grad), "forward" (after the loss) and "backward" (after backward, before
    the SGD step)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mark = between or (lambda phase: None)

    def step():
        opt.zero_grad(set_to_none=True)
        mark("start")
        with torch.autocast("cuda", dtype):
            loss = F.cross_entropy(model(x), target)
        mark("forward")
        loss.backward()
        mark("backward")
        opt.step()

    return step


def inference_fn(model, x, dtype=torch.bfloat16):
    def run():
        with torch.no_grad(), torch.autocast("cuda", dtype):
            model(x)

    return run


def bench_model(args):
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (args.batch,), device="cuda")
    plain = mobilenet_v1().cuda().to(memory_format=torch.channels_last)
    variants = {"eager": lambda: copy.deepcopy(plain), "fused": lambda: tcf.fuse(copy.deepcopy(plain))[0]}
    if not args.no_compile:
        variants["torch.compile"] = lambda: torch.compile(copy.deepcopy(plain))
        variants["fused + torch.compile"] = lambda: torch.compile(tcf.fuse(copy.deepcopy(plain))[0])
    rows = []
    for name, make in variants.items():
        row = {"variant": name}
        for mode in ("train", "inference"):
            try:
                model = make()
                model.train(mode == "train")
                fn = train_step_fn(model, x, target) if mode == "train" else inference_fn(model, x)
                row[f"{mode}_ms"] = median_ms(fn, warmup=args.warmup, repeats=args.repeats)
            except Exception as error:  # noqa: BLE001 — a variant that fails is reported, not fatal
                row[f"{mode}_ms"] = None
                row[f"{mode}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        rows.append(row)
        print(row, flush=True)
    return rows


def bench_layers(args):
    """Each distinct Conv+BN+ReLU layer of MobileNet v1 at batch 256: eager vs fused, forward+backward, training."""
    plain = mobilenet_v1().cuda().to(memory_format=torch.channels_last)
    seen, rows = set(), []
    size = 112
    shapes = []
    for block in plain.features:
        convs = [m for m in block if isinstance(m, torch.nn.Conv2d)]
        for conv in convs:
            key = (conv.in_channels, conv.out_channels, conv.kernel_size[0], conv.stride[0], conv.groups, size * 2
                   if conv is plain.features[0][0] else size)
            in_size = 224 if conv is plain.features[0][0] else size
            if conv.stride[0] == 2 and conv is not plain.features[0][0]:
                size //= 2
            elif conv is plain.features[0][0]:
                size = 112
            if key not in seen:
                seen.add(key)
                shapes.append((conv, in_size))
    for conv, in_size in shapes:
        seq = torch.nn.Sequential(copy.deepcopy(conv), torch.nn.BatchNorm2d(conv.out_channels), torch.nn.ReLU()).cuda()
        seq = seq.to(memory_format=torch.channels_last)
        fused = tcf.Conv2dBNReLU.from_modules(copy.deepcopy(seq[0]), copy.deepcopy(seq[1]))
        x = torch.randn(args.batch, conv.in_channels, in_size, in_size, device="cuda", dtype=torch.bfloat16)
        x = x.to(memory_format=torch.channels_last).requires_grad_()
        result = {"layer": f"{conv.kernel_size[0]}x{conv.kernel_size[0]} {conv.in_channels}->{conv.out_channels} "
                           f"s{conv.stride[0]} g{conv.groups} @{in_size}"}
        steps, forwards = {}, {}
        for name, module in (("eager", seq), ("fused", fused)):
            def step(module=module):
                with torch.autocast("cuda", torch.bfloat16):
                    y = module(x)
                y.backward(torch.ones_like(y))

            def forward(module=module):
                with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                    module(x)

            steps[name], forwards[name] = step, forward
        # eager and fused samples taken in turn: the host's speed drifts between runs and within one. The quartiles
        # show how far apart the samples of one timing lie: one synchronized call of a small layer is host-bound
        # and its samples spread widely
        for label, fns, calls in (("fwd", forwards, 1), ("fwd_bwd", steps, 1), ("fwd_bwd_x10", steps, 10)):
            for name, samples in interleaved_samples_ms(fns, warmup=3, repeats=args.layer_repeats,
                                                        calls=calls).items():
                q1, result[f"{name}_{label}_ms"], q3 = quartiles(samples)
                result[f"{name}_{label}_quartiles_ms"] = (q1, q3)
        for name, step in steps.items():
            result[f"{name}_gpu_fwd_bwd_ms"] = graph_replay_ms(step)
        result["implementation"] = str(fused.fusion_status)
        rows.append(result)
        print(result, flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=20, help="timed training steps / inference batches per variant")
    p.add_argument("--layer-repeats", type=int, default=60, help="timed samples per layer, timing and variant")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--layers-only", action="store_true")
    p.add_argument("--no-layers", action="store_true", help="the whole model only")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.backends.cudnn.benchmark = True
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "batch": args.batch}
    out["layers"] = [] if args.no_layers else bench_layers(args)
    if not args.layers_only:
        out["model"] = bench_model(args)
    print("\nlayer (training: conv, BN, ReLU; bf16)    eager fwd  fused fwd  eager f+b  fused f+b  speedup   "
          "x10: eager f+b fused f+b speedup   GPU: eager f+b fused f+b speedup")
    for r in out["layers"]:
        print(f"{r['layer']:<38} {r['eager_fwd_ms']:>10.3f} {r['fused_fwd_ms']:>10.3f} {r['eager_fwd_bwd_ms']:>10.3f} "
              f"{r['fused_fwd_bwd_ms']:>10.3f} {r['eager_fwd_bwd_ms'] / r['fused_fwd_bwd_ms']:>7.2f}x "
              f"{r['eager_fwd_bwd_x10_ms']:>15.3f} {r['fused_fwd_bwd_x10_ms']:>9.3f} "
              f"{r['eager_fwd_bwd_x10_ms'] / r['fused_fwd_bwd_x10_ms']:>6.2f}x "
              f"{r['eager_gpu_fwd_bwd_ms']:>15.3f} {r['fused_gpu_fwd_bwd_ms']:>9.3f} "
              f"{r['eager_gpu_fwd_bwd_ms'] / r['fused_gpu_fwd_bwd_ms']:>6.2f}x")
    for label, key in () if args.no_layers else (("one call at a time", "fwd_bwd"), ("ten calls back to back", "fwd_bwd_x10"),
                       ("GPU time, CUDA-graph replay", "gpu_fwd_bwd")):
        slower = [r for r in out["layers"] if r[f"fused_{key}_ms"] > r[f"eager_{key}_ms"]]
        print(f"fused layers slower than eager (f+b, {label}): {len(slower)} of {len(out['layers'])}")
        for r in slower:
            line = f"    {r['layer']}: {r[f'eager_{key}_ms'] / r[f'fused_{key}_ms']:.2f}x"
            if f"eager_{key}_quartiles_ms" in r:
                (e1, e3), (f1, f3) = r[f"eager_{key}_quartiles_ms"], r[f"fused_{key}_quartiles_ms"]
                line += f" (quartiles eager {e1:.3f}-{e3:.3f} ms, fused {f1:.3f}-{f3:.3f} ms)"
            print(line)
    if "model" in out:
        eager = next(r for r in out["model"] if r["variant"] == "eager")
        print(f"\nMobileNet v1, batch {args.batch}, 224x224, bf16, channels_last ({out['gpu']}, torch {out['torch']}, "
              f"cuDNN {out['cudnn']})")
        print(f"{'variant':<24}{'train step ms':>14}{'vs eager':>10}{'inference ms':>14}{'vs eager':>10}")
        for r in out["model"]:
            cells = []
            for mode in ("train", "inference"):
                ms = r.get(f"{mode}_ms")
                cells += [f"{ms:>14.2f}", f"{ms / eager[f'{mode}_ms']:>9.2f}x"] if ms else [f"{'failed':>14}", " " * 10]
            print(f"{r['variant']:<24}{''.join(cells)}")
            for mode in ("train", "inference"):
                if r.get(f"{mode}_error"):
                    print(f"    {mode}: {r[f'{mode}_error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
