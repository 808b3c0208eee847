"""Where a model's GPU time goes, by kind of kernel, for eager, torch.compile and fused (tcf.fuse) in one run: a
training step (forward, backward, SGD) and an inference batch, bf16 autocast (or --dtype float16), channels_last.
torch.profiler's CUDA kernel times over a few steps after warm-up, per step, grouped as dense conv, depthwise conv,
BatchNorm, ReLU/elementwise and other; the step's CUDA-event median beside them. Each kind lists its heaviest
kernels, so a kernel put in the wrong kind shows in the output.

Two more times tell the host's share: "loop ms", a step's median among back-to-back steps (the host runs ahead, as
in a training loop), and "host ms", the host's time to issue one step from an idle GPU. "step ms" times one step
from an idle GPU: where the host issues kernels slower than they run, it waits on the host. Every variant is timed
before any is profiled, each time built afresh: a process that has run torch.profiler may launch kernels slower after
it.

--batch-norm-ab adds the training step of "fused, cuDNN BN": the fused model whose layers decided while our
BatchNorm forward kernel was reported refused, so that they run the cuDNN batchnorm graph as before it (an A/B of
the two in one run; inference folds BatchNorm either way).

    python benchmarks/profile_by_kind.py [--model mobilenet_v1|mobilenet_v2|resnet50|timm:cspdarknet53] [--batch 256]
                                         [--no-compile] [--fused-compile] [--batch-norm-ab] [--dtype bfloat16|float16]
                                         [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cudnn_fusion as tcf  # noqa: E402
from bench_mobilenet import inference_fn, train_step_fn  # noqa: E402
from timing import SLEEP_CYCLES, interleaved_median_ms, median_ms  # noqa: E402

# Patterns in the order a kernel's name is tested against them (the first that matches gives its kind): a
# BatchNorm kernel that also applies ReLU (Triton's fused ones, cuDNN's) counts as BatchNorm; cuDNN names its kernels
# with one channel per group "c1_k1"; cuBLAS's GEMMs (the classifier) share "xmma" and "sm90_" with cuDNN's
# convolutions, so convolutions are named first by what they do, then GEMMs and the rest, then the generic names.
PATTERNS = (
    ("BatchNorm", re.compile(r"batch_?norm|bn_(fw|bw|fwd|bwd)|nhwc_batch|welford|bn_finalize|genstats", re.I)),
    ("depthwise conv", re.compile(r"depthwise|dwconv|c1_k1|grouped", re.I)),
    ("dense conv", re.compile(r"conv|fprop|dgrad|wgrad|implicit_gemm|cudnn", re.I)),
    ("other", re.compile(r"gemm|gemv|nvjet|softmax|nll_loss|cross_entropy|multi_tensor|sgd|memcpy|memset|copy|reduce",
                         re.I)),
    ("dense conv", re.compile(r"xmma|cutlass|sm\d\d_", re.I)),
    ("ReLU / elementwise", re.compile(r"relu|threshold|hardtanh|clamp|elementwise|vectorized|triton_poi|add|mul",
                                      re.I)),
)
KIND_NAMES = ["dense conv", "depthwise conv", "BatchNorm", "ReLU / elementwise", "other"]


def kind_of(kernel: str) -> str:
    for name, pattern in PATTERNS:
        if pattern.search(kernel):
            return name
    return "other"


def load_model(name: str) -> torch.nn.Module:
    """mobilenet_v1 (ours), a torchvision.models name, or library:name as zoo_speed.py takes it (timm:cspdarknet53)."""
    if name == "mobilenet_v1":
        from torch_cudnn_fusion.models import mobilenet_v1

        return mobilenet_v1()
    if ":" in name:
        from zoo_speed import build

        return build(name)
    import torchvision

    return getattr(torchvision.models, name)()


def kernel_ms_per_step(fn, steps: int) -> dict[str, float]:
    """Each CUDA kernel's total time per call of `fn`, by name (ms)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = getattr(event, "self_device_time_total", None)
        if us is None:
            us = event.self_cuda_time_total
        if us > 0:
            out[event.key] = out.get(event.key, 0.0) + us / 1000.0 / steps
    return out


def host_ms(fn, repeats: int, asleep: bool = False) -> float:
    """The host's median time to issue one call of `fn`: its wall time from an idle GPU, not waiting for it at the end.
    A call can still wait inside, on the GPU (a full launch queue, a synchronizing call); asleep: each call is issued
    behind a sleep kernel (timing.SLEEP_CYCLES), so that nothing in it waits on the GPU's work unless it issues more
    than the launch queue holds: the issue time alone (host_issue.py's "asleep" condition)."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        if asleep:
            torch.cuda._sleep(SLEEP_CYCLES)
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000.0)
    torch.cuda.synchronize()
    return statistics.median(samples)


def by_kind(kernels: dict[str, float]) -> dict[str, dict]:
    kinds = {name: {"ms": 0.0, "kernels": []} for name in KIND_NAMES}
    for kernel, ms in sorted(kernels.items(), key=lambda item: -item[1]):
        entry = kinds[kind_of(kernel)]
        entry["ms"] += ms
        entry["kernels"].append((kernel, ms))
    return kinds


def model_arguments(p: argparse.ArgumentParser, default_model: str, compile_option: bool = True) -> None:
    """The arguments of every whole-model benchmark here: --model, --batch, --json and (compile_option) --no-compile."""
    p.add_argument("--model", default=default_model,
                   help="mobilenet_v1 (torch_cudnn_fusion.models), a torchvision.models name or library:name "
                   "(timm:cspdarknet53)")
    p.add_argument("--batch", type=int, default=256)
    if compile_option:
        p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", default=None)


class _KernelRefused:
    """The compiled module, except that check_batch_norm_layer reports our BatchNorm forward kernel as refused: a
    layer deciding meanwhile takes the cuDNN graph (tests/test_bn_gpu.py refuses the graph the same way)."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)

    def check_batch_norm_layer(self, *args, kernel_first=False):
        refusals = dict(self._module.check_batch_norm_layer(*args))  # every implementation's verdict
        refusals["kernel"] = "refused by profile_by_kind.py --batch-norm-ab"
        return refusals


def fused_with_cudnn_batch_norm(plain, x, target, dtype) -> torch.nn.Module:
    """tcf.fuse of a copy of `plain`, each layer's training decision made (one step's forward and backward on x)
    while our BatchNorm kernel is reported refused: its BatchNorm layers keep the cuDNN graph."""
    from torch_cudnn_fusion import _extension

    model = tcf.fuse(copy.deepcopy(plain))[0]
    model.train()
    load = _extension.load
    module = load()
    _extension.load = lambda: _KernelRefused(module)
    try:
        with torch.autocast("cuda", dtype):
            F.cross_entropy(model(x), target).backward()
    finally:
        _extension.load = load
    model.zero_grad(set_to_none=True)
    return model


def setup(model: str, batch: int, with_compile: bool = False, fused_compile: bool = False,
          batch_norm_ab: bool = False, dtype: torch.dtype = torch.bfloat16):
    """(plain model, input batch, targets, {"eager": ..., "fused": ..., with_compile "torch.compile": ..., and
    fused_compile "fused + compile": torch.compile of the fused model, batch_norm_ab "fused, cuDNN BN":
    fused_with_cudnn_batch_norm under autocast to `dtype`} makers of fresh variants), as every profile here takes
    them: cudnn.benchmark on, seed 0, channels_last, a 224x224 batch on the GPU."""
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    x = torch.randn(batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (batch,), device="cuda")
    plain = load_model(model).cuda().to(memory_format=torch.channels_last)
    variants = {"eager": lambda: copy.deepcopy(plain), "fused": lambda: tcf.fuse(copy.deepcopy(plain))[0]}
    if with_compile:
        variants["torch.compile"] = lambda: torch.compile(copy.deepcopy(plain))
    if fused_compile:
        variants["fused + compile"] = lambda: torch.compile(tcf.fuse(copy.deepcopy(plain))[0])
    if batch_norm_ab:
        variants["fused, cuDNN BN"] = lambda: fused_with_cudnn_batch_norm(plain, x, target, dtype)
    return plain, x, target, variants


def run_header(args) -> dict:
    """The GPU, versions, model and batch a result file starts with."""
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "model": args.model, "batch": args.batch}


def measure_variant(row: dict, phase: str, make, mode: str, x, target, args) -> None:
    """Fills `row` for a fresh variant from `make`: its step, loop and host times and peak memory (phase "time"), or
    its kernels by kind (phase "profile"). A variant that fails is reported in the row, not fatal."""
    model = None
    torch.cuda.reset_peak_memory_stats()  # the peak over building the variant, its warm-up and its steps
    try:
        model = make()
        model.train(mode == "train")
        dtype = getattr(torch, args.dtype)
        fn = train_step_fn(model, x, target, dtype=dtype) if mode == "train" else inference_fn(model, x, dtype)
        if phase == "time":
            row["step_ms"] = median_ms(fn, warmup=args.warmup, repeats=args.repeats)
            row["loop_ms"] = interleaved_median_ms({"fn": fn}, warmup=1, repeats=args.repeats, calls=5)["fn"]
            row["host_ms"] = host_ms(fn, args.repeats)
            row["peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
            # the bytes the tensors asked for, before the allocator rounds each to its block size
            row["peak_requested_mib"] = torch.cuda.memory_stats()["requested_bytes.all.peak"] / 2**20
        else:
            for _ in range(args.warmup):
                fn()
            row["kinds"] = by_kind(kernel_ms_per_step(fn, args.steps))
            row["kernel_ms"] = sum(kind["ms"] for kind in row["kinds"].values())
    except Exception as error:  # noqa: BLE001 — a variant that fails is reported, not fatal
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    # as each row finishes, so that a run cut short still shows the rows it measured
    if "error" in row:
        print(f"{mode} / {row['variant']} ({phase}): {row['error']}", flush=True)
    elif phase == "time":
        print(f"{mode} / {row['variant']}: step {row['step_ms']:.2f} ms, loop {row['loop_ms']:.2f} ms, host "
              f"{row['host_ms']:.2f} ms, peak {row['peak_mib']:.0f} MiB", flush=True)
    else:
        print(f"{mode} / {row['variant']}: kernels {row['kernel_ms']:.2f} ms", flush=True)
    del model
    torch.cuda.empty_cache()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    model_arguments(p, "mobilenet_v1")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="profiled steps per variant and mode")
    p.add_argument("--repeats", type=int, default=20, help="timed steps per variant and mode (CUDA-event median)")
    p.add_argument("--top", type=int, default=3, help="kernels listed per kind")
    p.add_argument("--fused-compile", action="store_true", help="also torch.compile of the fused model")
    p.add_argument("--batch-norm-ab", action="store_true",
                   help="also the fused training step with the cuDNN BatchNorm graph in place of our kernel")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                   help="the autocast dtype (float16 runs without loss scaling: GradScaler's small kernels left out)")
    args = p.parse_args()
    _, x, target, variants = setup(args.model, args.batch, with_compile=not args.no_compile,
                                   fused_compile=args.fused_compile, batch_norm_ab=args.batch_norm_ab,
                                   dtype=getattr(torch, args.dtype))
    out = {**run_header(args), "dtype": args.dtype, "rows": []}
    # Every variant is timed before any is profiled: torch.profiler can leave the process slower to launch kernels
    # after it stops (pytorch/pytorch#144455), which would charge a variant timed after another's profile.
    for phase in ("time", "profile"):
        for mode in ("train", "inference"):
            for variant, make in variants.items():
                if mode == "inference" and variant == "fused, cuDNN BN":
                    continue  # eval folds BatchNorm into the conv: the same as "fused"
                if phase == "time":
                    row = {"variant": variant, "mode": mode}
                    out["rows"].append(row)
                else:
                    row = next(r for r in out["rows"] if r["variant"] == variant and r["mode"] == mode)
                    if "error" in row:
                        continue
                measure_variant(row, phase, make, mode, x, target, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    print(f"\n{args.model}, batch {args.batch}, 224x224, {args.dtype} autocast, channels_last ({out['gpu']}, torch "
          f"{out['torch']}, cuDNN {out['cudnn']}); GPU kernel ms per step by kind, the step's median, and the peak of "
          "torch.cuda.max_memory_allocated over the variant (the input batch and the plain model included) and of the "
          "bytes its tensors requested (req MiB: before the allocator's rounding to blocks); loop ms: a step among 5 "
          "back-to-back, host ms: the host's time to issue a step")
    header = (f"{'mode':<10}{'variant':<15}{'step ms':>9}{'loop ms':>9}{'host ms':>9}{'kernels':>9}"
              + "".join(f"{k:>20}" for k in KIND_NAMES) + f"{'peak MiB':>10}{'req MiB':>10}")
    print(header)
    for row in out["rows"]:
        if "error" in row:
            print(f"{row['mode']:<10}{row['variant']:<15} failed: {row['error']}")
            continue
        print(f"{row['mode']:<10}{row['variant']:<15}{row['step_ms']:>9.2f}{row['loop_ms']:>9.2f}{row['host_ms']:>9.2f}"
              f"{row['kernel_ms']:>9.2f}"
              + "".join(f"{row['kinds'][k]['ms']:>20.2f}" for k in KIND_NAMES) + f"{row['peak_mib']:>10.0f}"
              + f"{row['peak_requested_mib']:>10.0f}")
    print("\nheaviest kernels of each kind (ms per step):")
    for row in out["rows"]:
        if "error" in row:
            continue
        print(f"{row['mode']} / {row['variant']}:")
        for kind in KIND_NAMES:
            for kernel, ms in row["kinds"][kind]["kernels"][: args.top]:
                print(f"    {kind:<20}{ms:>8.3f}  {kernel[:140]}")


if __name__ == "__main__":
    main()
